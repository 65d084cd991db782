"""MultiWorkerMirroredStrategy: a tf.distribute.Strategy whose replicas are the hvd_lite ranks.

Each rank runs one replica on its own device, as OneDeviceStrategy does; what makes it
data-parallel is this strategy's extended (strategy_extended.HvdExtended):
  - num_replicas_in_sync is hvd_lite.size(), so Keras and tf.nn.compute_average_loss scale
    losses by the number of ranks;
  - cross-replica reductions (ReplicaContext.all_reduce, reduce_to, batch_reduce_to, which
    Keras's optimizer calls on the gradient list) are hvd_lite allreduces, a batch in one fused
    call; gather is an hvd_lite allgather;
  - a variable created in scope() takes rank 0's initial value;
  - experimental_distribute_dataset rebatches the global batch to each rank's share and shards
    it by rank, the way TF's MultiWorkerMirroredStrategy does (honouring AutoShardPolicy).
It is not a subclass of tf.distribute.MultiWorkerMirroredStrategy on purpose: Keras keys its
multi-worker metric path (broken on Keras 3, keras-team/keras#20585) on that class.
"""

import json
import os
import socket
from typing import Optional

import tensorflow as tf
from tensorflow.python.distribute import distribute_lib

from .. import basics
from ..exceptions import HvdLiteError
from ..state import allgather_object
from . import keras_fit
from .strategy_extended import HvdExtended


def _check_tf_config(rank: int, size: int, workers) -> None:
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return
    try:
        cfg = json.loads(raw)
    except ValueError as exc:
        raise HvdLiteError(f"TF_CONFIG is not valid JSON ({exc}); unset it or fix it") from None
    cluster = cfg.get("cluster", {})
    task = cfg.get("task", {})
    n_tf = sum(len(v) for k, v in cluster.items() if k in ("chief", "worker"))
    kinds = sorted(set(cluster) - {"chief", "worker"})
    problems = []
    if kinds:
        problems.append(f"TF_CONFIG has task types {kinds} (hvd_lite runs workers only)")
    if n_tf != size:
        problems.append(f"TF_CONFIG's cluster has {n_tf} workers but the MPI world has {size} ranks")
    index = task.get("index", 0) + (len(cluster.get("chief", [])) if task.get("type") == "worker" else 0)
    if task.get("type") not in ("chief", "worker") or index != rank:
        problems.append(
            f"TF_CONFIG's task is {task.get('type')!r} #{task.get('index')} (worker "
            f"{index}) but this process is MPI rank {rank}"
        )
    if problems:
        raise HvdLiteError(
            "TF_CONFIG does not agree with the MPI world: "
            + "; ".join(problems)
            + ". Unset TF_CONFIG (hvd_lite takes the cluster from mpirun) or make "
            "it list one worker per rank, in rank order"
        )


def _check_communication_options(options) -> None:
    """TypeError or ValueError unless hvd_lite can honour every field of `options`."""
    if options is None:
        return
    if not isinstance(options, type(tf.distribute.experimental.CommunicationOptions())):
        raise TypeError(
            "communication_options must be a "
            "tf.distribute.experimental.CommunicationOptions, got "
            f"{type(options).__name__}"
        )
    if options.bytes_per_pack:
        raise ValueError(
            f"CommunicationOptions(bytes_per_pack={options.bytes_per_pack}) is not "
            "supported: hvd_lite fuses each batch of reductions into one call (tune "
            "fusion with HVD_LITE_FUSION_THRESHOLD); leave bytes_per_pack at 0"
        )
    impl = options.implementation
    if impl != tf.distribute.experimental.CommunicationImplementation.AUTO:
        raise ValueError(
            f"CommunicationOptions(implementation={impl}) is not supported: hvd_lite "
            "picks its own algorithm over MPI; leave implementation at AUTO"
        )


class MultiWorkerMirroredStrategy(tf.distribute.OneDeviceStrategy):
    """Data parallelism over the hvd_lite ranks (one replica per rank) under mpirun; a stand-in for
    tf.distribute.MultiWorkerMirroredStrategy on which Keras 3 model.fit works."""

    def __init__(self, communication_options=None, cluster_resolver=None, device: Optional[str] = None):
        if not basics.is_initialized():
            basics.init()
        if cluster_resolver is not None:
            raise HvdLiteError(
                "hvd_lite's MultiWorkerMirroredStrategy takes its cluster from mpirun; "
                "pass no cluster_resolver"
            )
        _check_communication_options(communication_options)
        rank, size = basics.rank(), basics.size()
        hosts = allgather_object(socket.gethostname())
        workers = [f"{h}:{r}" for r, h in enumerate(hosts)]  # host:rank, not a TF server address
        _check_tf_config(rank, size, workers)
        self.communication_options = communication_options
        timeout = getattr(communication_options, "timeout_seconds", None)
        device = device or "/cpu:0"
        # skip OneDeviceStrategy.__init__ (it would build a OneDeviceExtended): Strategy's own
        distribute_lib.Strategy.__init__(self, HvdExtended(self, device, timeout))
        self._cluster_resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({"worker": workers}),
            task_type="worker",
            task_id=rank,
            num_accelerators={},
            rpc_layer="mpi",
        )
        keras_fit.install()  # predict, evaluate, metrics and checkpoints as under tf.distribute

    @property
    def cluster_resolver(self):
        """A SimpleClusterResolver of the job's ranks, as tf.distribute's strategy has."""
        return self._cluster_resolver

    def __repr__(self):
        return f"<hvd_lite.tensorflow.MultiWorkerMirroredStrategy rank {basics.rank()} of {basics.size()}>"
