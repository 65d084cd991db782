"""hvd_lite.torch against horovod.torch 0.28.1's contract, at 1-4 ranks: its public names and
signatures (a table written from Horovod's source), the gradients of every collective (by finite
differences where Horovod's gradient is the derivative of the ranks' summed loss, by Horovod's
formula where it defines another), the exception types its users catch, the barrier beside a
pending collective, and DistributedOptimizer's attributes, names, warnings and sparse gradients.

Process sets are here only as names and signatures (every call takes process_set=, defaulting to
global_process_set); what they do is tested in test_process_sets.py and test_torch.py."""

import inspect
import time
import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[torch]')")

from conftest import agree, raised, raises_on_every_rank  # noqa: E402

import hvd_lite  # noqa: E402
import hvd_lite.torch as hvd  # noqa: E402

pytestmark = pytest.mark.mpi

# horovod.torch's public names (horovod/torch/__init__.py, v0.28.1).
HOROVOD_NAMES = """
elastic Compression allgather_object broadcast_object broadcast_optimizer_state broadcast_parameters
allreduce allreduce_async allreduce_ allreduce_async_ grouped_allreduce grouped_allreduce_async
grouped_allreduce_ grouped_allreduce_async_ sparse_allreduce_async allgather allgather_async
grouped_allgather grouped_allgather_async broadcast broadcast_async broadcast_ broadcast_async_
alltoall alltoall_async reducescatter reducescatter_async grouped_reducescatter
grouped_reducescatter_async join barrier poll synchronize init shutdown is_initialized
start_timeline stop_timeline size local_size cross_size rank local_rank cross_rank
mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built ddl_built ccl_built
cuda_built rocm_built Average Sum Adasum Min Max Product HorovodInternalError DistributedOptimizer
SyncBatchNorm ProcessSet global_process_set add_process_set remove_process_set
""".split()

# Their parameters, in order, with defaults.
PS = "process_set=global_process_set"
HOROVOD_SIGNATURES = {
    "allreduce": f"tensor, average=None, name=None, compression=Compression.none, op=None, "
    f"prescale_factor=1.0, postscale_factor=1.0, {PS}",
    "allreduce_async": f"tensor, average=None, name=None, op=None, prescale_factor=1.0, "
    f"postscale_factor=1.0, {PS}",
    "allreduce_": f"tensor, average=None, name=None, op=None, prescale_factor=1.0, "
    f"postscale_factor=1.0, {PS}",
    "allreduce_async_": f"tensor, average=None, name=None, op=None, prescale_factor=1.0, "
    f"postscale_factor=1.0, {PS}",
    "grouped_allreduce": f"tensors, average=None, name=None, compression=Compression.none, "
    f"op=None, prescale_factor=1.0, postscale_factor=1.0, {PS}",
    "grouped_allreduce_async": f"tensors, average=None, name=None, op=None, prescale_factor=1.0, "
    f"postscale_factor=1.0, {PS}",
    "grouped_allreduce_": f"tensors, average=None, name=None, op=None, prescale_factor=1.0, "
    f"postscale_factor=1.0, {PS}",
    "grouped_allreduce_async_": f"tensors, average=None, name=None, op=None, "
    f"prescale_factor=1.0, postscale_factor=1.0, {PS}",
    "sparse_allreduce_async": f"tensor, name, op, {PS}",
    "allgather": f"tensor, name=None, {PS}",
    "allgather_async": f"tensor, name=None, {PS}",
    "grouped_allgather": f"tensors, name=None, {PS}",
    "grouped_allgather_async": f"tensors, name=None, {PS}",
    "broadcast": f"tensor, root_rank, name=None, {PS}",
    "broadcast_async": f"tensor, root_rank, name=None, {PS}",
    "broadcast_": f"tensor, root_rank, name=None, {PS}",
    "broadcast_async_": f"tensor, root_rank, name=None, {PS}",
    "alltoall": f"tensor, splits=None, name=None, {PS}",
    "alltoall_async": f"tensor, splits=None, name=None, {PS}",
    "reducescatter": f"tensor, name=None, compression=Compression.none, op=Average, {PS}, "
    "prescale_factor=1.0, postscale_factor=1.0",
    "reducescatter_async": f"tensor, name=None, op=Average, {PS}, prescale_factor=1.0, postscale_factor=1.0",
    "grouped_reducescatter": f"tensors, name=None, compression=Compression.none, op=Average, "
    f"{PS}, prescale_factor=1.0, postscale_factor=1.0",
    "grouped_reducescatter_async": f"tensors, name=None, op=Average, {PS}, prescale_factor=1.0, "
    "postscale_factor=1.0",
    "poll": "handle",
    "synchronize": "handle",
    "join": "device=-1",
    "barrier": PS,
    "broadcast_parameters": "params, root_rank",
    "broadcast_optimizer_state": "optimizer, root_rank, model=None",
    "broadcast_object": f"obj, root_rank=0, name=None, {PS}",
    "allgather_object": "obj, name=None",
    "DistributedOptimizer": "optimizer, named_parameters=None, compression=Compression.none, "
    "backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0, "
    f"num_groups=0, groups=None, sparse_as_dense=False, {PS}",
}
NO_DEFAULT = object()


