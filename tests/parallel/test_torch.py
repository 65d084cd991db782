"""hvd_lite.torch at 1-4 ranks: the collectives on tensors, autograd, DistributedOptimizer against one
process and against DDP, and the state helpers."""

import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[torch]')")

from conftest import agree, raised, raises_before_submitting, raises_on_every_rank, world  # noqa: E402

import hvd_lite.torch as hvd  # noqa: E402

pytestmark = pytest.mark.mpi

DTYPES = [
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.uint16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]


def rank_size():
    return hvd.rank(), hvd.size()


def small_ints(rank, shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    lo = 0 if dtype in (torch.uint8, torch.uint16) else -4
    return torch.randint(lo, 5, shape, generator=g).to(dtype)


def every_rank(shape, dtype, seed=0):
    return [small_ints(r, shape, dtype, seed) for r in range(hvd.size())]


# ------------------------------------------------------------------ collectives on tensors


@pytest.mark.parametrize("call", ["allreduce", "allreduce_", "broadcast", "broadcast_", "allreduce_grad"])
def test_unnamed_synchronous_calls_share_one_name_and_the_cache(call):
    """As in the numpy API (test_engine.py): an unnamed synchronous call, and the allreduce in an
    allreduce's or broadcast's backward, runs under its set's one synchronous name, so after the
    first every call is ready from the response cache (none announces a name) with exact sums."""
    from hvd_lite import basics

    r, n = rank_size()
    x = torch.arange(12, dtype=torch.float32) + r

    def grad():
        t = x.clone().requires_grad_()
        hvd.allreduce(t, op=hvd.Sum).sum().backward()
        return t.grad

    run = {
        "allreduce": lambda: hvd.allreduce(x, op=hvd.Sum),
        "allreduce_": lambda: hvd.allreduce_(x.clone(), op=hvd.Sum),
        "broadcast": lambda: hvd.broadcast(x, root_rank=0),
        "broadcast_": lambda: hvd.broadcast_(x.clone(), root_rank=0),
        "allreduce_grad": grad,
    }[call]
    want = {
        "allreduce": torch.arange(12.0) * n + n * (n - 1) / 2,
        "allreduce_": torch.arange(12.0) * n + n * (n - 1) / 2,
        "broadcast": torch.arange(12.0),
        "broadcast_": torch.arange(12.0),
        "allreduce_grad": torch.full((12,), float(n)),
    }[call]
    run()
    engine = basics._engine()
    before = engine.stats()
    outs = [run() for _ in range(5)]
    after = engine.stats()
    announced = after["announced"] - before["announced"]
    cached = after["cached_ready"] - before["cached_ready"]
    exact = all(torch.equal(o, want) for o in outs)
    calls = 10 if call == "allreduce_grad" else 5  # forward and backward
    agree(
        (announced, cached, exact) == (0, calls, True),
        f"{call}: {announced} names announced, {cached} ready from the cache, exact {exact}; "
        f"want 0, {calls}, True",
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_every_dtype_and_op_keeps_dtype(dtype):
    r, n = rank_size()
    ok, detail = True, ""
    inputs = every_rank((5, 3), dtype)
    wide = torch.stack([x.to(torch.float64) for x in inputs])
    expected = {hvd.Sum: wide.sum(0), hvd.Min: wide.min(0).values, hvd.Max: wide.max(0).values}
    if dtype.is_floating_point:
        expected[hvd.Average] = wide.sum(0) / n
    for op, want in expected.items():
        out = hvd.allreduce(inputs[r], op=op, name=f"t.dtype.{dtype}.{int(op)}")
        if out.dtype != dtype or out.shape != inputs[r].shape:
            ok, detail = False, f"{op}: got {out.dtype} {tuple(out.shape)}"
        elif not torch.equal(out.to(torch.float64), want.to(dtype).to(torch.float64)):
            ok, detail = False, f"{op}: {out} != {want}"
    agree(ok, detail)


def test_allreduce_in_place_uses_the_tensors_memory():
    r, n = rank_size()
    x = torch.full((1000,), float(r + 1))
    ptr = x.data_ptr()
    y = hvd.allreduce_(x, op=hvd.Sum, name="t.inplace")
    agree(y is x and x.data_ptr() == ptr and torch.all(x == n * (n + 1) / 2).item(), str(x[:3]))


def test_in_place_on_a_non_contiguous_tensor_is_refused_and_out_of_place_copies():
    r, n = rank_size()
    base = torch.arange(12.0).reshape(3, 4)
    view = base.t()
    raises_on_every_rank(
        ValueError, "not contiguous", lambda: hvd.allreduce_(view, name="t.noncontig.inplace")
    )
    raises_on_every_rank(
        ValueError, "not contiguous", lambda: hvd.broadcast_(view, 0, name="t.noncontig.bcast")
    )
    out = hvd.allreduce(view, op=hvd.Sum, name="t.noncontig")
    agree(torch.equal(out, view * n) and out.is_contiguous(), str(out))


def test_unsupported_dtype_is_a_type_error_and_a_value_error_as_horovods():
    for cls in (TypeError, ValueError):
        raises_on_every_rank(
            cls,
            "unsupported dtype torch.complex64",
            lambda: hvd.allreduce(torch.zeros(3, dtype=torch.complex64)),
        )
    raises_on_every_rank(TypeError, "torch.Tensor", lambda: hvd.allreduce(np.zeros(3, np.float32)))


def test_async_poll_synchronize_and_average_argument():
    r, n = rank_size()
    x = torch.full((7,), float(r))
    h = hvd.allreduce_async(x, name="t.async")
    h2 = hvd.allreduce_async_(x.clone(), average=False, name="t.async_")
    out = hvd.synchronize(h)
    out2 = hvd.synchronize(h2)
    agree(
        hvd.poll(h)
        and torch.allclose(out, torch.full((7,), (n - 1) / 2))
        and torch.allclose(out2, torch.full((7,), n * (n - 1) / 2.0)),
        f"{out} {out2}",
    )


def test_grouped_allreduce_variants():
    r, n = rank_size()
    xs = [torch.full((k + 1,), float(r + k)) for k in range(4)]
    want = [torch.full((k + 1,), sum(rr + k for rr in range(n)) / 1.0) for k in range(4)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="t.grouped")
    ys = [x.clone() for x in xs]
    hvd.grouped_allreduce_(ys, op=hvd.Sum, name="t.grouped_")
    asyncs = hvd.synchronize(hvd.grouped_allreduce_async(xs, op=hvd.Sum))  # one handle, as Horovod
    ok = all(
        torch.equal(a, w) and torch.equal(b, w) and torch.equal(c, w)
        for a, b, c, w in zip(outs, ys, asyncs, want)
    )
    agree(ok, f"{outs} {ys}")


# A later entry that every rank refuses: (exception, message, entry, refused by the in-place
# calls only: the others copy a non-contiguous tensor).
BAD_LATER_TENSORS = {
    "unsupported-dtype": (
        TypeError,
        "unsupported dtype torch.complex64",
        torch.ones(3, dtype=torch.complex64),
        False,
    ),
    "not-a-tensor": (TypeError, "expects a torch.Tensor, got ndarray", np.ones(3, np.float32), False),
    "not-contiguous": (ValueError, "not contiguous", torch.ones(4, 4).t(), True),
    "too-many-dimensions": (ValueError, "more than 16 dimensions", torch.ones((1,) * 17), False),
}


@pytest.mark.parametrize(
    "call,bad",
    [
        (call, bad)
        for call in (
            "grouped_allreduce",
            "grouped_allreduce_",
            "grouped_allreduce_async",
            "grouped_allreduce_async_",
        )
        for bad, (*_, in_place_only) in BAD_LATER_TENSORS.items()
        if call.endswith("_") or not in_place_only
    ],
)
def test_a_grouped_allreduce_with_a_bad_later_tensor_raises_everywhere_and_submits_nothing(call, bad):
    r, n = rank_size()
    exc_type, match, entry, _ = BAD_LATER_TENSORS[bad]
    good = [torch.full((3,), float(r + 1)), torch.ones(2)]
    raises_before_submitting(
        exc_type, match, lambda: getattr(hvd, call)(good + [entry], op=hvd.Sum, name="t.bad.later")
    )
    agree(torch.equal(good[0], torch.full((3,), float(r + 1))), f"the first entry changed: {good[0]}")
    # the same names again: nothing of the refused call is in flight, and the engine still works
    outs = hvd.grouped_allreduce(good, op=hvd.Sum, name="t.bad.later")
    agree(
        torch.equal(outs[0], torch.full((3,), n * (n + 1) / 2))
        and torch.equal(outs[1], torch.full((2,), float(n))),
        f"after the refused call: {outs}",
    )


def test_prescale_postscale():
    r, n = rank_size()
    out = hvd.allreduce(torch.ones(4), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25, name="t.scale")
    agree(torch.allclose(out, torch.full((4,), n * 0.5)), str(out))


def test_allgather_rows_differ_per_rank_and_keep_dtype():
    r, n = rank_size()
    x = torch.full((r + 1, 2), r, dtype=torch.bfloat16)
    out = hvd.allgather(x, name="t.allgather")
    want = torch.cat([torch.full((q + 1, 2), q, dtype=torch.bfloat16) for q in range(n)])
    outs = hvd.grouped_allgather([x, x.to(torch.int32)], name="t.gallgather")
    agree(
        out.dtype == torch.bfloat16 and torch.equal(out, want) and torch.equal(outs[1], want.to(torch.int32)),
        str(out),
    )


def test_broadcast_and_broadcast_in_place():
    r, n = rank_size()
    root = n - 1
    x = torch.full((3, 2), float(r), dtype=torch.float16)
    out = hvd.broadcast(x, root, name="t.bcast")
    y = x.clone()
    ret = hvd.broadcast_(y, root, name="t.bcast_")
    agree(
        ret is y
        and torch.all(out == root).item()
        and torch.all(y == root).item()
        and torch.all(x == r).item()
        and out.dtype == torch.float16,
        f"{out} {y}",
    )


def test_alltoall_with_and_without_splits():
    r, n = rank_size()
    x = torch.arange(n * 2, dtype=torch.int64) + 100 * r
    out = hvd.alltoall(x, name="t.a2a")
    want = torch.cat([torch.arange(2 * r, 2 * r + 2) + 100 * q for q in range(n)])
    splits = torch.tensor([1] * n)
    out2, received = hvd.alltoall(torch.arange(n) + 100 * r, splits=splits, name="t.a2a.splits")
    agree(
        torch.equal(out, want)
        and received.tolist() == [1] * n
        and out2.tolist() == [100 * q + r for q in range(n)],
        f"{out} {out2}",
    )


def test_reducescatter_keeps_this_ranks_block():
    r, n = rank_size()
    x = torch.arange(2 * n, dtype=torch.float32).reshape(n, 2) * (r + 1)
    out = hvd.reducescatter(x, op=hvd.Sum, name="t.rs")
    total = n * (n + 1) / 2
    agree(torch.equal(out, torch.tensor([[2 * r, 2 * r + 1]], dtype=torch.float32) * total), str(out))


def test_join_returns_the_rank_that_joined_last():
    r, n = rank_size()
    hvd.barrier()
    for late in range(n):
        problem = None
        if r == late:
            # This allreduce completes only once every other rank has joined (they contribute
            # zeros without submitting it), so this rank's join comes in a later round.
            def reduce_with_the_joined():
                x = torch.full((2,), float(r + 1))
                got = hvd.allreduce(x, op=hvd.Sum, name=f"t.join.{late}")
                assert torch.equal(got, x), f"the joined ranks sent more than zeros: {got}"

            problem = raised(reduce_with_the_joined)
        last = hvd.join()
        agree(
            problem is None and last == late,
            f"rank {late} should join last; join returned {last}; {problem!r}",
        )


def test_mismatched_shapes_raise_horovod_internal_error_on_every_rank():
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs 2 ranks")
    raises_on_every_rank(
        hvd.HorovodInternalError,
        "Mismatched ALLREDUCE tensor shapes",
        lambda: hvd.allreduce(torch.zeros(r + 1), name="t.mismatch"),
    )


def test_fp16_compression_returns_the_input_dtype():
    r, n = rank_size()
    x = torch.full((10,), 0.1 * (r + 1), dtype=torch.float32)
    out = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16, name="t.fp16")
    want = 0.1 * n * (n + 1) / 2
    agree(out.dtype == torch.float32 and torch.allclose(out, torch.full((10,), want), rtol=2e-3), str(out))


# ------------------------------------------------------------------ autograd


def test_allreduce_gradient_is_the_allreduce_of_the_gradient():
    r, n = rank_size()
    for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / n)):
        x = torch.ones(3, requires_grad=True)
        (hvd.allreduce(x, op=op, name=f"t.grad.{int(op)}") * (r + 1)).sum().backward()
        want = scale * n * (n + 1) / 2
        agree(torch.allclose(x.grad, torch.full((3,), want)), f"{op}: {x.grad}")


