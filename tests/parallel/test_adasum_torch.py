"""hvd_lite.torch's op=Adasum at 1-4 ranks: the allreduce against the float64 reference over the
core's tree (tests/helpers.py, from the paper's formula), identical bytes on every rank, grouped
calls (each tensor its own norms), a process set, what is refused before anything is sent, and
DistributedOptimizer's delta optimizer against one process that applies the same formula to every
rank's local update."""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[torch]')")

from conftest import agree, raises_before_submitting, raises_on_every_rank, world  # noqa: E402
from helpers import adasum_reference, adasum_tree  # noqa: E402

import hvd_lite.torch as hvd  # noqa: E402

pytestmark = pytest.mark.mpi

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# |got - reference| <= TOL * max|reference|: a few roundings to the dtype per level of the tree
TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 2e-6, torch.float64: 1e-13}


def as64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).reshape(-1).numpy()


def gathered(t: torch.Tensor) -> list:
    """Every rank's tensor (as float64 numpy), in rank order."""
    return world().allgather(as64(t))


def local(count: int, dtype, seed: int = 0, rank=None) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + (hvd.rank() if rank is None else rank))
    return (torch.rand(count, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)


def close_to(got: torch.Tensor, want: np.ndarray, dtype) -> tuple:
    err = float(np.max(np.abs(as64(got) - want), initial=0.0))
    scale = float(np.max(np.abs(want), initial=0.0))
    return err <= TOL[dtype] * max(scale, 1e-30), f"max error {err:.3g} against max |value| {scale:.3g}"


def same_bytes_everywhere(t: torch.Tensor) -> tuple:
    mine = t.detach().contiguous().view(torch.uint8).numpy().tobytes()
    every = world().allgather(mine)
    return all(b == every[0] for b in every), "the result's bytes differ between ranks"


# ------------------------------------------------------------------ the allreduce


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_orthogonal_vectors_add_up(dtype):
    """a.b = 0: both coefficients are 1, so Adasum is the sum (not the average)."""
    r, n = hvd.rank(), hvd.size()
    x = torch.zeros(2 * n, dtype=dtype)
    x[2 * r], x[2 * r + 1] = r + 1, -(r + 1)
    got = hvd.allreduce(x, op=hvd.Adasum)
    want = torch.tensor([v for k in range(n) for v in (k + 1, -(k + 1))], dtype=dtype)
    agree(torch.equal(got, want), f"{got} != {want}")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_identical_vectors_give_themselves_back(dtype):
    """a = b: both coefficients are 1/2."""
    x = local(37, dtype, seed=3, rank=0)
    got = hvd.allreduce(x, op=hvd.Adasum)
    agree(*close_to(got, as64(x), dtype))


@pytest.mark.parametrize("count", [1, 7, 1000, 40000])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_random_vectors_match_the_reference_with_identical_bytes_on_every_rank(dtype, count):
    x = local(count, dtype, seed=count)
    got = hvd.allreduce(x, op=hvd.Adasum, name=f"adasum.random.{dtype}.{count}")
    want = adasum_tree(gathered(x))
    ok, detail = close_to(got, want, dtype)
    same, why = same_bytes_everywhere(got)
    agree(ok and same and got.dtype == dtype and got.shape == x.shape, f"{detail}; {why if not same else ''}")


@pytest.mark.parametrize("call", ["allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce"])
def test_every_allreduce_form_gives_the_same_bytes_as_allreduce(call):
    x = local(300, torch.float32, seed=5).reshape(3, 100)
    want = hvd.allreduce(x, op=hvd.Adasum)
    t = x.clone()
    if call == "allreduce_":
        got = hvd.allreduce_(t, op=hvd.Adasum)
    elif call == "allreduce_async":
        got = hvd.synchronize(hvd.allreduce_async(t, op=hvd.Adasum))
    elif call == "allreduce_async_":
        got = hvd.synchronize(hvd.allreduce_async_(t, op=hvd.Adasum))
    else:
        got = hvd.grouped_allreduce([t], op=hvd.Adasum)[0]
    agree(torch.equal(got, want) and (got is t) == call.endswith("_"), f"{call}: {got} != {want}")


def test_a_grouped_call_keeps_each_tensors_norms_its_own():
    """Tensors of very different sizes and norms, fused by the engine: each gets the Adasum of its
    own vectors (what separate calls give), not a slice of the whole buffer's Adasum."""
    ts = [
        local(50, torch.float32, seed=7) * 100,
        local(3, torch.float32, seed=8),
        local(1000, torch.float32, 9),
    ]
    grouped = hvd.grouped_allreduce(ts, op=hvd.Adasum, name="adasum.grouped")
    alone = [hvd.allreduce(t, op=hvd.Adasum, name=f"adasum.alone.{i}") for i, t in enumerate(ts)]
    counts = [t.numel() for t in ts]
    want = adasum_reference(world().allgather(np.concatenate([as64(t) for t in ts])), counts)
    whole = adasum_tree(world().allgather(np.concatenate([as64(t) for t in ts])))
    got = np.concatenate([as64(g) for g in grouped])
    ok = np.allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())
    # where there is more than one rank, the whole buffer's Adasum differs: the check can fail
    differs = hvd.size() == 1 or not np.allclose(want, whole, rtol=0, atol=1e-3)
    agree(
        ok and differs and all(torch.equal(g, a) for g, a in zip(grouped, alone)),
        f"grouped {got[:4]} want {want[:4]}; differs from the whole buffer's: {differs}",
    )


