"""The two-level all-gather, reduce-scatter, broadcast and all-to-all over point-to-point messages
(csrc/algorithms/allgather_hier_p2p.c, reducescatter_hier_p2p.c, broadcast_hier_p2p.c,
alltoall_hier_p2p.c, and the all-to-all by host pairs, alltoall_hier_pairs.c), forced by
HVD_LITE_ALLGATHER_ALGO, HVD_LITE_REDUCESCATTER_ALGO, HVD_LITE_BROADCAST_ALGO and
HVD_LITE_ALLTOALL_ALGO=hier_p2p (or hier_pairs) on hosts emulated with
HVD_LITE_RANKS_PER_HOST under mpirun, on every layout of hosts of one size: exact results for every
dtype (every op of the reduce-scatter, every root and radix of the broadcast), in place and out of place,
equal blocks through the C API's bare `_core.Comm` and uneven and empty blocks through the engine (the
all-to-all: equal splits run it, uneven ones pairwise); the reduce-scatter's fixed order (hier_p2p's
all-reduce's bits, reruns and in place alike); the layouts they are refused on at init, saying why; and
the selectors' considering them only where they can run."""

import numpy as np
import pytest
from conftest import agree, make_comm, raises_on_every_rank, reinit
from helpers import ALL_DTYPES, MOVE_DTYPES
from test_alltoall_algorithms import alltoall_ok, engine_alltoall_wrong
from test_alltoall_algorithms import counts as alltoall_counts
from test_broadcast_algorithms import check as broadcast_ok
from test_gather_algorithms import (
    OPS,
    allgather_ok,
    counts,
    engine_allgather_wrong,
    engine_reducescatter_wrong,
    gives_the_allreduces_block,
    reducescatter_ok,
)

import hvd_lite as hvd

pytestmark = pytest.mark.mpi


KNOBS = [
    "HVD_LITE_ALLGATHER_ALGO",
    "HVD_LITE_REDUCESCATTER_ALGO",
    "HVD_LITE_BROADCAST_ALGO",
    "HVD_LITE_ALLTOALL_ALGO",
]
# Every algorithm that needs hier_p2p's grid, with its knob: the all-to-all has two.
FORCED = [(knob, "hier_p2p") for knob in KNOBS] + [("HVD_LITE_ALLTOALL_ALGO", "hier_pairs")]


def layouts(n: int):
    """The emulated host sizes k that split n ranks into more than one host of k each."""
    return [k for k in range(1, n) if n % k == 0]


def engine_wrong_on_every_layout(knob, wrong, algo="hier_p2p"):
    """`wrong()` (what came back wrong through the engine) with `knob`=`algo` on every layout,
    each entry led by the ranks a host; skips on one rank, which is one host."""
    if hvd.size() == 1:
        pytest.skip("one rank is one host")
    bad = []
    for k in layouts(hvd.size()):
        with reinit(**{knob: algo, "HVD_LITE_RANKS_PER_HOST": k}):
            bad += [(k, *b) for b in wrong()]
    return bad


def test_hier_p2p_allgather_gathers_every_dtype_exactly_on_every_layout_in_place_and_not():
    n = hvd.size()
    if n == 1:
        pytest.skip("one rank is one host")
    bad = []
    for k in layouts(n):
        env = {"HVD_LITE_ALLGATHER_ALGO": "hier_p2p", "HVD_LITE_RANKS_PER_HOST": k}
        with make_comm(**env) as c:
            plan = c.gather_plan("allgather", 4096)
            agree(plan["algorithm"] == "hier_p2p", f"hosts of {k}: {plan}")
            for dtype in MOVE_DTYPES:
                for count in counts(n) + [100_003]:
                    for inplace in (False, True):
                        if not allgather_ok(c, dtype, count, inplace, seed=count + k):
                            bad.append((k, np.dtype(dtype).name, count, inplace))
    agree(not bad, f"wrong at (ranks a host, dtype, count, in place) {bad[:5]}")


def test_hier_p2p_allgather_gathers_uneven_and_empty_blocks_through_the_engine():
    bad = engine_wrong_on_every_layout("HVD_LITE_ALLGATHER_ALGO", engine_allgather_wrong)
    agree(not bad, f"wrong at (ranks a host, dtype, pattern, row shape) {bad[:5]}")


def test_hier_p2p_reducescatter_reduces_every_dtype_and_op_exactly_on_every_layout_in_place_and_not():
    n = hvd.size()
    if n == 1:
        pytest.skip("one rank is one host")
    bad = []
    for k in layouts(n):
        with make_comm(HVD_LITE_REDUCESCATTER_ALGO="hier_p2p", HVD_LITE_RANKS_PER_HOST=k) as c:
            plan = c.gather_plan("reducescatter", 4096)
            agree(plan["algorithm"] == "hier_p2p", f"hosts of {k}: {plan}")
            for dtype in ALL_DTYPES:
                for op in OPS:
                    for count in counts(n) + [30_011]:
                        for inplace in (False, True):
                            if not reducescatter_ok(c, dtype, op, count, inplace, seed=count + k):
                                bad.append((k, np.dtype(dtype).name, op, count, inplace))
    agree(not bad, f"wrong at (ranks a host, dtype, op, count, in place) {bad[:5]}")


