"""Memory the peers reach (csrc/transport/shm/peer_memory.c: hvdlMemAlloc, hvd_lite.empty) under mpirun at
1-4 ranks: the single-copy all-reduce and all-gather on such buffers read and write the peers' buffers
through views of their regions (Comm.shm_views counts them; exact values for every dtype and op across chunk
and lane edges: test_shm.py's single-copy test with memory=hvd.empty), in and out of place, the bits of
plain buffers and of the ring on every rank, ranks that mix both kinds of buffer, buffers made and freed
past the views kept per peer, the engine's calls (its fusion buffer is such memory:
Engine.stats()["shm_views"]; the stand-ins each rank takes, Engine.stats()["shm_stand_ins"]), a torch tensor
over such memory, memory that lives as long as a view of it, a failed call that writes into no peer's buffer
afterwards, a failed read, and the argument errors of hvd_lite.empty and hvdlMemFree."""

import time

import numpy as np
import pytest
from conftest import agree, make_comm, on_small_pages, reinit, small_pages, stand_in_everywhere, world
from helpers import exact_inputs, fold, same_bits
from mpi4py import MPI

import hvd_lite as hvd
from hvd_lite import _core
from hvd_lite._submit import HVDL_DTYPES

pytestmark = pytest.mark.mpi

OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
F32 = 7  # the hvdl code of float32
MAPS = 8  # HVDL_MEM_MAPS (csrc/transport/shm/shm.h): views kept of each peer's regions
TIMEOUT = 1  # HVD_LITE_DATA_TIMEOUT_SECONDS in the failure test


def single_copy_or_skip(c):
    if hvd.size() > 1 and not c.shm_cma():
        pytest.skip(
            "process_vm_readv/writev cannot reach the other ranks here (seccomp, Yama, pid namespaces)"
        )


def mapped_regions() -> int:
    """hvdlMemAlloc regions mapped in this process (its own and its views of its peers'), as
    the kernel lists them."""
    with open("/proc/self/maps") as f:
        return sum("memfd:hvd_lite.mem" in line for line in f)


def shared_copy(x: np.ndarray) -> np.ndarray:
    y = hvd.empty(x.shape, x.dtype)
    y[...] = x
    return y


def check_exact(c, dtype, op, count, inplace, seed, alloc=hvd.empty):
    n, r = hvd.size(), hvd.rank()
    x = alloc(count, dtype)
    x[...] = exact_inputs(dtype, count, r, seed)
    want = fold([exact_inputs(dtype, count, q, seed) for q in range(n)], op, dtype)
    got = x if inplace else alloc(count, dtype)
    c.allreduce(x, got, HVDL_DTYPES[np.dtype(dtype)], OPS[op])
    if not inplace:
        agree(same_bits(x.copy(), exact_inputs(dtype, count, r, seed)), "input was modified")
    agree(
        same_bits(got.copy(), want),
        f"{np.dtype(dtype).name} {op} count={count} inplace={inplace}: got {got[:6]}, want {want[:6]}",
    )


def test_the_peers_regions_are_mapped_for_buffers_from_empty_and_only_for_them():
    # Without stand-ins for plain buffers (HVD_LITE_SHM_STAND_IN_BYTES=0; their tests follow).
    n = hvd.size()
    count = _core.SHM_CMA_MIN // 4 + 1001
    with make_comm(HVD_LITE_SHM_STAND_IN_BYTES=0) as c:
        single_copy_or_skip(c)
        x = np.ones(count, np.float32)
        c.allreduce(x, x, F32, OPS["sum"])
        agree(c.shm_views() == 0 and np.all(x == n), f"numpy buffers: {c.shm_views()} views, {x[:3]}")
        a, b = hvd.empty(count), hvd.empty(count)
        a[...] = 1
        c.allreduce(a, b, F32, OPS["sum"])  # each peer's send and recv: two regions
        agree(
            c.shm_views() == 2 * (n - 1) and np.all(b == n),
            f"out of place: {c.shm_views()} views for {n - 1} peers, {b[:3]}",
        )
        c.allreduce(b, b, F32, OPS["sum"])  # b's region is mapped already
        agree(
            c.shm_views() == 2 * (n - 1) and np.all(b == n * n), f"in place: {c.shm_views()} views, {b[:3]}"
        )
        small = hvd.empty(16)  # the one-step form copies through the segment: no view
        small[...] = 1
        c.allreduce(small, small, F32, OPS["sum"])
        agree(c.shm_views() == 2 * (n - 1) and np.all(small == n), f"small: {c.shm_views()}")


