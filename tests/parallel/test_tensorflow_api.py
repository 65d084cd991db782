"""hvd_lite.tensorflow and hvd_lite.keras against Horovod 0.28.1's API, at 1-4 ranks: every public
name, each signature (parameter names, order and defaults, written down below from Horovod's
source), the dtypes Horovod takes, and the exception types Horovod raises. What hvd_lite does not
support raises a clear error; nothing is accepted and ignored."""

import inspect
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed (pip install -e '.[tensorflow]')")
keras = pytest.importorskip("keras", reason="Keras 3 is not installed (pip install -e '.[tensorflow]')")

from conftest import agree, everywhere, raises_before_submitting, raises_on_every_rank  # noqa: E402

import hvd_lite  # noqa: E402
import hvd_lite.keras as hvdk  # noqa: E402
import hvd_lite.tensorflow as hvd  # noqa: E402
from hvd_lite.tensorflow.compression import Compressor  # noqa: E402

pytestmark = pytest.mark.mpi

NONE, GLOBAL, AVG = "Compression.none", "global_process_set", "Average"

# name -> [(parameter, default or REQUIRED)], from horovod/tensorflow/{__init__,mpi_ops,functions}.py
REQUIRED = object()
TF_SIGNATURES = {
    "allreduce": [
        ("tensor", REQUIRED),
        ("average", None),
        ("device_dense", ""),
        ("device_sparse", ""),
        ("compression", NONE),
        ("op", None),
        ("prescale_factor", 1.0),
        ("postscale_factor", 1.0),
        ("name", None),
        ("process_set", GLOBAL),
        ("ignore_name_scope", False),
    ],
    "grouped_allreduce": [
        ("tensors", REQUIRED),
        ("average", None),
        ("device_dense", ""),
        ("device_sparse", ""),
        ("compression", NONE),
        ("op", None),
        ("prescale_factor", 1.0),
        ("postscale_factor", 1.0),
        ("process_set", GLOBAL),
        ("ignore_name_scope", False),
        ("name", None),
    ],
    "reducescatter": [
        ("tensor", REQUIRED),
        ("device_dense", ""),
        ("compression", NONE),
        ("op", AVG),
        ("name", None),
        ("process_set", GLOBAL),
        ("ignore_name_scope", False),
        ("prescale_factor", 1.0),
        ("postscale_factor", 1.0),
    ],
    "grouped_reducescatter": [
        ("tensors", REQUIRED),
        ("device_dense", ""),
        ("compression", NONE),
        ("op", AVG),
        ("process_set", GLOBAL),
        ("prescale_factor", 1.0),
        ("postscale_factor", 1.0),
    ],
    "allgather": [
        ("tensor", REQUIRED),
        ("name", None),
        ("ignore_name_scope", False),
        ("process_set", GLOBAL),
    ],
    "grouped_allgather": [
        ("tensors", REQUIRED),
        ("name", None),
        ("ignore_name_scope", False),
        ("process_set", GLOBAL),
    ],
    "broadcast": [
        ("tensor", REQUIRED),
        ("root_rank", REQUIRED),
        ("name", None),
        ("ignore_name_scope", False),
        ("process_set", GLOBAL),
    ],
    "broadcast_": [("variables", REQUIRED), ("root_rank", REQUIRED), ("name", None), ("process_set", GLOBAL)],
    "alltoall": [
        ("tensor", REQUIRED),
        ("splits", None),
        ("name", None),
        ("ignore_name_scope", False),
        ("process_set", GLOBAL),
    ],
    "join": [],
    "size_op": [("process_set_id", 0), ("name", None)],
    "process_set_included_op": [("process_set_id", 0), ("name", None)],
    "local_size_op": [("name", None)],
    "rank_op": [("name", None)],
    "local_rank_op": [("name", None)],
    "broadcast_variables": [
        ("variables", REQUIRED),
        ("root_rank", REQUIRED),
        ("process_set", GLOBAL),
        ("inplace", False),
    ],
    "broadcast_object": [
        ("obj", REQUIRED),
        ("root_rank", 0),
        ("session", None),
        ("name", None),
        ("process_set", GLOBAL),
    ],
    "allgather_object": [("obj", REQUIRED), ("session", None), ("name", None), ("process_set", GLOBAL)],
    "broadcast_object_fn": [("root_rank", 0), ("session", None), ("name", None), ("process_set", GLOBAL)],
    "broadcast_global_variables": [("root_rank", REQUIRED)],
    "DistributedOptimizer": [
        ("optimizer", REQUIRED),
        ("name", None),
        ("use_locking", False),
        ("device_dense", ""),
        ("device_sparse", ""),
        ("compression", NONE),
        ("sparse_as_dense", False),
        ("backward_passes_per_step", 1),
        ("op", AVG),
        ("gradient_predivide_factor", 1.0),
        ("average_aggregated_gradients", False),
        ("num_groups", 0),
        ("groups", None),
        ("process_set", GLOBAL),
        ("scale_local_gradients", True),
    ],
    "DistributedGradientTape": [
        ("gradtape", REQUIRED),
        ("device_dense", ""),
        ("device_sparse", ""),
        ("compression", NONE),
        ("sparse_as_dense", False),
        ("op", AVG),
        ("gradient_predivide_factor", 1.0),
        ("num_groups", 0),
        ("groups", None),
        ("process_set", GLOBAL),
        ("scale_local_gradients", True),
    ],
    "PartialDistributedGradientTape": [
        ("gradtape", REQUIRED),
        ("device_dense", ""),
        ("device_sparse", ""),
        ("compression", NONE),
        ("sparse_as_dense", False),
        ("op", AVG),
        ("gradient_predivide_factor", 1.0),
        ("num_groups", 0),
        ("groups", None),
        ("process_set", GLOBAL),
        ("local_layers", None),
        ("scale_local_gradients", True),
    ],
    "BroadcastGlobalVariablesHook": [("root_rank", REQUIRED), ("device", "")],
}
# the basics: no arguments (init takes hvd_lite's optional communicator)
TF_NAMES = set(TF_SIGNATURES) | {
    "init",
    "shutdown",
    "is_initialized",
    "start_timeline",
    "stop_timeline",
    "size",
    "local_size",
    "cross_size",
    "rank",
    "local_rank",
    "cross_rank",
    "is_homogeneous",
    "mpi_threads_supported",
    "mpi_enabled",
    "mpi_built",
    "gloo_enabled",
    "gloo_built",
    "nccl_built",
    "ddl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "handle_average_backwards_compatibility",
    "check_num_rank_power_of_2",
    "SyncBatchNormalization",
    "Compression",
}