def test_allgather_gradient_is_this_ranks_rows_of_the_averaged_gradient():
    r, n = rank_size()
    x = torch.ones(r + 1, 2, requires_grad=True)
    y = hvd.allgather(x, name="t.grad.allgather")
    weights = torch.arange(y.shape[0], dtype=torch.float32).unsqueeze(1) * (r + 1)
    (y * weights).sum().backward()
    start = sum(q + 1 for q in range(r))
    rows = torch.arange(start, start + r + 1, dtype=torch.float32).unsqueeze(1)
    want = (rows * (n + 1) / 2).expand(r + 1, 2)  # Horovod's: the average of the ranks' gradients
    agree(torch.allclose(x.grad, want), f"{x.grad} vs {want}")


def test_broadcast_gradient_is_the_average_at_the_root_and_zero_elsewhere():
    r, n = rank_size()
    x = torch.ones(4, requires_grad=True)
    (hvd.broadcast(x, 0, name="t.grad.bcast") * (r + 1)).sum().backward()
    want = (n + 1) / 2 if r == 0 else 0.0  # Horovod's: the average of the ranks' gradients
    agree(torch.allclose(x.grad, torch.full((4,), want)), str(x.grad))


def test_differentiable_calls_record_a_graph_exactly_when_autograd_would(monkeypatch):
    """Every differentiable call gives the same values whether autograd records it or not, goes
    through its autograd Function (and has a grad_fn) exactly when autograd would act (grad mode
    on and an input that requires grad), and otherwise skips it (mpi_ops._differentiable); under
    forward-mode AD it still refuses, as the Function defines no jvp."""
    from hvd_lite.torch import mpi_ops

    r, n = rank_size()
    applied = []
    for cls in (
        mpi_ops._Allreduce,
        mpi_ops._GroupedAllreduce,
        mpi_ops._Allgather,
        mpi_ops._GroupedAllgather,
        mpi_ops._Broadcast,
        mpi_ops._Alltoall,
        mpi_ops._Reducescatter,
        mpi_ops._GroupedReducescatter,
    ):

        def counted(*args, _apply=cls.apply, _name=cls.__name__):
            applied.append(_name)
            return _apply(*args)

        monkeypatch.setattr(cls, "apply", counted)
    splits = [2] * n
    calls = {
        "allreduce": lambda t: hvd.allreduce(t, op=hvd.Sum),
        "allgather": lambda t: hvd.allgather(t),
        "broadcast": lambda t: hvd.broadcast(t, 0),
        "alltoall": lambda t: hvd.alltoall(t),
        "alltoall splits": lambda t: hvd.alltoall(t, splits=splits)[0],
        "reducescatter": lambda t: hvd.reducescatter(t, op=hvd.Sum),
        "grouped_allreduce": lambda t: hvd.grouped_allreduce([t, t * 2], op=hvd.Sum)[1],
        "grouped_allgather": lambda t: hvd.grouped_allgather([t, t * 2])[1],
        "grouped_reducescatter": lambda t: hvd.grouped_reducescatter([t, t * 2], op=hvd.Sum)[1],
    }
    modes = (
        ("grad", True, True),
        ("no_grad", True, False),
        ("grad", False, False),
        ("inference", True, False),
    )
    problems = []
    for label, call in calls.items():
        x = torch.arange(4 * n, dtype=torch.float32).reshape(2 * n, 2) + r
        want = call(x.clone())  # no grad: the direct route
        for mode, requires, graph in modes:
            t = x.clone().requires_grad_(requires)
            del applied[:]
            if mode == "inference":
                with torch.inference_mode():
                    out = call(t)
            else:
                with torch.set_grad_enabled(mode == "grad"):
                    out = call(t)
            if (out.grad_fn is not None) != graph or bool(applied) != graph:
                problems.append(
                    f"{label} {mode} requires_grad={requires}: grad_fn {out.grad_fn}, "
                    f"Functions applied {applied}"
                )
            if not torch.equal(out.detach(), want):
                problems.append(f"{label} {mode} requires_grad={requires}: {out} vs {want}")
    import torch.autograd.forward_ad as fwd

    with fwd.dual_level():
        dual = fwd.make_dual(torch.ones(3), torch.ones(3))
        try:
            hvd.allreduce(dual, op=hvd.Sum)
            problems.append("forward-mode AD: allreduce of a dual tensor was accepted")
        except NotImplementedError:
            pass
    agree(not problems, "; ".join(problems))