def test_the_scale_factors_apply_and_nothing_is_divided_by_the_size():
    x = local(64, torch.float64, seed=11)
    got = hvd.allreduce(x, op=hvd.Adasum, prescale_factor=3.0, postscale_factor=0.5)
    want = 1.5 * adasum_tree(gathered(x))  # Adasum is homogeneous: Adasum(c x) = c Adasum(x)
    agree(*close_to(got, want, torch.float64))


def test_the_gradient_of_an_adasum_allreduce_is_the_adasum_of_the_gradients():
    x = local(20, torch.float64, seed=12).requires_grad_()
    g = local(20, torch.float64, seed=13)
    hvd.allreduce(x, op=hvd.Adasum, name="adasum.forward").backward(g)
    agree(*close_to(x.grad, adasum_tree(gathered(g)), torch.float64))


def test_a_process_set_reduces_over_its_ranks_only():
    n = hvd.size()
    if n == 1:
        pytest.skip("a set other than the global one needs 2 ranks or more")
    ranks = list(range(1, n)) if n > 2 else [1]
    ps = hvd.add_process_set(ranks)
    try:
        x = local(500, torch.float32, seed=14)
        every = gathered(x)
        if hvd.rank() in ranks:
            got = hvd.allreduce(x, op=hvd.Adasum, process_set=ps)
            ok, detail = close_to(got, adasum_tree([every[r] for r in ranks]), torch.float32)
        else:
            ok, detail = True, ""
        agree(ok, detail)
    finally:
        hvd.remove_process_set(ps)


def test_a_joined_rank_is_left_out():
    """A joined rank contributes zeros, which Adasum leaves out exactly."""
    n = hvd.size()
    x = local(100, torch.float32, seed=15)
    every = gathered(x)
    if hvd.rank() == n - 1:
        hvd.join()
        ok, detail = True, ""
    else:
        got = hvd.allreduce(x, op=hvd.Adasum, name="adasum.joined")
        hvd.join()
        ok, detail = close_to(got, adasum_tree(every[: n - 1] + [np.zeros(100)]), torch.float32)
    agree(ok, detail)


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool], ids=str)
@pytest.mark.parametrize("call", ["allreduce", "allreduce_", "allreduce_async", "grouped_allreduce"])
def test_adasum_of_data_that_is_not_floating_point_is_a_type_error(call, dtype):
    t = torch.ones(4, dtype=dtype)
    calls = {
        "allreduce": lambda: hvd.allreduce(t, op=hvd.Adasum),
        "allreduce_": lambda: hvd.allreduce_(t, op=hvd.Adasum),
        "allreduce_async": lambda: hvd.allreduce_async(t, op=hvd.Adasum),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([torch.ones(2), t], op=hvd.Adasum),
    }
    raises_before_submitting(TypeError, str(dtype).replace("torch.", ""), calls[call])


def test_adasum_of_a_tensor_off_the_cpu_is_a_value_error():
    """Adasum has no device form: a tensor elsewhere (a meta tensor here; a CUDA one alike) is
    refused, not copied through the host unsaid."""
    t = torch.ones(4, device="meta")
    raises_before_submitting(ValueError, "host memory", lambda: hvd.allreduce(t, op=hvd.Adasum))
    raises_before_submitting(
        ValueError, "host memory", lambda: hvd.grouped_allreduce_([torch.ones(2), t], op=hvd.Adasum)
    )