# from horovod/tensorflow/keras/{__init__,callbacks}.py (and horovod/keras for Partial...)
KERAS_SIGNATURES = {
    "DistributedOptimizer": [
        ("optimizer", REQUIRED),
        ("name", None),
        ("device_dense", ""),
        ("device_sparse", ""),
        ("compression", NONE),
        ("sparse_as_dense", False),
        ("gradient_predivide_factor", 1.0),
        ("op", AVG),
        ("backward_passes_per_step", 1),
        ("average_aggregated_gradients", False),
        ("num_groups", 0),
        ("groups", None),
        ("process_set", GLOBAL),
        ("scale_local_gradients", True),
    ],
    "PartialDistributedOptimizer": [
        ("optimizer", REQUIRED),
        ("name", None),
        ("device_dense", ""),
        ("device_sparse", ""),
        ("compression", NONE),
        ("sparse_as_dense", False),
        ("gradient_predivide_factor", 1.0),
        ("op", AVG),
        ("groups", None),
        ("process_set", GLOBAL),
        ("local_layers", None),
        ("scale_local_gradients", True),
    ],
    "broadcast_global_variables": [("root_rank", REQUIRED)],
    "allreduce": [
        ("value", REQUIRED),
        ("name", None),
        ("average", None),
        ("prescale_factor", 1.0),
        ("postscale_factor", 1.0),
        ("op", None),
        ("compression", NONE),
    ],
    "allgather": [("value", REQUIRED), ("name", None)],
    "broadcast": [("value", REQUIRED), ("root_rank", REQUIRED), ("name", None)],
    "reducescatter": [("value", REQUIRED), ("name", None), ("op", AVG)],
    "load_model": [
        ("filepath", REQUIRED),
        ("custom_optimizers", None),
        ("custom_objects", None),
        ("compression", NONE),
        ("legacy_opts", False),
    ],
    "BroadcastGlobalVariablesCallback": [("root_rank", REQUIRED), ("device", ""), ("local_variables", None)],
    "MetricAverageCallback": [("device", "")],
    "LearningRateScheduleCallback": [
        ("initial_lr", REQUIRED),
        ("multiplier", REQUIRED),
        ("start_epoch", 0),
        ("end_epoch", None),
        ("staircase", True),
        ("momentum_correction", True),
        ("steps_per_epoch", None),
    ],
    "LearningRateWarmupCallback": [
        ("initial_lr", REQUIRED),
        ("warmup_epochs", 5),
        ("momentum_correction", True),
        ("steps_per_epoch", None),
        ("verbose", 0),
    ],
}
KERAS_NAMES = set(KERAS_SIGNATURES) - {
    "BroadcastGlobalVariablesCallback",
    "MetricAverageCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
} | {
    "init",
    "shutdown",
    "is_initialized",
    "start_timeline",
    "stop_timeline",
    "size",
    "local_size",
    "cross_size",
    "rank",
    "local_rank",
    "cross_rank",
    "mpi_threads_supported",
    "mpi_enabled",
    "mpi_built",
    "gloo_enabled",
    "gloo_built",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "nccl_built",
    "ddl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
    "Average",
    "Sum",
    "Adasum",
    "Compression",
    "callbacks",
}