# ------------------------------------------------------------------ DistributedOptimizer

GLOBAL_BATCH = 24  # divisible by 1, 2, 3 and 4


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(GLOBAL_BATCH, 8, generator=g), torch.randn(GLOBAL_BATCH, 4, generator=g)


def shard(t):
    r, n = rank_size()
    per = GLOBAL_BATCH // n
    return t[r * per : (r + 1) * per]


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def train_reference(steps, make_opt, clip=None, micro=1):
    """One process, global batch."""
    model = make_model()
    opt = make_opt(model.parameters())
    for s in range(steps):
        x, y = batch(s)
        opt.zero_grad()
        loss_of(model, x, y).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return model


def weights(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_on_every_rank(t):
    gathered = world().allgather(t.numpy())
    return all(np.array_equal(g, gathered[0]) for g in gathered)


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def test_distributed_optimizer_matches_one_process_on_the_global_batch():
    model = make_model()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
    for s in range(4):
        x, y = batch(s)
        opt.zero_grad()
        loss_of(model, shard(x), shard(y)).backward()
        opt.step()
    ref = train_reference(4, sgd)
    w, wr = weights(model), weights(ref)
    agree(
        torch.allclose(w, wr, atol=1e-6, rtol=1e-5) and same_on_every_rank(w),
        f"max diff {(w - wr).abs().max().item()}",
    )


def test_hooks_start_every_allreduce_during_backward():
    if hvd.size() == 1:
        pytest.skip("a 1-rank optimizer reduces nothing")
    model = make_model()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
    x, y = batch(0)
    loss_of(model, shard(x), shard(y)).backward()
    submitted = len(opt._hvd_handles)
    err = raised(opt.zero_grad)
    opt.step()
    agree(
        submitted == len(list(model.parameters()))
        and isinstance(err, AssertionError)
        and "zero_grad" in str(err),
        f"{submitted} submitted during backward; zero_grad: {err!r}",
    )


def test_load_state_dict_refuses_reductions_in_flight_and_drops_those_that_failed():
    """Horovod's load_state_dict forgets in-flight handles; hvd_lite's refuses them while they are
    in flight, but takes failed ones as ended: an elastic restore after a rank's death runs
    with the dead engine's reductions still listed."""
    import time

    from hvd_lite import basics as hvd_basics

    if hvd.size() == 1:
        pytest.skip("a 1-rank optimizer reduces nothing")
    model = make_model()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
    saved = opt.state_dict()
    x, y = batch(0)
    # in flight: rank 0 submits its gradients before the others have (they wait on a barrier)
    refused = None
    if hvd.rank() == 0:
        loss_of(model, shard(x), shard(y)).backward()
        refused = raised(lambda: opt.load_state_dict(saved))
    hvd.barrier()
    if hvd.rank() != 0:
        loss_of(model, shard(x), shard(y)).backward()
    opt.step()
    agree(
        hvd.rank() != 0 or (isinstance(refused, AssertionError) and "in flight" in str(refused)),
        f"in flight: {refused!r}",
    )
    # failed: rank 0's negotiation fails, which fails the engine, and the reductions, on every
    # rank (as a rank's death does); a later gradient's hook may raise the engine's error
    opt.zero_grad()
    if hvd.rank() == 0:
        hvd_basics.inject_fault("negotiate", 1)
    raised(lambda: loss_of(model, shard(x), shard(y)).backward())
    deadline = time.monotonic() + 60
    while not all(hvd.poll(h[0]) for h in opt._hvd_handles.values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    failed = [raised(lambda h=h: hvd.synchronize(h[0])) for h in opt._hvd_handles.values()]
    err = raised(lambda: opt.load_state_dict(saved))
    hvd.shutdown()  # a new engine, as an elastic reset makes
    hvd.init()
    opt.zero_grad()
    loss_of(model, shard(x), shard(y)).backward()
    opt.step()  # and the next step works
    agree(
        any(failed) and err is None and same_on_every_rank(weights(model)),
        f"failed reductions: {failed}; load_state_dict: {err!r}",
    )


# DDP's gloo process groups, freed at exit: freed in a test, when the test's frame drops the last
# reference right after a gloo operation, ~ProcessGroupGloo (holding the GIL) waited for the mutex
# of a worker thread that was still releasing its finished work and waited for the GIL: rank 1 of
# a CI run hung there. At exit every worker is idle.
_GLOO_KEPT = []


def test_distributed_optimizer_matches_ddp():
    import torch.distributed as dist
    from mpi4py import MPI

    comm = world()
    port = None
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size
    )
    _GLOO_KEPT.append(dist.group.WORLD)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(make_model())
        _GLOO_KEPT.append(ddp)
        ddp_opt = sgd(ddp.parameters())
        model = make_model()
        opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
        for s in range(3):
            x, y = batch(s)
            for m, o in ((ddp, ddp_opt), (model, opt)):
                o.zero_grad()
                loss_of(m, shard(x), shard(y)).backward()
                o.step()
        w, wd = weights(model), weights(ddp.module)
        ok = torch.allclose(w, wd, atol=1e-6, rtol=1e-5)
    finally:
        comm.Barrier()
        dist.destroy_process_group()
    agree(ok and MPI.Is_initialized(), f"max diff {(w - wd).abs().max().item()}")


def test_backward_passes_per_step_accumulates_locally():
    model = make_model()
    opt = hvd.DistributedOptimizer(
        sgd(model.parameters()), named_parameters=model.named_parameters(), backward_passes_per_step=2
    )
    for s in range(3):
        x, y = batch(s)
        xs, ys = shard(x), shard(y)
        half = xs.shape[0] // 2
        opt.zero_grad()
        for part in (slice(0, half), slice(half, None)):
            (loss_of(model, xs[part], ys[part]) / 2).backward()
        opt.step()
    ref = train_reference(3, sgd)
    w, wr = weights(model), weights(ref)
    agree(torch.allclose(w, wr, atol=1e-6, rtol=1e-5), f"max diff {(w - wr).abs().max().item()}")


def test_backward_more_often_than_backward_passes_per_step_is_an_error():
    if hvd.size() == 1:
        pytest.skip("a 1-rank optimizer has no hooks")
    model = make_model()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
    x, y = batch(0)
    loss_of(model, shard(x), shard(y)).backward()
    err = raised(lambda: loss_of(model, shard(x), shard(y)).backward())
    opt.synchronize()
    agree(isinstance(err, AssertionError) and "backward_passes_per_step" in str(err), repr(err))


def test_clipping_between_synchronize_and_step():
    model = make_model()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
    for s in range(3):
        x, y = batch(s)
        opt.zero_grad()
        loss_of(model, shard(x), shard(y)).backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        with opt.skip_synchronize():
            opt.step()
    ref = train_reference(3, sgd, clip=0.05)
    w, wr = weights(model), weights(ref)
    agree(torch.allclose(w, wr, atol=1e-6, rtol=1e-5), f"max diff {(w - wr).abs().max().item()}")


def test_fp16_compression_stays_close_to_one_process():
    model = make_model()
    opt = hvd.DistributedOptimizer(
        sgd(model.parameters()), named_parameters=model.named_parameters(), compression=hvd.Compression.fp16
    )
    for s in range(3):
        x, y = batch(s)
        opt.zero_grad()
        loss_of(model, shard(x), shard(y)).backward()
        opt.step()
    ref = train_reference(3, sgd)
    w, wr = weights(model), weights(ref)
    grads_fp32 = all(p.grad.dtype == torch.float32 for p in model.parameters())
    agree(
        grads_fp32 and torch.allclose(w, wr, atol=2e-3) and same_on_every_rank(w),
        f"max diff {(w - wr).abs().max().item()}",
    )


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(8, 4)
        self.extra = torch.nn.Linear(4, 4)

    def forward(self, x, use_extra):
        h = self.body(x)
        return self.extra(h) if use_extra else h


def test_a_parameter_used_on_only_one_rank_gets_the_average_everywhere():
    r, n = rank_size()
    model = TwoHeads()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5), named_parameters=model.named_parameters()
    )
    x, y = batch(0)
    loss_of(lambda v: model(v, r == 0), shard(x), shard(y)).backward()
    opt.synchronize()
    # rank 0's gradient for `extra`, divided by the number of ranks
    ref = TwoHeads()
    x0, y0 = x[: GLOBAL_BATCH // n], y[: GLOBAL_BATCH // n]
    loss_of(lambda v: ref(v, True), x0, y0).backward()
    want = ref.extra.weight.grad / n
    got = model.extra.weight.grad
    with opt.skip_synchronize():
        opt.step()
    agree(
        got is not None and torch.allclose(got, want, atol=1e-7) and same_on_every_rank(weights(model)),
        f"{got} vs {want}",
    )


def test_named_parameters_duplicate_or_missing_names_are_value_errors():
    model = make_model()
    named = list(model.named_parameters())
    raises_on_every_rank(
        ValueError,
        "duplicate names: 0.weight",
        lambda: hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=named + named[:1]),
    )
    raises_on_every_rank(
        ValueError,
        "does not name 1",
        lambda: hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=named[1:]),
    )


