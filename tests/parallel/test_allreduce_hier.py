"""The hierarchical all-reduce over point-to-point messages (csrc/algorithms/allreduce_hier_p2p.c), forced by
HVD_LITE_ALLREDUCE_ALGO=hier_p2p on hosts emulated with HVD_LITE_RANKS_PER_HOST under mpirun: exact
results for every dtype and op, in place and out of place; bitwise identity across ranks on
order-dependent floats, and their order (each host's ranks in turn, then the hosts in transport.h's
tree); the layouts it refuses at init."""

import numpy as np
import pytest
from conftest import agree, raises_on_every_rank, world
from helpers import same_bits
from test_allreduce_algorithms import F32, OPS, exact_for_every_dtype_and_op, make_comm, order_dependent

import hvd_lite as hvd

pytestmark = pytest.mark.mpi

COUNTS = (0, 1, 7, 1000, 100_003)


def layouts(n: int):
    """The emulated host sizes k that split n ranks into more than one host of k each."""
    return [k for k in range(1, n) if n % k == 0]


def pairwise_tree_sum(values):
    """transport.h's tree over the given values in order (fold 2i, 2i+1 for i < n - p, then aligned
    groups, lower on the left)."""
    n = len(values)
    p = 1
    while p * 2 <= n:
        p *= 2
    rem = n - p
    level = [values[2 * v] + values[2 * v + 1] if v < rem else values[v + rem] for v in range(p)]
    while len(level) > 1:
        level = [level[i] + level[i + 1] for i in range(0, len(level), 2)]
    return level[0]


def test_hier_p2p_gives_exact_results_for_every_dtype_op_and_layout():
    n = hvd.size()
    if n == 1:
        pytest.skip("one rank is one host")
    for k in layouts(n):
        with make_comm(HVD_LITE_ALLREDUCE_ALGO="hier_p2p", HVD_LITE_RANKS_PER_HOST=k) as c:
            plan = c.allreduce_plan(4096)
            agree(
                plan["algorithm"] == "hier_p2p" and plan["hosts"] == n // k and plan["local_size"] == k,
                f"hosts of {k}: {plan}",
            )
            exact_for_every_dtype_and_op(c, COUNTS, f"hosts of {k}")


def test_hier_p2p_is_bitwise_identical_across_ranks_in_place_and_on_rerun():
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("one rank is one host")
    for k in layouts(n):
        with make_comm(HVD_LITE_ALLREDUCE_ALGO="hier_p2p", HVD_LITE_RANKS_PER_HOST=k) as c:
            for count in (1, 7, 1000, 100_003):
                x = order_dependent(count, 300 + r)
                out, again = np.empty_like(x), np.empty_like(x)
                c.allreduce(x, out, F32, OPS["sum"])
                inplace = x.copy()
                c.allreduce(inplace, inplace, F32, OPS["sum"])
                c.allreduce(x, again, F32, OPS["sum"])
                everyone = world().allgather(out.tobytes())
                agree(all(b == everyone[0] for b in everyone), f"hosts of {k}, count {count}: ranks differ")
                agree(
                    same_bits(out, inplace) and same_bits(out, again),
                    f"hosts of {k}, count {count}: in place or a rerun differs",
                )


def in_turn_sum(values):
    """The values summed one after the other, in order: ((v0 + v1) + v2) + ..."""
    total = values[0]
    for v in values[1:]:
        total = total + v
    return total