# the dtypes Horovod's TF ops take (horovod/tensorflow/mpi_ops.cc)
HOROVOD_DTYPES = [
    tf.uint8,
    tf.int8,
    tf.uint16,
    tf.int16,
    tf.int32,
    tf.int64,
    tf.float16,
    tf.bfloat16,
    tf.float32,
    tf.float64,
    tf.bool,
]


def _resolve(module, default):
    if isinstance(default, str) and default in (NONE, GLOBAL, AVG):
        return {NONE: module.Compression.none, GLOBAL: module.global_process_set, AVG: module.Average}[
            default
        ]
    return default


def _mismatches(module, table):
    bad = []
    for name, want in table.items():
        obj = getattr(module, name)
        params = [p for p in inspect.signature(obj).parameters.values() if p.name != "self"]
        got = [(p.name, REQUIRED if p.default is p.empty else p.default) for p in params]
        want = [(n, _resolve(module, d)) for n, d in want]
        # Horovod's parameters come first, in order, with the same defaults; hvd_lite may add
        # keyword parameters after them
        if [n for n, _ in got[: len(want)]] != [n for n, _ in want] or any(
            g is not w and g != w for (_, g), (_, w) in zip(got, want)
        ):
            bad.append(f"{name}{[n for n, _ in got]} != {[n for n, _ in want]}")
    return bad


def test_every_horovod_tensorflow_and_keras_name_is_there_with_horovods_signature():
    missing = sorted(n for n in TF_NAMES if not hasattr(hvd, n)) + sorted(
        f"keras.{n}" for n in KERAS_NAMES if not hasattr(hvdk, n)
    )
    import hvd_lite.tensorflow.keras as tfk

    bad = _mismatches(hvd, TF_SIGNATURES) + _mismatches(hvdk, KERAS_SIGNATURES)
    agree(
        not missing and not bad and tfk.DistributedOptimizer is hvdk.DistributedOptimizer,
        f"missing {missing}; signatures {bad}",
    )


def test_names_hvd_lite_does_not_implement_raise_not_implemented_error():
    calls = {
        "start_timeline": lambda: hvd.start_timeline("/tmp/t.json"),
        "stop_timeline": hvd.stop_timeline,
        "broadcast_object_fn": hvd.broadcast_object_fn,
        "BestModelCheckpoint": hvdk.callbacks.BestModelCheckpoint,
        "TF1 optimizer accumulating": lambda: hvd.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), backward_passes_per_step=2
        ),
        "TF1 optimizer with Adasum": lambda: hvd.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), op=hvd.Adasum
        ),
    }
    wrong = {}
    for what, call in calls.items():
        try:
            call()
            wrong[what] = "returned"
        except NotImplementedError as exc:
            if len(str(exc)) < 20:
                wrong[what] = f"unclear message {exc!r}"
        except Exception as exc:  # noqa: BLE001
            wrong[what] = repr(exc)
    agree(not wrong, str(wrong))