@pytest.mark.parametrize("call", ["reducescatter", "grouped_reducescatter"])
def test_reducescatter_refuses_adasum(call):
    t = torch.ones(4 * hvd.size())
    f = {
        "reducescatter": lambda: hvd.reducescatter(t, op=hvd.Adasum),
        "grouped_reducescatter": lambda: hvd.grouped_reducescatter([t], op=hvd.Adasum),
    }[call]
    raises_before_submitting(ValueError, "Adasum applies to allreduce only", f)


# ------------------------------------------------------------------ DistributedOptimizer


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).double()


def batch(step: int, rank: int, rows: int = 8):
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.rand(rows, 6, generator=g, dtype=torch.float64)
    return x, x[:, :2] * 2 - x[:, 2:4]


def loss_of(m, step, rank):
    x, y = batch(step, rank)
    return ((m(x) - y) ** 2).mean()


MAKERS = {
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.2, momentum=0.9, weight_decay=1e-3),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.05),
}


def reference_steps(make, steps: int, passes: int):
    """One process's view of the delta optimizer: every rank's local update from the shared
    weights (a plain optimizer of its own, on that rank's batches: its state follows the rank's
    own gradients), combined by the reference tree per parameter, added to the shared weights."""
    ranks = range(hvd.size())
    shared = model()
    twins = [copy.deepcopy(shared) for _ in ranks]
    opts = [make(list(t.parameters())) for t in twins]
    for step in range(steps):
        deltas = []
        for r in ranks:
            t, o = twins[r], opts[r]
            with torch.no_grad():
                for p, s in zip(t.parameters(), shared.parameters()):
                    p.copy_(s)
            o.zero_grad()
            for k in range(passes):
                loss_of(t, step * passes + k, r).backward()
            o.step()
            deltas.append(
                [(p - s).detach().numpy().reshape(-1) for p, s in zip(t.parameters(), shared.parameters())]
            )
        with torch.no_grad():
            for i, s in enumerate(shared.parameters()):
                s.add_(torch.from_numpy(adasum_tree([d[i] for d in deltas]).reshape(s.shape)))
    return shared


def train(opt, m, steps: int, passes: int):
    for step in range(steps):
        opt.zero_grad()
        for k in range(passes):
            loss_of(m, step * passes + k, hvd.rank()).backward()
        opt.step()


def weights_agree_with(m, ref, tol=1e-9) -> tuple:
    diffs = [float((p - q).detach().abs().max()) for p, q in zip(m.parameters(), ref.parameters())]
    flat = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    same, why = same_bytes_everywhere(flat)
    return max(diffs) <= tol and same, f"max differences {diffs}; {why if not same else ''}"


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_the_delta_optimizer_matches_one_process_combining_every_ranks_update(kind, passes):
    m = model()
    opt = hvd.DistributedOptimizer(
        MAKERS[kind](m.parameters()),
        named_parameters=m.named_parameters(),
        op=hvd.Adasum,
        backward_passes_per_step=passes,
    )
    train(opt, m, steps=4, passes=passes)
    agree(*weights_agree_with(m, reference_steps(MAKERS[kind], 4, passes)))


@pytest.mark.parametrize("options", ["groups", "group-lists", "unnamed", "fp16"])
def test_groups_names_and_compression_give_the_same_training(options):
    m = model()
    kwargs = {
        "groups": {"groups": 2},
        "group-lists": {"groups": [[m[0].weight, m[2].bias], [m[0].bias]]},
        "unnamed": {},
        "fp16": {"named_parameters": m.named_parameters(), "compression": hvd.Compression.fp16},
    }[options]
    opt = hvd.DistributedOptimizer(MAKERS["sgd-momentum"](m.parameters()), op=hvd.Adasum, **kwargs)
    train(opt, m, steps=3, passes=1)
    tol = 2e-3 if options == "fp16" else 1e-9  # the updates travel as float16
    agree(*weights_agree_with(m, reference_steps(MAKERS["sgd-momentum"], 3, 1), tol))