def test_named_parameters_the_engine_cannot_take_are_value_errors_at_once():
    """A name with a NUL, or one whose allreduce name is over the limit, is refused when the
    optimizer is built, not in a backward hook."""
    model = make_model()
    named = list(model.named_parameters())
    for bad, match in (("a\0x", "contains a NUL character"), ("w" * 500, "the limit is 511")):
        renamed = [(bad, named[0][1])] + named[1:]
        raises_on_every_rank(
            ValueError,
            match,
            lambda: hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=renamed),
        )


@pytest.mark.mpi(min_size=2)
def test_tensor_names_that_differ_after_a_nul_are_refused_by_every_call():
    name = "a\0x" if hvd.rank() == 0 else "a\0y"
    t = torch.ones(2)
    for call in (
        lambda: hvd.allreduce(t, name=name),
        lambda: hvd.allreduce_(t, name=name),
        lambda: hvd.grouped_allreduce([t], name=name),
        lambda: hvd.allgather(t, name=name),
        lambda: hvd.broadcast_(t, 0, name=name),
        lambda: hvd.alltoall(t, name=name),
        lambda: hvd.reducescatter(t, name=name),
        lambda: hvd.broadcast_object(1, 0, name=name),
    ):
        raises_before_submitting(ValueError, "contains a NUL character", call)