def test_adasum_is_taken_by_allreduce_and_the_optimizers_and_refused_by_reducescatter():
    """Horovod's op=Adasum works (tests/parallel/test_adasum_tensorflow.py checks its values): the
    same vector on every rank comes back as itself, and both DistributedOptimizers take it;
    reducescatter, which Adasum does not apply to, raises ValueError."""
    import keras

    got = hvd.allreduce(tf.ones([2]), op=hvd.Adasum)
    opts = [
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum),
        hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvdk.Adasum),
    ]
    agree(
        np.array_equal(got.numpy(), np.ones(2, np.float32)) and all(type(o).__name__ == "SGD" for o in opts),
        f"{got}, {[type(o) for o in opts]}",
    )
    raises_on_every_rank(
        ValueError, "Adasum", lambda: hvd.reducescatter(tf.ones([4 * hvd.size()]), op=hvd.Adasum)
    )


def shared_is_homogeneous():
    """The one implementation every adapter exports (hvd_lite._build)."""
    from hvd_lite import _build

    return _build.is_homogeneous


def test_the_build_queries_answer_for_an_mpi_cpu_build():
    n = hvd.size()
    agree(
        hvd.mpi_built()
        and hvd.mpi_enabled()
        and not hvd.gloo_built()
        and not hvd.gloo_enabled()
        and not hvd.nccl_built()
        and hvd.cuda_built() is bool(hvd_lite.build_info()["cuda"])
        and not hvd.rocm_built()
        and not hvd.ddl_built()
        and not hvd.ccl_built()
        and hvd.is_homogeneous() is True
        and hvd.is_homogeneous is shared_is_homogeneous()
        and int(hvd.size_op()) == n
        and int(hvd.rank_op()) == hvd.rank()
        and int(hvd.local_size_op()) == hvd.local_size()
        and int(hvd.local_rank_op()) == hvd.local_rank()
        and int(hvd.process_set_included_op()) == 1
        and hvd.check_num_rank_power_of_2(4)
        and not hvd.check_num_rank_power_of_2(6)
        and hvd.global_process_set.size() == n,
        "",
    )


def test_every_dtype_the_core_has_is_reduced_gathered_and_broadcast_and_the_others_refused():
    """Horovod's dtypes: those hvd_lite's core has work; the rest raise TypeError naming the dtype
    and send nothing (the table is the core's: adding a dtype there adds it here)."""
    n = hvd.size()
    from hvd_lite.tensorflow.mpi_ops import supported_dtypes

    supported = set(supported_dtypes())
    wrong = []
    for dt in HOROVOD_DTYPES + [tf.complex64, tf.string]:
        x = tf.cast(tf.fill([2], 1), dt) if dt != tf.string else tf.constant(["a", "b"])
        if dt in supported:
            checks = [(hvd.allgather(x), np.ones(2 * n)), (hvd.broadcast(x, 0), np.ones(2))]
            if dt != tf.bool:
                checks.append((hvd.allreduce(x, op=hvd.Sum), np.full(2, n)))
            for got, want in checks:
                if got.dtype != dt or not np.array_equal(np.asarray(got.numpy(), float), want):
                    wrong.append(f"{dt.name}: {got} != {want}")
        else:
            for call in (lambda: hvd.allreduce(x), lambda: hvd.allgather(x), lambda: hvd.broadcast(x, 0)):
                try:
                    call()
                    wrong.append(f"{dt.name} accepted")
                except TypeError as exc:
                    if f"unsupported dtype {dt.name}" not in str(exc):
                        wrong.append(repr(exc))
    base = {tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64}
    agree(not wrong and base <= supported, f"{wrong}; supported {sorted(d.name for d in supported)}")
    raises_before_submitting(
        TypeError,
        "unsupported dtype complex64",
        lambda: hvd.grouped_allreduce([tf.ones([2]), tf.ones([2], tf.complex64)]),
    )