def test_step_before_every_backward_pass_steps_on_what_there_is():
    """backward_passes_per_step=3 but step() after 2 passes: the updates are made from the gradients
    of those 2 (Horovod's synchronous fallback), and the count restarts."""
    m = model()
    opt = hvd.DistributedOptimizer(MAKERS["adam"](m.parameters()), op=hvd.Adasum, backward_passes_per_step=3)
    opt.set_backward_passes_per_step(2)  # then changed back: the count follows
    opt.set_backward_passes_per_step(3)
    for step in range(2):
        opt.zero_grad()
        for k in range(2):
            loss_of(m, step * 2 + k, hvd.rank()).backward()
        opt.step()
    agree(*weights_agree_with(m, reference_steps(MAKERS["adam"], 2, 2)))


def test_a_rank_outside_the_set_steps_on_its_own():
    n = hvd.size()
    if n == 1:
        pytest.skip("a set other than the global one needs 2 ranks or more")
    ps = hvd.add_process_set(list(range(n - 1)))
    try:
        m = model()
        opt = hvd.DistributedOptimizer(MAKERS["sgd-momentum"](m.parameters()), op=hvd.Adasum, process_set=ps)
        train(opt, m, steps=2, passes=1)
        if hvd.rank() == n - 1:  # a plain optimizer on its own batches
            ref = model()
            plain = MAKERS["sgd-momentum"](ref.parameters())
            train(plain, ref, steps=2, passes=1)
            diffs = [float((p - q).detach().abs().max()) for p, q in zip(m.parameters(), ref.parameters())]
            ok, detail = max(diffs) == 0.0, f"max differences {diffs}"
        else:
            ok, detail = True, ""
        agree(ok, detail)
    finally:
        hvd.remove_process_set(ps)


def test_one_rank_steps_as_the_wrapped_optimizer():
    if hvd.size() > 1:
        pytest.skip("one rank only")
    m, ref = model(), model()
    opt = hvd.DistributedOptimizer(MAKERS["adam"](m.parameters()), op=hvd.Adasum)
    plain = MAKERS["adam"](ref.parameters())
    train(opt, m, 3, 1)
    train(plain, ref, 3, 1)
    agree(all(torch.equal(p, q) for p, q in zip(m.parameters(), ref.parameters())))


def test_synchronize_does_nothing_and_the_weights_wait_for_step():
    m = model()
    before = [p.detach().clone() for p in m.parameters()]
    opt = hvd.DistributedOptimizer(MAKERS["sgd-momentum"](m.parameters()), op=hvd.Adasum)
    loss_of(m, 0, hvd.rank()).backward()
    opt.synchronize()
    unchanged = all(torch.equal(p, b) for p, b in zip(m.parameters(), before))
    opt.step()
    moved = hvd.size() == 1 or not all(torch.equal(p, b) for p, b in zip(m.parameters(), before))
    agree(unchanged and moved, f"unchanged before step: {unchanged}, moved by step: {moved}")


def test_skip_synchronize_and_zero_grad_in_flight_are_assertion_errors():
    m = model()
    opt = hvd.DistributedOptimizer(MAKERS["sgd-momentum"](m.parameters()), op=hvd.Adasum)

    def skip():
        with opt.skip_synchronize():
            pass

    raises_on_every_rank(AssertionError, "not supported with op=Adasum", skip)
    loss_of(m, 0, hvd.rank()).backward()
    if hvd.size() > 1:  # with one rank nothing is in flight
        raises_on_every_rank(AssertionError, "before optimizer.step", opt.zero_grad)
        raises_on_every_rank(
            AssertionError, "more than backward_passes_per_step", lambda: loss_of(m, 1, hvd.rank()).backward()
        )
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"gradient_predivide_factor": 2.0}, ValueError, "op=Average only"),
        ({"named_parameters": [("a", None)]}, ValueError, "does not name"),
        ({"backward_passes_per_step": 0}, ValueError, "backward_passes_per_step"),
    ],
    ids=["predivide", "named_parameters", "passes"],
)
def test_the_averaging_optimizers_argument_checks_apply(kwargs, exc, match):
    m = model()
    raises_before_submitting(
        exc,
        match,
        lambda: hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1), op=hvd.Adasum, **kwargs),
    )


def test_a_parameter_off_the_cpu_is_refused_when_the_optimizer_is_made():
    p = torch.nn.Parameter(torch.ones(3, device="meta"))
    raises_before_submitting(
        ValueError, "host memory", lambda: hvd.DistributedOptimizer(torch.optim.SGD([p], lr=1), op=hvd.Adasum)
    )