def test_hier_p2p_reducescatter_reduces_uneven_and_empty_blocks_through_the_engine():
    bad = engine_wrong_on_every_layout("HVD_LITE_REDUCESCATTER_ALGO", engine_reducescatter_wrong)
    agree(not bad, f"wrong at (ranks a host, dtype, op, rows) {bad[:5]}")


def test_hier_p2p_reducescatter_gives_hier_p2p_allreduces_bits_reruns_and_in_place_alike():
    # Each host's ranks in turn, then the hosts in transport.h's tree: the hierarchical all-reduce's
    # order, on order-dependent floats.
    n = hvd.size()
    if n == 1:
        pytest.skip("one rank is one host")
    for k in layouts(n):
        env = {"HVD_LITE_REDUCESCATTER_ALGO": "hier_p2p", "HVD_LITE_ALLREDUCE_ALGO": "hier_p2p"}
        with make_comm(HVD_LITE_RANKS_PER_HOST=k, **env) as c:
            for count in (1, 777, 20_000):
                for op in ("sum", "avg"):
                    agree(
                        gives_the_allreduces_block(c, count, op),
                        f"hosts of {k}, count {count}, {op}: the reduce-scatter differs from the "
                        "all-reduce's block",
                    )


# Cost-model files that make the selector take the broadcast's largest radix (every message's latency
# dwarfs its bytes: 8, one level across up to 8 hosts) or its smallest (the bytes dwarf the latency: 2,
# the binomial tree), each on both levels.
RADIX_TERMS = {
    "8": "intra_alpha 1e-3\nintra_beta 1e-15\ninter_alpha 1e-3\ninter_beta 1e-15\n",
    "2": "intra_alpha 1e-12\nintra_beta 1e-6\ninter_alpha 1e-12\ninter_beta 1e-6\n",
}


@pytest.mark.parametrize("radix", sorted(RADIX_TERMS))
def test_hier_p2p_broadcast_gives_every_rank_the_roots_bytes_on_every_layout_root_and_radix(radix, tmp_path):
    n = hvd.size()
    if n == 1:
        pytest.skip("one rank is one host")
    model = tmp_path / "model.conf"
    model.write_text(RADIX_TERMS[radix])
    bad = []
    for k in layouts(n):
        env = {"HVD_LITE_BROADCAST_ALGO": "hier_p2p", "HVD_LITE_RANKS_PER_HOST": k}
        with make_comm(HVD_LITE_COST_MODEL_FILE=str(model), **env) as c:
            agree(c.broadcast_plan(4096)["algorithm"] == "hier_p2p", f"hosts of {k}: not forced")
            for dtype in MOVE_DTYPES:
                for count in (0, 1, 2, 7, 1009, 100_003):
                    for root in range(n):
                        for inplace in (False, True):
                            if not broadcast_ok(c, dtype, count, root, inplace, seed=count + 7 * root):
                                bad.append((k, np.dtype(dtype).name, count, root, inplace))
    agree(not bad, f"radix {radix}: wrong at (ranks a host, dtype, count, root, in place) {bad[:5]}")


@pytest.mark.parametrize("algo", ["hier_p2p", "hier_pairs"])
def test_hier_alltoall_moves_every_dtype_exactly_on_every_layout_in_place_and_not(algo):
    n = hvd.size()
    if n == 1:
        pytest.skip("one rank is one host")
    bad = []
    # hosts of one rank too: the steps within a host have nothing to send; at 4 ranks hosts of 1 and
    # 2 give hier_pairs ranks that carry 3, 1 and no host
    for k in layouts(n):
        with make_comm(HVD_LITE_ALLTOALL_ALGO=algo, HVD_LITE_RANKS_PER_HOST=k) as c:
            plan = c.alltoall_plan(4)
            agree(plan["algorithm"] == algo, f"hosts of {k}: {plan}")
            for dtype in MOVE_DTYPES:
                for count in alltoall_counts(n):
                    if count > 1009 and np.dtype(dtype).itemsize > 1:
                        continue  # the largest blocks once per run, in bytes
                    for inplace in (False, True):
                        if not alltoall_ok(c, dtype, count, inplace, seed=count + k):
                            bad.append((k, np.dtype(dtype).name, count, inplace))
    agree(not bad, f"{algo}: wrong at (ranks a host, dtype, count, in place) {bad[:5]}")


@pytest.mark.parametrize("algo", ["hier_p2p", "hier_pairs"])
def test_hier_alltoall_moves_equal_uneven_and_empty_splits_through_the_engine(algo):
    bad = engine_wrong_on_every_layout("HVD_LITE_ALLTOALL_ALGO", engine_alltoall_wrong, algo)
    agree(not bad, f"wrong at (ranks a host, dtype, pattern, row shape) {bad[:5]}")