@pytest.mark.mpi(min_size=2)
def test_collectives_that_disagree_across_ranks_raise_horovods_error_types():
    """Eagerly: a mismatch is tf.errors.FailedPreconditionError (and hvd_lite.CollectiveError), as
    in Horovod; alltoall splits that do not add up are tf.errors.InvalidArgumentError."""
    r = hvd.rank()
    raises_on_every_rank(
        tf.errors.FailedPreconditionError, "shape", lambda: hvd.allreduce(tf.ones([2 + r]), name="api.shape")
    )
    raises_on_every_rank(
        hvd_lite.CollectiveError,
        "dtype",
        lambda: hvd.allreduce(tf.ones([2], tf.float32 if r else tf.float64), name="api.dtype"),
    )
    raises_on_every_rank(
        tf.errors.FailedPreconditionError,
        "root",
        lambda: hvd.broadcast(tf.ones([2]), root_rank=r, name="api.root"),
    )
    raises_on_every_rank(
        tf.errors.InvalidArgumentError,
        "splits",
        lambda: hvd.alltoall(tf.ones([3]), splits=[3] + [1] * (hvd.size() - 1), name="api.splits"),
    )
    out = hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="api.after")  # the engine carries on
    agree(np.allclose(out.numpy(), hvd.size()), str(out))


def test_arguments_hvd_lite_cannot_honour_raise_before_anything_is_sent():
    x = tf.ones([2])
    sl = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), tf.constant([3, 2]))
    for exc, match, call in [
        (TypeError, "process_set", lambda: hvd.allreduce(x, process_set=object())),
        (TypeError, "process_set", lambda: hvd.allgather(x, process_set="other")),
        (
            TypeError,
            "process_set",
            lambda: hvd.DistributedGradientTape(tf.GradientTape(), process_set=object()),
        ),
        (ValueError, "device_dense", lambda: hvd.allreduce(x, device_dense="/gpu:0")),
        (ValueError, "supersedes average", lambda: hvd.allreduce(x, average=True, op=hvd.Sum)),
        (NotImplementedError, "Sum and Average", lambda: hvd.allreduce(sl, op=hvd.Max)),
        (NotImplementedError, "prescale", lambda: hvd.allreduce(sl, prescale_factor=2.0)),
        (
            ValueError,
            "gradient_predivide_factor",
            lambda: hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Sum, gradient_predivide_factor=2.0),
        ),
        (ValueError, "groups", lambda: hvd.DistributedGradientTape(tf.GradientTape(), groups=-1)),
        (
            ValueError,
            "op currently only supports",
            lambda: hvdk.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Max),
        ),
        (
            ValueError,
            "backward_passes_per_step",
            lambda: hvdk.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0),
        ),
        (
            ValueError,
            "use_locking",
            lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(), use_locking=True),
        ),
        (
            ValueError,
            "construct it with use_locking=True",
            lambda: hvd.DistributedOptimizer(
                tf.compat.v1.train.GradientDescentOptimizer(0.1), use_locking=True
            ),
        ),
        (TypeError, "session", lambda: hvd.broadcast_object(1, session=object())),
        (ValueError, "legacy_opts", lambda: hvdk.load_model("x.keras", legacy_opts=True)),
        (RuntimeError, "broadcast_variables", lambda: hvd.broadcast_global_variables(0)),
        (
            ValueError,
            "local layers",
            lambda: hvd.PartialDistributedGradientTape(tf.GradientTape(), local_layers=[object()]),
        ),
        (
            ValueError,
            "bytes_per_pack",
            lambda: hvd.MultiWorkerMirroredStrategy(
                tf.distribute.experimental.CommunicationOptions(bytes_per_pack=1024)
            ),
        ),
        (
            ValueError,
            "implementation",
            lambda: hvd.MultiWorkerMirroredStrategy(
                tf.distribute.experimental.CommunicationOptions(
                    implementation=tf.distribute.experimental.CommunicationImplementation.NCCL
                )
            ),
        ),
    ]:
        raises_before_submitting(exc, match, call)