class SignSGD(torch.optim.Optimizer):
    """A custom optimizer: steps by the sign of the gradient."""

    def __init__(self, params, lr=0.01):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-group["lr"])


@pytest.mark.parametrize(
    "make_opt",
    [lambda ps: SignSGD(ps, lr=0.01), lambda ps: torch.optim.Adam(ps, lr=0.01)],
    ids=["custom", "adam"],
)
def test_custom_and_adam_optimizers_match_one_process(make_opt):
    model = make_model()
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()), named_parameters=model.named_parameters())
    for s in range(3):
        x, y = batch(s)
        opt.zero_grad()
        loss_of(model, shard(x), shard(y)).backward()
        opt.step()
    ref = train_reference(3, make_opt)
    w, wr = weights(model), weights(ref)
    agree(
        type(opt).__name__ == type(make_opt(make_model().parameters())).__name__
        and torch.allclose(w, wr, atol=1e-5, rtol=1e-4)
        and same_on_every_rank(w),
        f"max diff {(w - wr).abs().max().item()}",
    )


def test_wrapped_optimizer_keeps_class_state_dict_and_lr_scheduler():
    model = make_model()
    base = torch.optim.AdamW(model.parameters(), lr=0.01)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for s in range(2):
        x, y = batch(s)
        opt.zero_grad()
        loss_of(model, shard(x), shard(y)).backward()
        opt.step()
        sched.step()
    sd = opt.state_dict()
    fresh = hvd.DistributedOptimizer(torch.optim.AdamW(make_model().parameters(), lr=0.01))
    fresh.load_state_dict(sd)
    ok = (
        isinstance(opt, torch.optim.AdamW)
        and type(opt).__name__ == "AdamW"
        and opt.param_groups is base.param_groups
        and opt.state is base.state
        and abs(opt.param_groups[0]["lr"] - 0.0025) < 1e-12
        and len(sd["state"]) == 4
        and torch.equal(fresh.state_dict()["state"][0]["exp_avg"], sd["state"][0]["exp_avg"])
    )
    agree(ok, f"lr {opt.param_groups[0]['lr']}, state {len(sd['state'])}")