def parsed(signature: str):
    """[(name, default)] of a signature written as above (defaults evaluated in hvd)."""
    out = []
    for part in signature.split(", "):
        name, _, default = part.partition("=")
        if not default:
            value = NO_DEFAULT
        elif default == "global_process_set":
            value = "global_process_set"
        else:
            value = eval(default, {"Compression": hvd.Compression, "Average": hvd.Average})  # noqa: S307
        out.append((name, value))
    return out


def rank_size():
    return hvd.rank(), hvd.size()


# ------------------------------------------------------------------ names and signatures


def test_every_horovod_torch_name_exists():
    missing = [n for n in HOROVOD_NAMES if not hasattr(hvd, n)]
    agree(not missing, f"missing: {missing}")


@pytest.mark.parametrize("fn", sorted(HOROVOD_SIGNATURES))
def test_each_parameter_keeps_horovods_position_and_default(fn):
    ours = list(inspect.signature(getattr(hvd, fn)).parameters.values())
    problems = []
    for i, (name, default) in enumerate(parsed(HOROVOD_SIGNATURES[fn])):
        if i >= len(ours) or ours[i].name != name:
            problems.append(
                f"parameter {i} is {ours[i].name if i < len(ours) else None!r}, Horovod's {name!r}"
            )
            continue
        ours_default = ours[i].default
        if default == "global_process_set":
            if ours_default is not hvd.global_process_set:
                problems.append(f"{name}: default {ours_default!r}, Horovod's global_process_set")
            continue
        if default is NO_DEFAULT:
            continue  # a default where Horovod has none is an extension
        if ours_default is inspect.Parameter.empty or ours_default != default:
            problems.append(f"{name}: default {ours_default!r}, Horovod's {default!r}")
    agree(not problems, f"{fn}: {problems}")


def test_every_call_but_join_takes_process_set_defaulting_to_the_global_set():
    # Horovod's state helpers broadcast_parameters, broadcast_optimizer_state and
    # allgather_object lack it; here they take it too, last
    calls = sorted(set(HOROVOD_SIGNATURES) - {"poll", "synchronize", "join"})
    missing = [
        fn
        for fn in calls
        if inspect.signature(getattr(hvd, fn)).parameters.get("process_set") is None
        or inspect.signature(getattr(hvd, fn)).parameters["process_set"].default is not hvd.global_process_set
    ]
    agree(not missing, f"without process_set=global_process_set: {missing}")


def test_reduce_ops_have_horovods_numbers():
    agree((hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5))