def test_indexed_slices_are_gathered_and_dense_gradients_grouped_as_asked():
    """A tf.IndexedSlices is reduced as Horovod does (values and indices allgathered);
    DistributedGradientTape(groups=2) makes two fused calls; sparse_as_dense densifies."""
    from conftest import engine_calls

    r, n = hvd.rank(), hvd.size()
    sl = tf.IndexedSlices(tf.fill([1, 2], float(r + 1)), tf.constant([r % 3]), tf.constant([3, 2]))
    out = hvd.allreduce(sl, op=hvd.Sum)
    dense = tf.convert_to_tensor(out).numpy()
    want = np.zeros((3, 2))
    for q in range(n):
        want[q % 3] += q + 1
    emb = tf.Variable(tf.ones([3, 2]))
    ws = [tf.Variable(tf.ones([2])) for _ in range(3)]
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(emb, [r % 3])) + sum(tf.reduce_sum(w * (r + 1)) for w in ws)
    tape = hvd.DistributedGradientTape(tape, groups=2, sparse_as_dense=True)
    with engine_calls() as calls:
        grads = tape.gradient(loss, [emb] + ws)
    submits = sum(1 for kind, _ in calls if kind == "submit")
    agree(
        isinstance(out, tf.IndexedSlices)
        and np.allclose(dense, want)
        and not isinstance(grads[0], tf.IndexedSlices)
        and np.allclose(grads[1].numpy(), (n + 1) / 2)
        and (submits == 4 if n > 1 else True),
        f"{dense} vs {want}; {submits} submissions",
    )


def test_allgather_broadcast_reducescatter_and_alltoall_are_differentiable_as_in_horovod():
    r, n = hvd.rank(), hvd.size()
    x = tf.Variable(tf.fill([r + 1, 2], 1.0))
    y = tf.Variable(tf.fill([2 * n, 2], float(r + 1)))
    with tf.GradientTape(persistent=True) as tape:
        g = tf.reduce_sum(hvd.allgather(x) * 2.0)
        b = tf.reduce_sum(hvd.broadcast(y, 0) * 3.0)
        s = tf.reduce_sum(hvd.reducescatter(y, op=hvd.Sum))
        a = tf.reduce_sum(hvd.alltoall(y) * float(r + 1))
    dg, db, ds, da = (tape.gradient(v, w) for v, w in ((g, x), (b, y), (s, y), (a, y)))
    want_a = np.repeat(np.arange(1, n + 1, dtype=float), 2)[:, None] * np.ones((1, 2))
    agree(
        np.allclose(dg, 2.0)
        and np.allclose(db, 3.0 if r == 0 else 0.0)
        and np.allclose(ds, n)
        and np.allclose(da, want_a),
        f"{dg.numpy()} {db.numpy()} {ds.numpy()} {da.numpy()}",
    )


def test_keras_names_reduce_python_values_and_a_saved_model_loads_with_its_optimizer_wrapped(tmp_path):
    n = hvd.size()
    total = hvdk.allreduce([1.0, 2.0], op=hvdk.Sum)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
    path = str(tmp_path / f"m{hvd.rank()}.keras")
    model.save(path)
    plain = keras.models.load_model(path)  # loads without hvd_lite: the class is Adam's
    loaded = hvdk.load_model(path)
    with everywhere("load_model"):
        assert np.allclose(total.numpy(), [n, 2 * n])
        assert type(plain.optimizer).__name__ == "Adam"
        assert hasattr(loaded.optimizer, "_hvd_reduction")
        assert int(loaded.optimizer.iterations.numpy()) == int(model.optimizer.iterations.numpy())


def _positive(t):
    # a helper of the user's compressor, with a Python `if` on a tensor: AutoGraph must convert it
    # as part of what the compressor calls
    if tf.reduce_min(t) > 0.0:
        return t + 1.0
    return t


class _PlusOne(Compressor):
    """Sends x + 1 where x > 0 everywhere: a sum then has n more, which says it ran."""

    @staticmethod
    def compress(tensor):
        return _positive(tensor), None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _BFloat16(hvd.Compression.fp16):
    """A subclass of Horovod's fp16 compressor, whose methods are classmethods."""

    float16 = tf.bfloat16


