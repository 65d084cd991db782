"""Every broadcast algorithm forced through HVD_LITE_BROADCAST_ALGO (the C API's bare `_core.Comm`)
under mpirun at 1-4 ranks: the root's bytes on every rank for every dtype and root, in place and out
of place, counts around the scatter's block boundaries and 16-byte segments that cross every pipeline
boundary (64-byte chunks for the single copy), NaN payloads verbatim; a failed read of the root's
buffer in the single copy; the selector's choices (the single copy on one host between its bounds),
the forced choice, rank 0's choice agreed, an unknown name refused, and a forced single copy refused
where it cannot run, saying why."""

import numpy as np
import pytest
from conftest import (
    agree,
    fails_everywhere_at_the_fault,
    make_comm,
    raises_on_every_rank,
    reinit,
    single_copy_runs,
    skip_unless_single_copy,
    world,
)
from helpers import MOVE_DTYPES, exact_inputs, same_bits

import hvd_lite as hvd
from hvd_lite import _core
from hvd_lite._submit import HVDL_DTYPES

pytestmark = pytest.mark.mpi

ALGOS = ["chain", "tree", "scatter", "shm"]
MODELLED = ["chain", "tree", "scatter"]


def code(dtype) -> int:
    """The hvdl datatype code."""
    return HVDL_DTYPES[np.dtype(dtype)]


def counts(n: int):
    """0, every count up to 2n+1 (empty and uneven blocks of the scatter's n-block cut), larger odd
    ones (many 16-byte segments)."""
    return sorted(set(range(0, 2 * n + 2)) | {4 * n - 1, 4 * n + 1, 1009})


def check(c, dtype, count, root, inplace, seed):
    """One broadcast from root; True when every rank holds the root's bytes and the root's input is
    untouched."""
    r = hvd.rank()
    x = exact_inputs(dtype, count, r, seed)
    want = exact_inputs(dtype, count, root, seed)
    if inplace:
        out = x.copy()
        c.broadcast(out, out, code(dtype), root)
    else:
        out = np.zeros(count, np.dtype(dtype))
        c.broadcast(x if r == root else None, out, code(dtype), root)
    return same_bits(out, want) and same_bits(x, exact_inputs(dtype, count, r, seed))


@pytest.mark.parametrize("algo", ALGOS)
def test_every_broadcast_algorithm_gives_every_rank_the_roots_bytes(algo):
    skip_unless_single_copy(algo)
    n = hvd.size()
    bad = []
    with make_comm(HVD_LITE_BROADCAST_ALGO=algo, HVD_LITE_SEGMENT_BYTES=16, HVD_LITE_SHM_BYTES=64) as c:
        for dtype in MOVE_DTYPES:
            for count in counts(n):
                for root in range(n):
                    for inplace in (False, True):
                        if not check(c, dtype, count, root, inplace, seed=count + 7 * root):
                            bad.append((np.dtype(dtype).name, count, root, inplace))
    agree(not bad, f"{algo}: wrong at (dtype, count, root, in place) {bad[:5]}")