def test_groups_and_gradient_predivide_factor_give_the_same_result():
    model = make_model()
    opt = hvd.DistributedOptimizer(
        sgd(model.parameters()),
        named_parameters=model.named_parameters(),
        groups=2,
        gradient_predivide_factor=2.0,
    )
    for s in range(2):
        x, y = batch(s)
        opt.zero_grad()
        loss_of(model, shard(x), shard(y)).backward()
        opt.step()
    ref = train_reference(2, sgd)
    w, wr = weights(model), weights(ref)
    agree(torch.allclose(w, wr, atol=1e-6, rtol=1e-5), f"max diff {(w - wr).abs().max().item()}")


# ------------------------------------------------------------------ state


@pytest.mark.parametrize("bad", ["not-a-tensor", "not-contiguous"])
def test_broadcast_parameters_with_a_bad_later_tensor_raises_everywhere_and_sends_nothing(bad):
    r, n = rank_size()
    if bad == "not-a-tensor":
        exc_type, match, later = TypeError, "parameter 'z' is a ndarray, not a torch.Tensor", np.ones(2)
    else:
        exc_type, match, later = ValueError, "not contiguous", torch.ones(4, 4).t()
    a = torch.full((2,), float(r))
    raises_before_submitting(
        exc_type, match, lambda: hvd.broadcast_parameters([("a", a), ("z", later)], root_rank=0)
    )
    agree(torch.equal(a, torch.full((2,), float(r))), f"'a' changed: {a}")
    hvd.broadcast_parameters([("a", a)], root_rank=0)
    agree(torch.equal(a, torch.zeros(2)), f"after the refused call: {a}")


