"""hvd_lite.torch on torch.cuda tensors at 1-4 ranks sharing one GPU: the collectives give the
CPU calls' bits and leave results on the tensor's device, in-place calls change the CUDA tensor
itself, gradients flow, and DistributedOptimizer trains a CUDA model as one process does on the
global batch.

In a build with CUDA, allreduce runs on the device (the engine's device path, on torch's current
stream); the other collectives, and every call in a build without CUDA, move a CUDA tensor through
a CPU copy (hvd_lite/torch/mpi_ops.py). This file checks both routes. Skipped, with the reason,
where torch sees no CUDA device (CI has none). On a GPU machine (docs/gpu.md):

    mpirun -np 2 python -m pytest -q --with-mpi tests/parallel/test_torch_cuda.py
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

from conftest import agree, world  # noqa: E402

import hvd_lite.torch as hvd  # noqa: E402

pytestmark = pytest.mark.mpi

DTYPES = [
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]
CUDA = torch.device("cuda", 0)


def small_ints(rank, shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    lo = 0 if dtype == torch.uint8 else -4
    return torch.randint(lo, 5, shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_on_a_cuda_tensor_gives_the_cpu_bits_on_its_device(dtype):
    r = hvd.rank()
    x = small_ints(r, (1000, 3), dtype, seed=1)
    want = hvd.allreduce(x, op=hvd.Sum, name="cpu")
    out = hvd.allreduce(x.to(CUDA), op=hvd.Sum, name="gpu")
    inplace = x.to(CUDA)
    back = hvd.allreduce_(inplace, op=hvd.Sum, name="gpu_")
    ok = (
        out.device == x.to(CUDA).device
        and out.dtype == dtype
        and torch.equal(out.cpu(), want)
        and back is inplace
        and torch.equal(inplace.cpu(), want)
    )
    agree(
        ok,
        f"{dtype}: device {out.device}, equal {torch.equal(out.cpu(), want)}, "
        f"in place {torch.equal(inplace.cpu(), want)}",
    )


def test_average_allgather_and_broadcast_on_cuda_tensors():
    r, n = hvd.rank(), hvd.size()
    x = torch.full((5,), float(2 * (r + 1)), device=CUDA)
    avg = hvd.allreduce(x)  # Average by default
    gathered = hvd.allgather(torch.full((r + 1, 2), r, dtype=torch.int32, device=CUDA))
    b = torch.full((4,), float(r), device=CUDA)
    hvd.broadcast_(b, root_rank=n - 1)
    want_rows = torch.cat([torch.full((k + 1, 2), k, dtype=torch.int32) for k in range(n)])
    ok = (
        avg.is_cuda
        and torch.equal(avg.cpu(), torch.full((5,), float(n + 1)))
        and gathered.is_cuda
        and torch.equal(gathered.cpu(), want_rows)
        and b.is_cuda
        and torch.equal(b.cpu(), torch.full((4,), float(n - 1)))
    )
    agree(ok, f"avg {avg}, gathered {gathered.shape}, broadcast {b}")


def test_the_gradient_of_allreduce_reaches_a_cuda_leaf():
    n = hvd.size()
    x = torch.full((3,), float(hvd.rank()), device=CUDA, requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum).sum().backward()
    agree(
        x.grad is not None and x.grad.is_cuda and torch.equal(x.grad.cpu(), torch.full((3,), float(n))),
        f"grad {x.grad}",
    )


GLOBAL_BATCH = 24  # divisible by 1, 2, 3 and 4


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(CUDA)


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return (
        torch.randn(GLOBAL_BATCH, 8, generator=g).to(CUDA),
        torch.randn(GLOBAL_BATCH, 4, generator=g).to(CUDA),
    )


def weights(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()


def test_distributed_optimizer_trains_a_cuda_model_as_one_process_on_the_global_batch():
    r, n = hvd.rank(), hvd.size()
    per = GLOBAL_BATCH // n
    model = make_model()
    with torch.no_grad():  # different starting weights on every rank, made equal by the broadcast
        for p in model.parameters():
            p.add_(r)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    ref = make_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for s in range(4):
        x, y = batch(s)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[r * per : (r + 1) * per]), y[r * per : (r + 1) * per]).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    w, wr = weights(model), weights(ref)
    gathered = world().allgather(w.numpy())
    same = all(np.array_equal(g, gathered[0]) for g in gathered)
    on_device = all(p.is_cuda and (p.grad is None or p.grad.is_cuda) for p in model.parameters())
    agree(
        torch.allclose(w, wr, atol=1e-5, rtol=1e-4) and same and on_device,
        f"max diff {(w - wr).abs().max().item()}, same on every rank {same}, on the device {on_device}",
    )


def test_allreduce_of_cuda_tensors_runs_on_the_device_on_the_current_stream():
    """In a build with CUDA the allreduce of a CUDA tensor (async, into a new tensor, and in place)
    runs on the device (stats() 'device_steps'), ordered on torch's current stream: here a
    non-default one whose long kernel chain writes the input while the host does not wait."""
    from hvd_lite import _core, basics

    if not _core.build_info()["cuda"]:
        pytest.skip("this build has no CUDA: CUDA tensors go through a CPU copy")
    r, n = hvd.rank(), hvd.size()
    before = basics._engine().stats()["device_steps"]
    s = torch.cuda.Stream(device=CUDA)
    with torch.cuda.stream(s):
        big = torch.ones(1 << 26, device=CUDA)
        for _ in range(20):
            big.mul_(1.0)
        x = big[: 1 << 20] * (r + 1)
        out = hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum, name="tstream"))
        hvd.allreduce_(x, op=hvd.Sum, name="tstream_")
        got, got_ = out.cpu(), x.cpu()
    steps = basics._engine().stats()["device_steps"] - before
    want = torch.full((1 << 20,), n * (n + 1) / 2)
    agree(
        torch.equal(got, want) and torch.equal(got_, want) and out.is_cuda and steps == 2,
        f"got {got[:3]}, {got_[:3]}; device steps {steps}",
    )


def test_a_group_of_cuda_tensors_is_one_fused_device_step():
    """The optimizer's case: small CUDA gradients in one round fuse into one device step (the
    pinned buffer), each result right and on its tensor."""
    from hvd_lite import _core, basics

    if not _core.build_info()["cuda"]:
        pytest.skip("this build has no CUDA: CUDA tensors go through a CPU copy")
    r, n = hvd.rank(), hvd.size()
    ts = [torch.full((k + 1, 3), float(r + k), device=CUDA) for k in range(5)]
    before = basics._engine().stats()["device_steps"]
    outs = hvd.grouped_allreduce(ts, op=hvd.Sum, name="tgroup")
    steps = basics._engine().stats()["device_steps"] - before
    ok = all(
        o.is_cuda and torch.equal(o.cpu(), torch.full((k + 1, 3), n * k + n * (n - 1) / 2))
        for k, o in enumerate(outs)
    )
    agree(ok and steps == 1, f"outputs right {ok}, device steps {steps}")