def test_build_queries_say_mpi_on_the_host():
    agree(
        hvd.mpi_built()
        and hvd.mpi_enabled()
        and not hvd.gloo_built()
        and not hvd.gloo_enabled()
        and hvd.nccl_built() == 0
        and hvd.cuda_built() is bool(hvd_lite.build_info()["cuda"])
        and not hvd.rocm_built()
        and not hvd.ddl_built()
        and not hvd.ccl_built()
    )


def test_is_homogeneous_is_true_on_one_host():
    agree(hvd.is_homogeneous() is True)


@pytest.mark.parametrize(
    "call",
    [
        lambda: hvd.start_timeline("/tmp/timeline.json"),
        lambda: hvd.stop_timeline(),
    ],
    ids=[
        "start_timeline",
        "stop_timeline",
    ],
)
def test_what_hvd_lite_does_not_implement_raises_not_implemented(call):
    raises_on_every_rank(NotImplementedError, "hvd_lite", call)


def test_adasum_is_taken_by_allreduce_and_the_optimizer_and_refused_by_reducescatter():
    """Horovod's op=Adasum works (tests/parallel/test_adasum_torch.py checks its values): the same
    vector on every rank comes back as itself, and the optimizer keeps the wrapped class's name;
    reducescatter, which Adasum does not apply to, raises ValueError."""
    got = hvd.allreduce(torch.ones(2), op=hvd.Adasum)
    opt = hvd.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1), op=hvd.Adasum)
    agree(torch.equal(got, torch.ones(2)) and type(opt).__name__ == "SGD", f"{got}, {type(opt)}")
    raises_on_every_rank(
        ValueError, "Adasum", lambda: hvd.reducescatter(torch.ones(4 * hvd.size()), op=hvd.Adasum)
    )


# ------------------------------------------------------------------ gradients


def global_loss(local: torch.Tensor) -> float:
    """The sum of every rank's loss."""
    return float(hvd.allreduce(local.detach().reshape(1).double(), op=hvd.Sum, name=None))


def finite_difference_matches(forward, x: torch.Tensor, weight_of) -> None:
    """forward(x) -> output, with loss = sum(output * weight_of(output)) on each rank and the
    ranks' losses summed: x.grad from backward must equal (L(x + e_i) - L(x)) for each element
    i of each rank's x (the collectives are linear, so a step of 1 is exact)."""
    r, n = rank_size()
    x = x.double().requires_grad_()
    out = forward(x)
    out = out[0] if isinstance(out, tuple) else out
    (out * weight_of(out)).sum().backward()
    base = global_loss((out * weight_of(out)).sum())
    sizes = [int(s) for s in hvd.allgather_object(x.numel())]
    problems = []
    for q in range(n):
        for i in range(sizes[q]):
            xp = x.detach().clone()
            if q == r:
                xp.view(-1)[i] += 1.0
            o = forward(xp)
            o = o[0] if isinstance(o, tuple) else o
            diff = global_loss((o * weight_of(o)).sum()) - base
            if q == r and abs(diff - float(x.grad.view(-1)[i])) > 1e-9:
                problems.append(f"element {i}: grad {float(x.grad.view(-1)[i])}, difference {diff}")
    agree(not problems, str(problems[:5]))


def weights(out: torch.Tensor) -> torch.Tensor:
    """Distinct weights per element and per rank."""
    return (torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape) + 1) * (hvd.rank() + 2)


def test_allreduce_sum_gradient_is_the_derivative_of_the_summed_loss():
    r, _ = rank_size()
    finite_difference_matches(lambda x: hvd.allreduce(x, op=hvd.Sum), torch.ones(3) * r, weights)


def test_grouped_allreduce_sum_gradient_is_the_derivative_of_the_summed_loss():
    finite_difference_matches(
        lambda x: hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum)[1], torch.ones(2, 2), weights
    )


def test_alltoall_gradient_is_the_derivative_of_the_summed_loss():
    r, n = rank_size()
    splits = [(r + q) % 2 + 1 for q in range(n)]
    finite_difference_matches(
        lambda x: hvd.alltoall(x, splits=torch.tensor(splits, dtype=torch.int32)),
        torch.arange(sum(splits) * 2.0).reshape(-1, 2),
        weights,
    )


