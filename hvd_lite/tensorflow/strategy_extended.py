"""The extended part of hvd_lite's MultiWorkerMirroredStrategy (strategy.py): OneDeviceExtended
whose sizes, cross-replica reductions, gathers, variable creation and input go through hvd_lite
(strategy.py's opening comment says what each one does). Its own module so that the Keras hooks
(keras_fit.py) can tell an hvd_lite strategy (its `extended` is one of these) without importing
the strategy, which installs them."""

import itertools
from typing import Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.data.experimental.ops import distribute as data_distribute
from tensorflow.python.distribute import distribute_lib, input_ops, input_util, one_device_strategy

from .. import basics, collectives, ops
from .mpi_ops import _grouped_allreduce, allgather

_var_ids = itertools.count()


def _hvd_op(reduce_op):
    reduce_op = tf.distribute.ReduceOp(reduce_op.upper()) if isinstance(reduce_op, str) else reduce_op
    return ops.Average if reduce_op == tf.distribute.ReduceOp.MEAN else ops.Sum


class HvdExtended(one_device_strategy.OneDeviceExtended):
    """OneDeviceExtended whose cross-replica operations go through hvd_lite."""

    def __init__(self, container_strategy, device, timeout: Optional[float]):
        super().__init__(container_strategy, device)
        self._hvd_timeout = timeout

    # --- sizes and roles
    @property
    def _num_replicas_in_sync(self):
        return basics.size()

    @property
    def should_checkpoint(self):
        return basics.rank() == 0

    @property
    def should_save_summary(self):
        return basics.rank() == 0

    @property
    def experimental_should_init(self):
        return True

    # --- variables: rank 0's initial value everywhere
    def _create_variable(self, next_creator, **kwargs):
        # Only a variable created eagerly is broadcast: one created while a tf.function traces
        # (an optimizer's slots on its first apply) has no value yet; build the model eagerly
        # (keras.Input, or model.build) so that its random initial weights are created here.
        eager = tf.executing_eagerly()
        var = super()._create_variable(next_creator, **kwargs)
        if basics.size() > 1 and eager:
            value = np.ascontiguousarray(np.asarray(var.numpy()))
            out = collectives.broadcast(
                value.reshape(value.shape or (1,)), 0, f"tf.strategy.var.{next(_var_ids)}"
            )
            var.assign(np.reshape(out, var.shape))
        return var

    # --- reductions
    def _reduce_to(self, reduce_op, value, destinations, options):
        return self._batch_reduce_to(reduce_op, [(value, destinations)], options)[0]

    def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
        values = [v for v, _ in value_destination_pairs]
        timeout = self._timeout(options)
        return _grouped_allreduce(values, _hvd_op(reduce_op), timeout=timeout)

    def _replica_ctx_all_reduce(self, reduce_op, value, options=None):
        return _grouped_allreduce(list(value), _hvd_op(reduce_op), timeout=self._timeout(options))

    def _timeout(self, options):
        t = getattr(options, "timeout_seconds", None) if options is not None else None
        return t or self._hvd_timeout

    def _gather_to_implementation(self, value, destinations, axis, options):
        value = tf.convert_to_tensor(value)
        if axis == 0:
            return allgather(value)
        perm = [axis] + [i for i in range(value.shape.rank) if i != axis]
        inv = np.argsort(perm).tolist()
        return tf.transpose(allgather(tf.transpose(value, perm)), inv)

    # --- input
    # A replica on the host's CPU reads its batches through a plain tf.data iterator, not through
    # TF's MultiDeviceIterator (what tf.distribute uses for PER_WORKER input): destroying one of
    # those before its background thread has begun leaves that thread reading a freed iterator (a
    # segfault; Keras drops an iterator at once after peeking one batch, and under load 1 Keras
    # fit in 12 crashed that way at 3-4 ranks on 2 cores). With one replica per rank, PER_WORKER
    # and PER_REPLICA input are the same batches; experimental_per_replica_buffer_size stays the
    # prefetch depth. A replica on another device keeps TF's path (fetch to device).
    def _input_options(self, options):
        """(options to build the distributed dataset with, prefetch depth to add, or 0)."""
        o = options or distribute_lib.InputOptions()
        if o.experimental_place_dataset_on_device and (
            o.experimental_replication_mode != distribute_lib.InputReplicationMode.PER_REPLICA
            or o.experimental_fetch_to_device
        ):
            raise ValueError(
                "InputOptions(experimental_place_dataset_on_device=True) needs "
                "experimental_replication_mode=PER_REPLICA and "
                "experimental_fetch_to_device=False (as in TensorFlow); got "
                f"{o.experimental_replication_mode} and experimental_fetch_to_device="
                f"{o.experimental_fetch_to_device}"
            )
        if self._device != self._input_device:
            return options, 0
        plain = distribute_lib.InputOptions(
            experimental_fetch_to_device=False,
            experimental_replication_mode=distribute_lib.InputReplicationMode.PER_REPLICA,
            experimental_place_dataset_on_device=o.experimental_place_dataset_on_device,
            experimental_per_replica_buffer_size=o.experimental_per_replica_buffer_size,
        )
        return plain, o.experimental_per_replica_buffer_size

    def _experimental_distribute_dataset(self, dataset, options):
        n, r = basics.size(), basics.rank()
        if n > 1:
            batch = int(data_distribute.compute_batch_size(dataset))
            if batch == -1:  # batch size not static: split each batch in n, as TF's MWMS does
                dataset = data_distribute._LegacyRebatchDataset(dataset, n)
            else:
                dataset = dataset.rebatch(data_distribute.batch_sizes_for_worker(batch, n, 1, r))
            dataset = input_ops.auto_shard_dataset(dataset, n, r, n)
        options, depth = self._input_options(options)
        if depth:
            dataset = dataset.prefetch(depth)
        return input_util.get_distributed_dataset(
            dataset, self._input_workers_with_options(options), self._container_strategy(), options=options
        )

    def _distribute_datasets_from_function(self, dataset_fn, options):
        ctx = distribute_lib.InputContext(
            num_input_pipelines=basics.size(),
            input_pipeline_id=basics.rank(),
            num_replicas_in_sync=basics.size(),
        )
        options, depth = self._input_options(options)
        fn = (lambda c: dataset_fn(c).prefetch(depth)) if depth else dataset_fn
        return input_util.get_distributed_datasets_from_function(
            fn, self._input_workers_with_options(options), [ctx], self._container_strategy(), options=options
        )


def is_hvd_lite_strategy(strategy) -> bool:
    """True for an hvd_lite MultiWorkerMirroredStrategy (its extended is an HvdExtended)."""
    return isinstance(getattr(strategy, "extended", None), HvdExtended)