def test_broadcast_parameters_from_a_state_dict():
    r, n = rank_size()
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(r)
    model[1].num_batches_tracked.fill_(10 + r)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    ok = all(torch.all(p == 0).item() for p in model.parameters())
    agree(ok and model[1].num_batches_tracked.item() == 10, str(list(model.parameters())))


@pytest.mark.parametrize("kind", ["sgd_momentum", "adam"])
def test_broadcast_optimizer_state(kind):
    r, n = rank_size()
    model = make_model()
    if kind == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1), betas=(0.9 - 0.1 * r, 0.99))
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9)
    if r == 0:  # only the root has taken steps: the others' state is empty
        for s in range(2):
            x, y = batch(s)
            opt.zero_grad()
            loss_of(model, x, y).backward()
            opt.step()
    before = weights(model).clone()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    sd = opt.state_dict()
    key = "exp_avg_sq" if kind == "adam" else "momentum_buffer"
    flat = torch.cat([sd["state"][i][key].reshape(-1) for i in range(4)])
    group = {k: v for k, v in sd["param_groups"][0].items() if k != "params"}
    groups = hvd.allgather_object(group)
    ok = (
        len(sd["state"]) == 4
        and same_on_every_rank(flat)
        and all(g == groups[0] for g in groups)
        and torch.equal(before, weights(model))
    )
    if kind == "adam":
        ok = ok and group["betas"] == (0.9, 0.99) and float(sd["state"][0]["step"]) == 2.0
    agree(ok, f"{group}")