def test_plain_buffers_up_to_the_stand_in_size_go_through_a_region_of_their_rank():
    # Each rank copies its plain buffers' other lanes into a region of its own (its stand-in, made
    # once) that the peers map: one view of each peer's. Above HVD_LITE_SHM_STAND_IN_BYTES, and for
    # buffers from hvd.empty, none.
    n, r = hvd.size(), hvd.rank()
    most = 1 << 20
    first = _core.SHM_CMA_MIN // 4 + 1001  # 35.9 KiB
    with make_comm(HVD_LITE_SHM_STAND_IN_BYTES=most, HVD_LITE_SHM_BYTES=4096) as c:
        single_copy_or_skip(c)
        calls = []
        for count, inplace, shared in (
            (first, True, False),
            (first, False, False),
            (first - 7, True, False),
            (most // 4 - 4096, True, False),  # the most, less 16 KiB
            (most // 4 + 1, True, False),  # above it: the kernel
            (first, False, True),
        ):  # hvd.empty's input, a numpy result
            x = hvd.empty(count, np.float32) if shared else np.zeros(count, np.float32)
            calls.append((x, x if inplace else np.zeros(count, np.float32)))
        plain = all(small_pages(got) == got.nbytes for _, got in calls[:4])
        if n > 1 and world().allreduce(int(plain), op=MPI.MIN) == 0:
            pytest.skip("the kernel does not say that numpy's arrays of up to 1 MiB lie on small pages")
        seen = []
        for i, (x, got) in enumerate(calls):
            count, inplace = x.size, x is got
            x[...] = exact_inputs(np.float32, count, r, seed=i)
            c.allreduce(x, got, F32, OPS["sum"])
            want = fold([exact_inputs(np.float32, count, q, seed=i) for q in range(n)], "sum", np.float32)
            agree(same_bits(got.copy(), want), f"call {i}: got {got[:4]}, want {want[:4]}")
            if not inplace:
                agree(
                    same_bits(x.copy(), exact_inputs(np.float32, count, r, seed=i)),
                    f"call {i}: the input was modified",
                )
            seen.append(c.shm_views())
        # every peer's stand-in mapped once: the same region whatever the size, and a numpy result
        # with hvd.empty's input takes it too
        agree(seen == [n - 1] * 6, f"views after each call: {seen}, {n - 1} peers")


def test_buffers_on_huge_pages_are_left_to_the_kernel():
    # The kernel pins a huge page (2 MiB) in one step: a buffer on huge pages takes no stand-in.
    n, r = hvd.size(), hvd.rank()
    big = np.empty(4 << 20, np.float32)  # 16 MiB: numpy asks for huge pages
    big[...] = 0  # touched: the pages are there
    start = (-big.ctypes.data % (2 << 20)) // 4  # the first element at a 2 MiB boundary
    x = big[start : start + (1 << 18)]  # 1 MiB
    huge = world().allreduce(int(small_pages(x) == 0 and small_pages(np.ones(1 << 14)) > 0), op=MPI.MIN)
    if n == 1 or not huge:
        pytest.skip("needs 2 ranks, huge pages for numpy's large arrays and a kernel that says so")
    with make_comm(HVD_LITE_SHM_STAND_IN_BYTES=2 << 20) as c:
        single_copy_or_skip(c)
        x[...] = exact_inputs(np.float32, x.size, r, seed=5)
        c.allreduce(x, x, F32, OPS["sum"])
        want = fold([exact_inputs(np.float32, x.size, q, seed=5) for q in range(n)], "sum", np.float32)
        agree(
            same_bits(x.copy(), want) and c.shm_views() == 0 and c.shm_stand_ins() == 0,
            f"{c.shm_views()} views, {c.shm_stand_ins()} stand-ins taken, {x[:4]}",
        )
        y = np.zeros(1 << 18, np.float32)  # a fresh 1 MiB array: small pages, a stand-in
        c.allreduce(y, y, F32, OPS["sum"])
        agree(
            c.shm_views() == n - 1 and c.shm_stand_ins() == 1,
            f"{c.shm_views()} views, {c.shm_stand_ins()} stand-ins after a small-page buffer",
        )


def test_a_failed_call_through_a_stand_in_copies_nothing_out_and_gives_the_stand_in_up():
    # The send fault point's second hit on the victim, after step 1's, is its first write into a
    # peer's stand-in, made through the kernel at address 0: the call fails on every rank. The
    # lanes the peers would have written must still hold what the result buffer held before, and
    # each rank unmaps its stand-in (a peer held up past the drain could still write into it).
    n, r = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("needs 2 ranks")
    count, sentinel = _core.SHM_CMA_MIN // 4 + 1001, np.float32(-7.0)
    with make_comm(HVD_LITE_SHM_BYTES=4096) as c:
        single_copy_or_skip(c)
        x, got = on_small_pages(np.ones(count, np.float32)), on_small_pages(np.zeros(count, np.float32))
        if not stand_in_everywhere(x):
            pytest.skip("the kernel does not say which pages are small")
        c.allreduce(x, got, F32, OPS["sum"])  # the stand-ins are made and mapped
        agree(c.shm_views() == n - 1 and np.all(got == n), f"{c.shm_views()} views, {got[:4]}")
        got[...] = sentinel
        regions = mapped_regions()
        c._inject_fault("send", 2 if r == n - 1 else 0, TIMEOUT)
        err = None
        try:
            c.allreduce(x, got, F32, OPS["sum"])
        except hvd.HvdLiteError as e:
            err = e
        base, rem = divmod(count, n)
        lo = r * base + min(r, rem)
        hi = lo + base + (r < rem)
        others = np.concatenate([got[:lo], got[hi:]])
        agree(err is not None and np.all(others == sentinel), f"{err!r}; other lanes {np.unique(others)[:4]}")
        # its own stand-in unmapped (at least: under MPICH another region of this process, not this
        # test's, can go meanwhile)
        agree(
            mapped_regions() <= regions - 1,
            f"{regions} regions mapped before the failed call, {mapped_regions()} after",
        )


@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_shared_buffers_give_the_bits_of_plain_buffers_and_of_the_ring_on_every_rank(op):
    r = hvd.rank()
    with make_comm() as on, make_comm(HVD_LITE_SHM=0, HVD_LITE_ALLREDUCE_ALGO="ring") as ring:
        single_copy_or_skip(on)
        for count in (_core.SHM_CMA_MIN // 4 + 1, 1_000_003):
            x = np.random.default_rng(300 + r).standard_normal(count).astype(np.float32)
            x *= np.float32(10.0) ** np.random.default_rng(r).integers(-6, 6, count)
            plain, d = np.empty_like(x), np.empty_like(x)
            on.allreduce(x, plain, F32, OPS[op])
            ring.allreduce(x, d, F32, OPS[op])
            sx, sout = shared_copy(x), hvd.empty(count)
            on.allreduce(sx, sout, F32, OPS[op])
            on.allreduce(sx, sx, F32, OPS[op])
            everyone = world().allgather(sout.tobytes())
            agree(all(e == everyone[0] for e in everyone), f"count {count} {op}: ranks differ")
            agree(
                same_bits(sout.copy(), plain) and same_bits(sout.copy(), d) and same_bits(sx.copy(), plain),
                f"count {count} {op}: shared buffers differ from plain ones or the ring",
            )


def test_ranks_that_mix_shared_and_plain_buffers_get_exact_results():
    # Even ranks' buffers from hvd.empty, odd ranks' from numpy: each peer is read and written
    # through its view or through the kernel, per buffer.
    r = hvd.rank()
    with make_comm(HVD_LITE_SHM_BYTES=4096) as c:
        single_copy_or_skip(c)
        for i, alloc in enumerate((hvd.empty, np.zeros)):
            mine = alloc if r % 2 == 0 else (np.zeros if i == 0 else hvd.empty)
            for inplace in (True, False):
                check_exact(c, np.float32, "sum", _core.SHM_CMA_MIN // 4 + 4099, inplace, seed=i, alloc=mine)
            # the all-gather writes each rank's block into every peer's result
            block = _core.SHM_ALLGATHER_MIN // 4 + 1031
            send, out = mine(block, np.float32), mine(hvd.size() * block, np.float32)
            send[...] = exact_inputs(np.float32, block, r, seed=7)
            c.allgather(send, out, F32)
            want = np.concatenate([exact_inputs(np.float32, block, q, seed=7) for q in range(hvd.size())])
            agree(same_bits(out.copy(), want), f"all-gather, mixed {i}: got {out[:4]}")


def test_buffers_made_and_freed_past_the_views_kept_give_exact_results_and_bounded_views():
    # Each call on new buffers; the old ones are freed (their descriptors are reused), so a view
    # must be found by the region's serial number, not its descriptor, and the least recently used
    # given back.
    n, r = hvd.size(), hvd.rank()
    count = _core.SHM_CMA_MIN // 4 + 77
    before = mapped_regions()
    with make_comm() as c:
        single_copy_or_skip(c)
        for i in range(3 * MAPS):
            x = hvd.empty(count)
            x[...] = exact_inputs(np.float32, count, r, seed=i)
            c.allreduce(x, x, F32, OPS["sum"])
            want = fold([exact_inputs(np.float32, count, q, seed=i) for q in range(n)], "sum", np.float32)
            agree(same_bits(x.copy(), want), f"buffer {i}: got {x[:4]}, want {want[:4]}")
            del x
        # At most: under MPICH another region of this process (not this test's) can go meanwhile.
        inside = mapped_regions()
        agree(
            c.shm_views() == MAPS * (n - 1) and inside <= before + MAPS * (n - 1),
            f"{c.shm_views()} views, {inside - before} more regions mapped, after {3 * MAPS} "
            f"buffers and {n - 1} peers",
        )
    after = mapped_regions()  # the views went with the communicator, the buffers with their arrays
    agree(after <= before, f"{after - before} more regions mapped after the communicator went")


def engine_single_copy() -> bool:
    with make_comm() as c:
        return hvd.size() > 1 and c.shm_cma()


def test_the_engine_reduces_shared_arrays_exactly_and_fuses_through_shared_memory():
    # Unfused, the arrays from hvd.empty are reduced in place and their regions mapped; fused, plain
    # numpy arrays go through the engine's fusion buffer, whose region the peers map too.
    n, r = hvd.size(), hvd.rank()
    for threshold, alloc in ((0, hvd.empty), (64 << 20, np.zeros)):
        # no stand-ins: the views are then those of hvd.empty's arrays and the fusion buffer alone
        with reinit(HVD_LITE_FUSION_THRESHOLD=threshold, HVD_LITE_SHM_STAND_IN_BYTES=0):
            on = engine_single_copy()
            xs = [alloc(k, np.float32) for k in (7, 40_001, 300_003)]
            for i, x in enumerate(xs):
                x[...] = exact_inputs(np.float32, x.size, r, seed=i)
            hvd.grouped_allreduce_(xs, op=hvd.Sum, name=f"shared.{threshold}")
            for i, x in enumerate(xs):
                want = fold(
                    [exact_inputs(np.float32, x.size, q, seed=i) for q in range(n)], "sum", np.float32
                )
                agree(same_bits(x.copy(), want), f"threshold {threshold}, tensor {i}: {x[:4]}")
            views = hvd.basics._engine().stats()["shm_views"]
            agree(views > 0 if on else views == 0, f"threshold {threshold}: {views} views, single copy {on}")
            got = hvd.allgather(xs[1], name=f"shared.ag.{threshold}")
            agree(
                got.shape == (n * xs[1].size,) and same_bits(got[: xs[1].size], xs[1].copy()),
                f"allgather of the array: {got.shape}",
            )


def test_the_engine_counts_the_stand_ins_its_rank_takes():
    # Each rank takes the stand-in by its own buffers' pages (in place: at least half of them
    # small), so each rank's count is checked against what its own kernel says of them.
    n, r = hvd.size(), hvd.rank()
    for most in (4 << 20, 0):
        with reinit(HVD_LITE_FUSION_THRESHOLD=0, HVD_LITE_SHM_STAND_IN_BYTES=most):
            on = engine_single_copy()
            x = np.zeros(1 << 18, np.float32)  # 1 MiB, fresh: small pages where the kernel says so
            x[...] = exact_inputs(np.float32, x.size, r, seed=8)
            took = int(on and most > 0 and 2 * small_pages(x) >= x.nbytes)
            before = hvd.basics._engine().stats()["shm_stand_ins"]
            hvd.allreduce_(x, op=hvd.Sum, name=f"stand_in.count.{most}")
            got = hvd.basics._engine().stats()["shm_stand_ins"] - before
            want = fold([exact_inputs(np.float32, x.size, q, seed=8) for q in range(n)], "sum", np.float32)
            agree(
                same_bits(x.copy(), want) and got == took,
                f"knob {most}: {got} stand-ins taken, {took} expected (single copy {on}), {x[:4]}",
            )


def test_the_memory_lives_as_long_as_a_view_of_it():
    r = hvd.rank()
    x = hvd.empty(1 << 16)
    x[...] = r + 1.0
    tail = x[100:200]
    del x
    import gc

    gc.collect()
    agree(np.all(tail == r + 1.0), f"a view after its array went: {tail[:4]}")
    got = hvd.allreduce(tail, op=hvd.Sum, name="shared.view")
    agree(np.all(got == hvd.size() * (hvd.size() + 1) / 2), f"{got[:4]}")


def test_a_rank_that_comes_late_to_a_failed_call_writes_into_no_peers_shared_buffer():
    # The victim stalls before step 1 for three data timeouts; the others time out and leave. When
    # it passes step 1 it must see that they failed and write nothing into their buffers, which it
    # could now reach through its views with plain stores.
    n, r = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("needs 2 ranks")
    victim, count = 1, _core.SHM_CMA_MIN // 4 + 1001
    with make_comm() as c:
        single_copy_or_skip(c)
        x = hvd.empty(count)
        x[...] = 1
        c.allreduce(x, x, F32, OPS["sum"])  # the views are made
        x[...] = r + 1.0
        c._inject_fault("stall", int(r == victim), TIMEOUT)
        err = None
        try:
            c.allreduce(x, x, F32, OPS["sum"])
        except hvd.HvdLiteError as e:
            err = e
        world().barrier()  # every rank, the victim too, has left the call
        time.sleep(0.05)
        agree(err is not None, f"no error: {x[:4]}")
        agree(
            r == victim or np.all(x == r + 1.0),
            f"rank {r}'s buffer was written after its call failed: {np.unique(x)[:4]}",
        )


def test_a_failed_read_of_a_peers_shared_buffer_fails_the_call_on_every_rank():
    # The recv fault point's second hit, after step 1's, is the first read of a peer's buffer: with
    # a fault the read goes through the kernel at address 0 (its EFAULT), not through the view.
    n, r = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("needs 2 ranks")
    count = _core.SHM_CMA_MIN // 4 + 1001
    with make_comm(HVD_LITE_SHM_BYTES=4096) as c:
        single_copy_or_skip(c)
        x = hvd.empty(count)
        c._inject_fault("recv", 2 if r == n - 1 else 0, TIMEOUT)
        t0 = time.monotonic()
        err = None
        try:
            c.allreduce(x, x, F32, OPS["sum"])
        except hvd.HvdLiteError as e:
            err = e
        took = time.monotonic() - t0
        agree(err is not None and took < 5, f"{err!r} after {took:.2f} s")
        agree(r != n - 1 or "shared-memory path: reading" in str(err), f"the victim's error: {err!r}")


def test_empty_makes_zeroed_page_aligned_arrays_and_refuses_bad_arguments():
    x = hvd.empty((3, 5), np.int16)
    agree(
        x.shape == (3, 5)
        and x.dtype == np.int16
        and x.flags.c_contiguous
        and x.flags.writeable
        and not x.any()
        and x.ctypes.data % 4096 == 0,
        f"{x.shape} {x.dtype} {x.ctypes.data}",
    )
    agree(hvd.empty(0).shape == (0,) and hvd.empty((2, 0)).size == 0, "empty shapes")
    for bad, kind in (((-1,), ValueError), ((2.5,), TypeError), ("ab", TypeError), ((True,), TypeError)):
        with pytest.raises(kind, match="hvd_lite.empty"):
            hvd.empty(bad)
    with pytest.raises(TypeError, match="fixed-size"):
        hvd.empty(3, object)
    with pytest.raises(ValueError, match="too many"):
        hvd.empty((1 << 62, 1 << 62))
    with pytest.raises(ValueError, match="nbytes must be positive"):
        _core.SharedMemory(0)


def test_freeing_memory_it_did_not_make_or_freed_already_is_refused():
    with pytest.raises(hvd.InvalidArgumentError, match="not a pointer that hvdlMemAlloc returned"):
        _core.mem_free(np.zeros(4).ctypes.data)
    m = _core.SharedMemory(4096)
    address = m.address
    _core.mem_free(address)
    with pytest.raises(hvd.InvalidArgumentError, match="freed already"):
        _core.mem_free(address)
    _core.mem_free(0)  # NULL: nothing, as free()
    del m  # its own free is refused and ignored


def test_a_torch_tensor_over_empty_is_reduced_through_the_views():
    torch = pytest.importorskip("torch")
    import hvd_lite.torch as htorch

    n, r = hvd.size(), hvd.rank()
    with reinit(HVD_LITE_FUSION_THRESHOLD=0, HVD_LITE_SHM_STAND_IN_BYTES=0):
        on = engine_single_copy()
        t = torch.from_numpy(hvd.empty(300_001, np.float32))
        t.copy_(torch.from_numpy(exact_inputs(np.float32, t.numel(), r, seed=3)))
        htorch.allreduce_(t, op=htorch.Sum, name="shared.torch")
        want = fold([exact_inputs(np.float32, t.numel(), q, seed=3) for q in range(n)], "sum", np.float32)
        views = hvd.basics._engine().stats()["shm_views"]
        agree(
            same_bits(t.numpy().copy(), want) and (views > 0 if on else views == 0),
            f"{t[:4]}, {views} views, single copy {on}",
        )