def test_alltoall_without_splits_gradient_is_the_derivative_of_the_summed_loss():
    _, n = rank_size()
    finite_difference_matches(lambda x: hvd.alltoall(x), torch.ones(2 * n, 1), weights)


def test_reducescatter_average_gradient_is_the_allgather_of_the_output_gradients():
    """Horovod's definition: allgather(g) (the derivative of the summed loss is allgather(g)/size)."""
    r, n = rank_size()
    x = torch.ones(2 * n, 3, dtype=torch.float64, requires_grad=True)
    out = hvd.reducescatter(x, op=hvd.Average, prescale_factor=2.0, postscale_factor=0.5)
    out.backward(torch.full_like(out, float(r + 1)))
    want = torch.cat([torch.full((2, 3), float(q + 1)) for q in range(n)]).double()
    agree(torch.allclose(x.grad, want), f"{x.grad} vs {want}")


@pytest.mark.parametrize("grouped", [False, True])
def test_reducescatter_sum_gradient_is_size_times_the_allgather(grouped):
    """Horovod's definition: size() * allgather(g) * prescale * postscale."""
    r, n = rank_size()
    x = torch.ones(n, 2, dtype=torch.float64, requires_grad=True)
    if grouped:
        out = hvd.grouped_reducescatter([x, x * 3], op=hvd.Sum, postscale_factor=2.0)
        torch.autograd.backward(out, [torch.full_like(o, float(r + 1)) for o in out])
        scale = 8.0  # size() * postscale 2, through x and through 3x: 2 * (1 + 3)
    else:
        out = hvd.reducescatter(x, op=hvd.Sum, postscale_factor=2.0)
        out.backward(torch.full_like(out, float(r + 1)))
        scale = 2.0
    want = torch.cat([torch.full((1, 2), scale * n * (q + 1)) for q in range(n)]).double()
    agree(torch.allclose(x.grad, want), f"{x.grad} vs {want}")


@pytest.mark.parametrize("grouped", [False, True])
def test_allgather_gradient_is_this_ranks_rows_of_the_average_of_the_gradients(grouped):
    """Horovod's definition (the derivative of the summed loss would be the sum)."""
    r, n = rank_size()
    x = torch.ones(r + 1, 2, dtype=torch.float64, requires_grad=True)
    out = hvd.grouped_allgather([x])[0] if grouped else hvd.allgather(x)
    w = torch.arange(out.shape[0], dtype=torch.float64).unsqueeze(1) * (r + 1)
    (out * w).sum().backward()
    start = sum(q + 1 for q in range(r))
    rows = torch.arange(start, start + r + 1, dtype=torch.float64).unsqueeze(1)
    want = (rows * (n + 1) / 2).expand(r + 1, 2)
    agree(torch.allclose(x.grad, want), f"{x.grad} vs {want}")


@pytest.mark.parametrize("root", [0, -1])
def test_broadcast_gradient_is_the_average_at_the_root_and_zero_elsewhere(root):
    r, n = rank_size()
    root = root % n
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    hvd.broadcast(x, root).backward(torch.ones(3, dtype=torch.float64))  # Horovod's test: 1 on root
    want = 1.0 if r == root else 0.0
    agree(torch.allclose(x.grad, torch.full((3,), want, dtype=torch.float64)), str(x.grad))