def test_autograph_calls_hvd_lites_entry_points_as_they_are_and_still_converts_the_callers_code():
    """Like TF's and Keras's own code (and Horovod's C++ ops), hvd_lite's TF entry points are not
    converted by AutoGraph when a tf.function calls them: converting them only cost seconds on
    the first trace. The caller's own code is still converted: a Python `if` on a tensor around a
    collective becomes a tf.cond, and so does one in a compressor of the user's own and in what it
    calls; a compressor with classmethods (a subclass of Compression.fp16) is called as a method."""
    from tensorflow.python.autograph.impl.api import is_autograph_artifact

    tape = hvd.DistributedGradientTape(tf.GradientTape())
    entries = {
        f"hvd_lite.tensorflow.{n}": getattr(hvd, n)
        for n in (
            "allreduce",
            "grouped_allreduce",
            "allgather",
            "grouped_allgather",
            "broadcast",
            "broadcast_",
            "alltoall",
            "reducescatter",
            "grouped_reducescatter",
            "join",
            "barrier",
            "size_op",
            "local_size_op",
            "rank_op",
            "local_rank_op",
            "process_set_included_op",
            "broadcast_variables",
            "broadcast_global_variables",
            "DistributedGradientTape",
            "PartialDistributedGradientTape",
        )
    }
    entries.update(
        {
            f"hvd_lite.keras.{n}": getattr(hvdk, n)
            for n in ("allreduce", "allgather", "broadcast", "reducescatter", "broadcast_global_variables")
        }
    )
    for method in ("gradient", "get_local_and_global_gradients", "register_local_source"):
        entries[f"DistributedGradientTape.{method}"] = getattr(tape, method)
    entries["DistributedOptimizer.apply"] = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)).apply
    converted = sorted(n for n, f in entries.items() if not is_autograph_artifact(f))

    n, r = hvd.size(), hvd.rank()

    @tf.function
    def step(x):
        if tf.reduce_sum(x) > 0:  # the same branch on every rank: x > 0 everywhere
            y = hvd.allreduce(x, op=hvd.Sum)
        else:
            y = -x
        return y

    @tf.function
    def compressed(x):
        return (
            hvd.allreduce(x, op=hvd.Sum, compression=_PlusOne),
            hvd.reducescatter(tf.tile(x, [n]), op=hvd.Sum, compression=_PlusOne),
            hvd.allreduce(x, op=hvd.Sum, compression=_BFloat16),
        )

    x = tf.constant([1.0, 2.0]) * (r + 1)
    got = step(x).numpy()
    outs = [t.numpy() for t in compressed(x)]
    want = np.array([1.0, 2.0]) * n * (n + 1) / 2
    agree(
        not converted
        and np.allclose(got, want)
        and np.allclose(outs[0], want + n)
        and np.allclose(outs[1], want + n)
        and np.allclose(outs[2], want)
        and outs[2].dtype == np.float32,
        f"converted by AutoGraph: {converted}; the step gave {got}; with the compressors {outs}",
    )