@pytest.mark.parametrize("knob, algo", FORCED)
def test_a_forced_hier_p2p_is_refused_at_init_on_one_host(knob, algo):
    n = hvd.size()
    if n == 1:  # one rank runs anything (a copy)
        with make_comm(**{knob: algo}) as c:
            if "GATHER" in knob:
                ok = allgather_ok(c, np.float32, 1001, False, 1)
            elif "ALLTOALL" in knob:
                ok = alltoall_ok(c, np.float32, 1001, False, 1) and alltoall_ok(c, np.int8, 7, True, 2)
            else:
                ok = broadcast_ok(c, np.float32, 1001, 0, False, 1)
        agree(ok, f"{knob}={algo} on one rank: a wrong copy")
        return
    raises_on_every_rank(
        hvd.InvalidArgumentError,
        f"{knob}={algo} cannot run on this communicator of {n} ranks: all {n} ranks are on one host",
        lambda: make_comm(**{knob: algo}).__enter__(),
    )


@pytest.mark.parametrize("knob, algo", FORCED)
def test_a_forced_hier_p2p_is_refused_at_init_on_hosts_of_different_sizes(knob, algo):
    n = hvd.size()
    if n < 3 or n % 2 == 0:
        pytest.skip("needs an odd number of ranks, at least 3, for hosts of 2 and 1")
    raises_on_every_rank(
        hvd.InvalidArgumentError,
        f"{knob}={algo} cannot run on this communicator of {n} ranks: "
        f"the {(n + 1) // 2} hosts have different numbers of ranks \\(1 to 2\\)",
        lambda: make_comm(**{knob: algo, "HVD_LITE_RANKS_PER_HOST": 2}).__enter__(),
    )


def test_the_broadcast_selector_considers_hier_p2p_only_on_hosts_of_one_size():
    n = hvd.size()
    with make_comm(HVD_LITE_SHM=0) as c:
        agree(c.broadcast_plan(4096)["predicted"]["hier_p2p"] is None, "one host: predicted")
    if n >= 2:
        with make_comm(HVD_LITE_SHM=0, HVD_LITE_RANKS_PER_HOST=1) as c:
            plan = c.broadcast_plan(4096)
        agree(plan["predicted"]["hier_p2p"] is not None, f"hosts of 1: {plan}")
    if n >= 3 and n % 2 == 1:
        with make_comm(HVD_LITE_SHM=0, HVD_LITE_RANKS_PER_HOST=2) as c:
            plan = c.broadcast_plan(4096)
        agree(plan["predicted"]["hier_p2p"] is None and plan["algorithm"] != "hier_p2p", f"{plan}")


@pytest.mark.parametrize("coll", ["allgather", "reducescatter"])
def test_the_gather_selectors_consider_hier_p2p_only_on_hosts_of_one_size_with_several_ranks(coll):
    n = hvd.size()
    with make_comm(HVD_LITE_SHM=0) as c:
        agree(c.gather_plan(coll, 1 << 20)["predicted"]["hier_p2p"] is None, "one host: predicted")
    if n >= 4 and n % 2 == 0:
        with make_comm(HVD_LITE_SHM=0, HVD_LITE_RANKS_PER_HOST=2) as c:
            plan = c.gather_plan(coll, 1 << 20)
        agree(plan["predicted"]["hier_p2p"] is not None, f"hosts of 2: {plan}")
    if n >= 2:  # hosts of one rank: nothing to share within a host
        with make_comm(HVD_LITE_SHM=0, HVD_LITE_RANKS_PER_HOST=1) as c:
            plan = c.gather_plan(coll, 1 << 20)
        agree(plan["predicted"]["hier_p2p"] is None and plan["algorithm"] != "hier_p2p", f"{plan}")
    if n >= 3 and n % 2 == 1:
        with make_comm(HVD_LITE_SHM=0, HVD_LITE_RANKS_PER_HOST=2) as c:
            plan = c.gather_plan(coll, 1 << 20)
        agree(plan["predicted"]["hier_p2p"] is None and plan["algorithm"] != "hier_p2p", f"{plan}")


@pytest.mark.parametrize("algo", ["hier_p2p", "hier_pairs"])
def test_the_alltoall_selector_considers_hier_only_on_hosts_of_one_size_with_several_ranks(algo):
    n = hvd.size()
    with make_comm() as c:
        agree(c.alltoall_plan(16)["predicted"][algo] is None, "one host: predicted")
    if n >= 4 and n % 2 == 0:
        with make_comm(HVD_LITE_RANKS_PER_HOST=2) as c:
            plan = c.alltoall_plan(16)
        agree(plan["predicted"][algo] is not None, f"hosts of 2: {plan}")
    if n >= 2:  # hosts of one rank: it would be pairwise
        with make_comm(HVD_LITE_RANKS_PER_HOST=1) as c:
            plan = c.alltoall_plan(16)
        agree(plan["predicted"][algo] is None and plan["algorithm"] != algo, f"{plan}")
    if n >= 3 and n % 2 == 1:
        with make_comm(HVD_LITE_RANKS_PER_HOST=2) as c:
            plan = c.alltoall_plan(16)
        agree(plan["predicted"][algo] is None and plan["algorithm"] != algo, f"{plan}")