@pytest.mark.parametrize("algo", ALGOS)
def test_every_broadcast_algorithm_moves_large_buffers_and_nan_payloads_verbatim(algo):
    # 3 MiB + 2 B of random bytes seen as float16 (NaNs with payloads, signed zeros): 12 default
    # segments and more, blocks of uneven length for the scatter, 13 chunks of the single copy.
    skip_unless_single_copy(algo)
    n, r = hvd.size(), hvd.rank()
    with make_comm(HVD_LITE_BROADCAST_ALGO=algo) as c:
        for root in {0, n - 1, n // 2}:
            rng = np.random.default_rng(500 + root)
            x = rng.integers(0, 256, 3 * (1 << 20) + 2, dtype=np.uint8).view(np.float16)
            out = np.empty_like(x)
            c.broadcast(x if r == root else None, out, code(np.float16), root)
            everyone = world().allgather(out.tobytes() == x.tobytes())
            agree(all(everyone), f"{algo} root {root}: ranks with the root's bytes {everyone}")


def test_the_selector_takes_the_tree_for_small_buffers_from_4_ranks_and_else_the_chain():
    n = hvd.size()
    with make_comm(HVD_LITE_SHM=0) as c:  # the model's picks (the single copy is not modelled)
        small, large = c.broadcast_plan(4096), c.broadcast_plan(64 << 20)
        # hier_p2p (test_hier_p2p_collectives.py) needs several hosts: named, not modelled, on one.
        agree(
            set(small["predicted"]) == set(ALGOS) | {"hier_p2p"}
            and small["predicted"]["shm"] is None
            and small["predicted"]["hier_p2p"] is None,
            f"{small}",
        )
        # 2 and 3 ranks: the tree's steps are the chain's hops (one message at 2), the tie goes to
        # the chain; from 4, 4 KiB pays log2(n) latencies in the tree, n-1 in the chain; 64 MiB:
        # the chain sends it once per rank, the tree up to log2(n) times
        want_small = "tree" if n >= 4 else "chain"
        agree(
            n == 1 or (small["algorithm"] == want_small and large["algorithm"] == "chain"), f"{small} {large}"
        )
        best = min(MODELLED, key=lambda a: small["predicted"][a])
        agree(n == 1 or small["predicted"][best] == small["predicted"][small["algorithm"]], f"{small}")


def test_the_selector_takes_the_single_copy_on_one_host_between_its_bounds():
    runs, least, most = single_copy_runs(), _core.SHM_BROADCAST_MIN, _core.SHM_BROADCAST_MAX
    for cma in ("1", "0"):
        with make_comm(HVD_LITE_SHM_CMA=cma) as c:
            outside = {c.broadcast_plan(b)["algorithm"] for b in (4, least, most + 1, 1 << 30)}
            inside = {c.broadcast_plan(b)["algorithm"] for b in (least + 1, most)}
        want_inside = {"shm"} if runs and cma == "1" else None
        agree(
            outside <= set(MODELLED) and (inside == want_inside if want_inside else inside <= set(MODELLED)),
            f"HVD_LITE_SHM_CMA={cma}, single copy runs: {runs}; picks in ({least}, {most}] B "
            f"{inside}, outside {outside}",
        )


def test_a_failed_read_of_the_roots_buffer_fails_the_broadcast_on_every_rank_and_the_next_works():
    # The recv fault point's second hit on a reader, after step 1's, is its first read of the
    # root's buffer (process_vm_readv), made at address 0: the kernel's own EFAULT. Through the
    # engine, whose alarm tells every rank.
    n, r = hvd.size(), hvd.rank()
    skip_unless_single_copy("shm")
    root, victim, count = 0, n - 1, 300_001
    with reinit(HVD_LITE_DATA_TIMEOUT_SECONDS=1, HVD_LITE_BROADCAST_ALGO="shm"):
        fails_everywhere_at_the_fault(
            lambda: hvd.broadcast(np.full(count, 5.0 if r == root else 0.0, np.float32), root, name="b.read"),
            "recv",
            victim,
            "reading",
        )
        y = hvd.broadcast(np.full(count, 7.0 if r == root else 0.0, np.float32), root, name="b.read.next")
        agree(np.all(y == 7.0), f"the next broadcast: {np.unique(y)[:4]}")


def test_a_forced_single_copy_broadcast_that_cannot_run_is_refused_saying_why():
    n = hvd.size()
    if n == 1:  # one rank runs anything (a copy), as the all-reduce
        with make_comm(HVD_LITE_BROADCAST_ALGO="shm", HVD_LITE_SHM_CMA="0") as c:
            ok = all(check(c, np.float32, 1001, 0, inplace, seed=3) for inplace in (False, True))
        agree(ok, "HVD_LITE_BROADCAST_ALGO=shm on one rank: a wrong copy")
        return
    reason = "its single copy is off \\(HVD_LITE_SHM_CMA=0\\)"
    raises_on_every_rank(
        hvd.InvalidArgumentError,
        f"HVD_LITE_BROADCAST_ALGO=shm cannot run on this communicator of {n} ranks: {reason}",
        lambda: make_comm(HVD_LITE_BROADCAST_ALGO="shm", HVD_LITE_SHM_CMA="0").__enter__(),
    )


def test_a_forced_broadcast_algorithm_is_chosen_at_every_size():
    with make_comm(HVD_LITE_BROADCAST_ALGO="scatter") as c:
        agree(
            all(c.broadcast_plan(b)["algorithm"] == "scatter" for b in (4, 1 << 20, 1 << 30)),
            "scatter not kept",
        )


def test_an_unknown_broadcast_algorithm_is_refused_when_the_communicator_is_made():
    raises_on_every_rank(
        hvd.InvalidArgumentError,
        "HVD_LITE_BROADCAST_ALGO=ring is not valid",
        lambda: make_comm(HVD_LITE_BROADCAST_ALGO="ring").__enter__(),
    )


def test_rank_0s_broadcast_algorithm_is_every_ranks():
    n, r = hvd.size(), hvd.rank()
    with make_comm(HVD_LITE_BROADCAST_ALGO="tree" if r == 0 else "scatter") as c:
        plan = c.broadcast_plan(1 << 20)
        ok = all(check(c, np.float32, 1001, root, False, seed=root) for root in range(n))
    agree(plan["algorithm"] == "tree" and ok, f"{plan['algorithm']}, right {ok}")