def test_sync_batch_norm_matches_batch_norm_over_the_global_batch():
    r, n = rank_size()
    g = torch.Generator().manual_seed(7)
    full = torch.randn(4 * n, 3, 5, generator=g, dtype=torch.float64)
    upstream = torch.randn(4 * n, 3, 5, generator=g, dtype=torch.float64)
    ref = torch.nn.BatchNorm1d(3).double()
    sync = hvd.SyncBatchNorm(3).double()
    xr = full.clone().requires_grad_()
    ref_out = ref(xr)
    (ref_out * upstream).sum().backward()
    xs = full[4 * r : 4 * r + 4].clone().requires_grad_()
    out = sync(xs)
    (out * upstream[4 * r : 4 * r + 4]).sum().backward()
    # the parameters' gradients are each rank's share (DistributedOptimizer reduces them)
    weight_grad = hvd.allreduce(sync.weight.grad, op=hvd.Sum)
    agree(
        torch.allclose(out, ref_out[4 * r : 4 * r + 4], atol=1e-10)
        and torch.allclose(xs.grad, xr.grad[4 * r : 4 * r + 4], atol=1e-10)
        and torch.allclose(sync.running_mean, ref.running_mean)
        and torch.allclose(sync.running_var, ref.running_var)
        and torch.allclose(weight_grad, ref.weight.grad, atol=1e-9),
        f"{out} / {xs.grad}",
    )


# ------------------------------------------------------------------ exception types


def test_a_duplicate_name_in_flight_is_a_value_error():
    r, n = rank_size()
    if n == 1:  # nobody holds the first submission back: it may complete before the second
        pytest.skip("needs 2 ranks (as Horovod's test)")
    x = torch.ones(3)
    errs = []
    for q in range(n):  # rank q submits first (the others wait in the barrier), then again
        name = f"conf.dup.{q}"
        h = hvd.allreduce_async(x, name=name) if r == q else None
        if r == q:
            errs.append(raised(lambda: hvd.allreduce_async(x, name=name)))
        hvd.barrier()
        if r != q:
            h = hvd.allreduce_async(x, name=name)
        hvd.synchronize(h)
    agree(len(errs) == 1 and isinstance(errs[0], ValueError), repr(errs))


def test_mismatched_shapes_are_value_and_runtime_errors_on_every_rank():
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs 2 ranks")
    err = raised(lambda: hvd.allreduce(torch.zeros(r + 1), name="conf.mismatch"))
    agree(
        isinstance(err, ValueError)
        and isinstance(err, RuntimeError)
        and isinstance(err, hvd.HorovodInternalError),
        repr(err),
    )


def test_splits_that_do_not_match_one_ranks_tensor_are_a_value_error_on_every_rank():
    r, n = rank_size()
    rows = n + (1 if r == n - 1 else 0)  # only the last rank's splits do not sum to its rows
    raises_on_every_rank(
        ValueError, "splits", lambda: hvd.alltoall(torch.ones(rows), splits=[1] * n, name="conf.splits")
    )


def test_alltoall_without_splits_needs_dim_0_divisible_by_size_on_every_rank():
    r, n = rank_size()
    if n == 1:
        pytest.skip("every length divides by 1")
    rows = n + (1 if r == 0 else 0)  # only rank 0's does not divide
    raises_on_every_rank(ValueError, "divisible", lambda: hvd.alltoall(torch.ones(rows)))
    out = hvd.alltoall(torch.ones(n))  # and the next one works
    agree(out.shape == (n,), str(out))


def test_alltoall_splits_must_hold_integers():
    _, n = rank_size()
    raises_on_every_rank(
        ValueError, "integers", lambda: hvd.alltoall(torch.ones(n), torch.ones(n, dtype=torch.float32))
    )


def test_reducescatter_of_a_scalar_is_an_error_on_every_rank():
    raises_on_every_rank(ValueError, "at least one dimension", lambda: hvd.reducescatter(torch.tensor(1.0)))


def test_average_and_op_together_are_a_value_error():
    raises_on_every_rank(
        ValueError, "supersedes", lambda: hvd.allreduce(torch.ones(1), average=True, op=hvd.Sum)
    )


# ------------------------------------------------------------------ barrier