def test_graph_outputs_keep_the_inputs_static_shape_but_dim_0_as_horovods_shape_functions_do():
    """Inside tf.function every collective's output has the input's static shape, dim 0 unknown
    where the collective changes it, so a Keras layer after it builds."""
    n = hvd.size()
    dense = keras.layers.Dense(2)
    seen = {}

    @tf.function
    def step(x):
        outs = {
            "allreduce": hvd.allreduce(x),
            "grouped_allreduce": hvd.grouped_allreduce([x])[0],
            "allgather": hvd.allgather(x),
            "broadcast": hvd.broadcast(x, 0),
            "reducescatter": hvd.reducescatter(x),
            "alltoall": hvd.alltoall(x),
        }
        out, rsplits = hvd.alltoall(x, splits=tf.fill([n], 2 * n // n))
        outs["alltoall_splits"], outs["received_splits"] = out, rsplits
        for k, v in outs.items():
            seen[k] = v.shape.as_list()
        return dense(outs["allgather"])

    y = step(tf.ones([2 * n, 3]))
    want = {
        "allreduce": [2 * n, 3],
        "grouped_allreduce": [2 * n, 3],
        "allgather": [None, 3],
        "broadcast": [2 * n, 3],
        "reducescatter": [None, 3],
        "alltoall": [None, 3],
        "alltoall_splits": [None, 3],
        "received_splits": [n],
    }
    agree(seen == want and y.shape == (2 * n * n, 2), f"{seen}; {y.shape}")


def test_alltoall_without_splits_needs_dim_0_divisible_by_the_ranks_eager_and_in_a_graph():
    """As Horovod's: no uneven split without splits; every rank raises tf.errors.InvalidArgumentError
    naming dim 0 and the ranks, and the engine carries on."""
    n = hvd.size()
    if n == 1:  # every dim 0 divides by 1
        out = hvd.alltoall(tf.ones([3, 2]))
        agree(out.shape == (3, 2), str(out.shape))
        return
    raises_on_every_rank(
        tf.errors.InvalidArgumentError, "divisible", lambda: hvd.alltoall(tf.ones([n + 1, 2]), name="a2a.odd")
    )
    raises_on_every_rank(
        tf.errors.InvalidArgumentError,
        "divisible",
        lambda: tf.function(lambda x: hvd.alltoall(x, name="a2a.odd.graph"))(tf.ones([n + 1, 2])),
    )
    out = hvd.alltoall(tf.fill([2 * n, 2], float(hvd.rank())), name="a2a.even")
    want = np.repeat(np.arange(n, dtype=np.float32), 2)[:, None] * np.ones((1, 2), np.float32)
    agree(np.array_equal(out.numpy(), want), str(out.numpy()))


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_sync_batch_normalization_equals_batch_norm_over_the_global_batch(graph):
    """Outputs, the gradients of gamma, beta and the input, and the moving statistics: each rank
    on its rows (3 ranks' batches of different sizes at 3+ ranks) against Keras' BatchNormalization
    of one process on every row."""
    r, n = hvd.rank(), hvd.size()
    rows = [4 + (i % 3) for i in range(n)]  # uneven batches
    start = sum(rows[:r])
    rng = np.random.RandomState(7)
    x_all = (rng.rand(sum(rows), 3) * [1.0, 10.0, 0.1] + [0.0, 5.0, -2.0]).astype("float32")
    w_all = rng.rand(sum(rows), 3).astype("float32")  # a loss weighting, so gradients differ per row
    x = tf.constant(x_all[start : start + rows[r]])
    w = tf.constant(w_all[start : start + rows[r]])

    sync = hvd.SyncBatchNormalization(momentum=0.5)
    ref = keras.layers.BatchNormalization(momentum=0.5)

    def forward(layer, xs, ws):
        with tf.GradientTape() as tape:
            tape.watch(xs)
            y = layer(xs, training=True)
            loss = tf.reduce_sum(y * ws)
        return (y, *tape.gradient(loss, [xs, layer.gamma, layer.beta]))

    step = tf.function(forward) if graph else forward
    y, dx, dgamma, dbeta = step(sync, x, w)
    y_ref, dx_ref, dgamma_ref, dbeta_ref = forward(ref, tf.constant(x_all), tf.constant(w_all))
    # the loss is the sum of every rank's: gamma's and beta's gradients are the sum of the ranks'
    dgamma, dbeta = hvd.allreduce(dgamma, op=hvd.Sum), hvd.allreduce(dbeta, op=hvd.Sum)
    mine = slice(start, start + rows[r])
    pairs = {
        "output": (y, y_ref[mine]),
        "d input": (dx, dx_ref[mine]),
        "d gamma": (dgamma, dgamma_ref),
        "d beta": (dbeta, dbeta_ref),
        "moving mean": (sync.moving_mean, ref.moving_mean),
        "moving variance": (sync.moving_variance, ref.moving_variance),
        "inference": (sync(x, training=False), ref(tf.constant(x_all), training=False)[mine]),
    }
    # relative to the largest value: float32 rounding (sums in other orders; gamma's gradient sums
    # terms of both signs); batch norm of the local batch alone is off by 1e-1 or more
    bad = {
        k: float(np.abs(np.asarray(a) - np.asarray(b)).max() / max(1.0, np.abs(np.asarray(b)).max()))
        for k, (a, b) in pairs.items()
    }
    agree(all(v < 1e-4 for v in bad.values()), f"relative differences {bad}")


def test_sync_batch_normalization_refuses_fused_as_horovod():
    for fused, exc in ((True, ValueError), (None, ValueError), ("yes", TypeError)):
        with pytest.raises(exc, match="fused"):
            hvd.SyncBatchNormalization(fused=fused)