@pytest.mark.mpi(min_size=2)
def test_broadcast_optimizer_state_to_a_rank_with_other_parameter_groups_raises_there_only():
    """The last rank's optimizer has one parameter group more than the root's: it raises
    ValueError after taking part in the broadcasts, so no other rank is left waiting for it."""
    r, n = rank_size()
    model = make_model()
    params = list(model.parameters())
    groups = [{"params": params[:2]}, {"params": params[2:]}] if r == n - 1 else [{"params": params}]
    opt = torch.optim.SGD(groups, lr=0.1, momentum=0.9)
    x, y = batch(0)
    opt.zero_grad()
    loss_of(model, x, y).backward()
    opt.step()
    err = raised(lambda: hvd.broadcast_optimizer_state(opt, root_rank=0))
    after = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="t.after.optimizer_state")
    if r == n - 1:
        ok = isinstance(err, ValueError) and "parameter groups of sizes [2, 2]" in str(err)
    else:
        ok = err is None
    agree(ok and after.item() == n, f"{err!r}, then {after}")


def test_broadcast_and_allgather_object():
    r, n = rank_size()
    obj = hvd.broadcast_object({"epoch": 3, "rank": r}, root_rank=0)
    objs = hvd.allgather_object(("rank", r))
    agree(obj == {"epoch": 3, "rank": 0} and objs == [("rank", q) for q in range(n)], f"{obj} {objs}")