def test_hier_p2p_sums_each_hosts_ranks_in_turn_then_the_hosts_in_a_tree():
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("one rank is one host")
    for count in (1001, 100_003):  # one lane, and a lane for every rank of a host
        inputs = [order_dependent(count, 40 + q) for q in range(n)]
        for k in layouts(n):
            hosts = [in_turn_sum(inputs[h * k : (h + 1) * k]) for h in range(n // k)]
            want = pairwise_tree_sum(hosts)
            with make_comm(HVD_LITE_ALLREDUCE_ALGO="hier_p2p", HVD_LITE_RANKS_PER_HOST=k) as c:
                out = np.empty(count, np.float32)
                c.allreduce(inputs[r], out, F32, OPS["sum"])
            agree(same_bits(out, want), f"hosts of {k}, count {count}: got {out[:3]}, want {want[:3]}")


# Cost-model files that decide hier_p2p's step across hosts for lanes up to 8 KiB: the latency far above
# the bytes (the direct exchange's one step is priced under rd's steps, and its bytes cost little), or
# the bytes far above the latency (the selector's fail-safe rule keeps rd).
ACROSS_TERMS = {
    "direct": "inter_alpha 1e-3\ninter_beta 1e-15\n",
    "rd": "inter_alpha 1e-6\ninter_beta 1e-6\n",
}
SMALL_COUNTS = (0, 1, 7, 333, 1024)  # float64 1024: an 8 KiB lane, the most the direct exchange takes


def test_the_direct_exchange_across_gives_exact_results_and_rds_bits(tmp_path):
    n, r = hvd.size(), hvd.rank()
    if n < 3:
        pytest.skip("the direct exchange runs across 3 hosts or more")
    bits = {}
    for across, terms in ACROSS_TERMS.items():
        model = tmp_path / f"{across}.conf"
        model.write_text(terms)
        env = {"HVD_LITE_ALLREDUCE_ALGO": "hier_p2p", "HVD_LITE_COST_MODEL_FILE": str(model)}
        with make_comm(HVD_LITE_RANKS_PER_HOST=1, **env) as c:
            taken = {c.allreduce_plan(count * 8)["hier_p2p_across"] for count in SMALL_COUNTS[1:]}
            agree(taken == {across}, f"{terms!r}: the step across was {taken}")
            exact_for_every_dtype_and_op(c, SMALL_COUNTS, across)
            for count in SMALL_COUNTS[1:]:
                inputs = [order_dependent(count, 900 + q) for q in range(n)]
                out = np.empty(count, np.float32)
                c.allreduce(inputs[r], out, F32, OPS["sum"])
                everyone = world().allgather(out.tobytes())
                agree(all(b == everyone[0] for b in everyone), f"{across}, count {count}: ranks differ")
                bits[across, count] = out.tobytes()
                agree(
                    same_bits(out, pairwise_tree_sum(inputs)),
                    f"{across}, count {count}: not the hosts in the tree: {out[:3]}",
                )
    agree(
        all(bits["direct", k] == bits["rd", k] for k in SMALL_COUNTS[1:]),
        "the direct exchange's bits differ from rd's",
    )


def test_forced_hier_p2p_is_refused_at_init_on_one_host():
    n = hvd.size()
    if n == 1:
        pytest.skip("one rank runs no algorithm: the call is a copy")
    raises_on_every_rank(
        hvd.InvalidArgumentError,
        f"HVD_LITE_ALLREDUCE_ALGO=hier_p2p cannot run on this communicator of {n} ranks: "
        f"all {n} ranks are on one host",
        lambda: make_comm(HVD_LITE_ALLREDUCE_ALGO="hier_p2p").__enter__(),
    )


def test_forced_hier_p2p_is_refused_at_init_on_hosts_of_different_sizes():
    n = hvd.size()
    if n < 3 or n % 2 == 0:
        pytest.skip("needs an odd number of ranks, at least 3, for hosts of 2 and 1")
    raises_on_every_rank(
        hvd.InvalidArgumentError,
        "different numbers of ranks",
        lambda: make_comm(HVD_LITE_ALLREDUCE_ALGO="hier_p2p", HVD_LITE_RANKS_PER_HOST=2).__enter__(),
    )


def test_the_selector_considers_hier_p2p_only_where_it_can_run():
    n = hvd.size()
    with make_comm() as c:
        agree(c.allreduce_plan(1 << 20)["predicted"]["hier_p2p"] is None, "one host: hier predicted")
    if n >= 4 and n % 2 == 0:
        with make_comm(HVD_LITE_RANKS_PER_HOST=2) as c:
            plan = c.allreduce_plan(1 << 20)
        agree(plan["hosts"] == n // 2 and plan["predicted"]["hier_p2p"] is not None, f"{plan}")
    if n >= 3 and n % 2 == 1:
        with make_comm(HVD_LITE_RANKS_PER_HOST=2) as c:
            plan = c.allreduce_plan(1 << 20)
        agree(plan["predicted"]["hier_p2p"] is None and plan["algorithm"] != "hier_p2p", f"{plan}")


def test_a_bad_ranks_per_host_is_refused():
    raises_on_every_rank(
        hvd.InvalidArgumentError,
        "HVD_LITE_RANKS_PER_HOST=two is not valid",
        lambda: make_comm(HVD_LITE_RANKS_PER_HOST="two").__enter__(),
    )