def test_barrier_completes_while_one_rank_has_an_unrelated_collective_pending():
    """Horovod's duplicate-name pattern: rank 0 submits N, barrier, the others submit N."""
    r, n = rank_size()
    x = torch.ones(5)
    start = time.perf_counter()
    h = hvd.allreduce_async(x, name="conf.before.barrier", op=hvd.Sum) if r == 0 else None
    hvd.barrier()
    waited = time.perf_counter() - start
    if r > 0:
        h = hvd.allreduce_async(x, name="conf.before.barrier", op=hvd.Sum)
    hvd.barrier()
    out = hvd.synchronize(h)
    agree(waited < 5.0 and torch.equal(out, torch.full((5,), float(n))), f"{waited:.2f} s, {out}")


# ------------------------------------------------------------------ DistributedOptimizer


def make_opt(**kwargs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.SGD([{"params": model[0].parameters()}, {"params": model[1].parameters()}], lr=0.1)
    return model, hvd.DistributedOptimizer(opt, **kwargs)


def test_unnamed_parameters_get_horovods_automatic_names():
    _, opt = make_opt()
    names = sorted(opt._parameter_names.values())
    agree(
        names
        == ["allreduce.noname.0.0", "allreduce.noname.0.1", "allreduce.noname.1.0", "allreduce.noname.1.1"],
        str(names),
    )


def test_optimizer_has_horovods_attributes():
    _, opt = make_opt(backward_passes_per_step=2, gradient_predivide_factor=2.0)
    opt.set_backward_passes_per_step(3)
    agree(
        opt.backward_passes_per_step == 3
        and opt.op == hvd.Average
        and opt.gradient_predivide_factor == 2.0
        and opt.sparse_as_dense is False
        and callable(opt.skip_synchronize)
        and callable(opt.synchronize)
    )


def test_step_after_synchronize_warns_with_horovods_text():
    r, _ = rank_size()
    model, opt = make_opt()
    model(torch.ones(2, 3) * r).sum().backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        opt.step()
    texts = [str(w.message) for w in ws]
    agree(any("optimizer.step() called without optimizer.skip_synchronize()" in t for t in texts), str(texts))


def test_num_groups_is_a_deprecated_groups():
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        _, opt = make_opt(num_groups=2)
    agree(any(issubclass(w.category, DeprecationWarning) for w in ws) and len(opt._hvd_groups) == 2)


@pytest.mark.parametrize(
    "bad",
    [dict(backward_passes_per_step=0), dict(groups=[[1.0]]), dict(op=hvd.Max, gradient_predivide_factor=2.0)],
    ids=["passes", "groups", "predivide"],
)
def test_bad_optimizer_arguments_are_value_errors(bad):
    raises_on_every_rank(ValueError, ".", lambda: make_opt(**bad))


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_gradients_are_averaged_like_dense_ones(sparse_as_dense):
    r, n = rank_size()
    torch.manual_seed(1)
    emb = torch.nn.Embedding(6, 2, sparse=True)
    dense = torch.nn.Embedding(6, 2)
    dense.weight.data.copy_(emb.weight.data)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(emb.parameters(), lr=1.0),
        named_parameters=emb.named_parameters(),
        sparse_as_dense=sparse_as_dense,
    )
    idx = torch.tensor([r % 6, (2 * r + 1) % 6, 5])
    (emb(idx) * (r + 1)).sum().backward()
    opt.step()
    ref = torch.optim.SGD(dense.parameters(), lr=1.0)
    for q in range(n):  # the average of every rank's gradient, in one process
        qidx = torch.tensor([q % 6, (2 * q + 1) % 6, 5])
        (dense(qidx) * (q + 1) / n).sum().backward()
    ref.step()
    agree(
        emb.weight.grad.is_sparse and torch.allclose(emb.weight, dense.weight, atol=1e-6),
        f"{emb.weight} vs {dense.weight}",
    )


def test_broadcast_optimizer_state_gives_parameters_without_gradients_zeros():
    a = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
    b = torch.nn.Parameter(torch.ones(4))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD([a, b], lr=0.01, momentum=0.9), named_parameters=[("a", a), ("b", b)]
    )
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    agree(a.grad is None and b.grad is not None and torch.equal(b.grad, torch.zeros(4)))
