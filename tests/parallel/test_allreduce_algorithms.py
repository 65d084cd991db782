"""Every all-reduce algorithm forced through HVD_LITE_ALLREDUCE_ALGO (the C API's bare `_core.Comm`)
under mpirun at 1-4 ranks: exact results for every dtype and op, in place and out of place, counts
around the block boundaries; bitwise identity across ranks and reruns on order-dependent floats; the
fixed reduction trees (recursive doubling and Rabenseifner: the balanced tree over the ranks, the
same bits; the latency path: rank order); hvdlReduce's root gets the all-reduce's bits; the
selector's choices and the cost model file."""

import os

import numpy as np
import pytest
from conftest import agree, make_comm, raises_on_every_rank, world
from helpers import ALL_DTYPES, exact_inputs, fold, same_bits

import hvd_lite as hvd
from hvd_lite import _core
from hvd_lite._submit import HVDL_DTYPES

pytestmark = pytest.mark.mpi

ALGOS = ["ring", "rd", "rab", "tree", "small", "shm"]
# With the hierarchical ones: hier across emulated hosts of 2 ranks, so beyond 2 ranks only; hier_p2p
# across emulated hosts of one size (2 ranks, or 1 where n is odd or 2).
WITH_HIER = ALGOS + ["hier", "hier_p2p"]
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
F32 = 7


def code(dtype) -> int:
    """The hvdl datatype code."""
    return HVDL_DTYPES[np.dtype(dtype)]


def forced(algo: str) -> dict:
    """The variables that force algo (hier, hier_p2p: on emulated hosts); skips where it cannot run."""
    n = hvd.size()
    if algo == "hier":
        if n <= 2:
            pytest.skip("hier needs several hosts: more than 2 ranks in hosts of 2")
        return {"HVD_LITE_ALLREDUCE_ALGO": algo, "HVD_LITE_RANKS_PER_HOST": 2}
    if algo == "hier_p2p":
        if n == 1:
            pytest.skip("hier_p2p needs several hosts")
        return {"HVD_LITE_ALLREDUCE_ALGO": algo, "HVD_LITE_RANKS_PER_HOST": 2 if n % 2 == 0 and n > 2 else 1}
    return {"HVD_LITE_ALLREDUCE_ALGO": algo}


def counts(n: int):
    """0, every count up to 2n+1 (empty and uneven blocks of the p-block split), and larger odd ones."""
    return sorted(set(range(0, 2 * n + 2)) | {4 * n - 1, 4 * n + 1, 1009, 4099})


def order_dependent(count: int, seed: int) -> np.ndarray:
    """float32 values over 12 decades: their sum's bits depend on the order of the additions."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(count) * 10.0 ** rng.integers(-6, 6, count)).astype(np.float32)


def balanced_tree_sum(values):
    """transport.h's tree: fold ranks 2i, 2i+1 (i < n - p) first, then join aligned groups of 1, 2, 4 ...
    virtual ranks, lower group on the left."""
    n = len(values)
    p = 1
    while p * 2 <= n:
        p *= 2
    rem = n - p
    level = [values[2 * v] + values[2 * v + 1] if v < rem else values[v + rem] for v in range(p)]
    while len(level) > 1:
        level = [level[i] + level[i + 1] for i in range(0, len(level), 2)]
    return level[0]


def exact_for_every_dtype_and_op(c, counts, where):
    """c's all-reduce of exact inputs, in place and not, against the reference, for every dtype, op and
    count; the input left as it was."""
    n, r = hvd.size(), hvd.rank()
    for dtype in ALL_DTYPES:
        for op in OPS:
            for count in counts:
                seed = count + 31 * OPS[op]
                x = exact_inputs(dtype, count, r, seed)
                want = fold([exact_inputs(dtype, count, q, seed) for q in range(n)], op, dtype)
                out = np.zeros(count, np.dtype(dtype))
                c.allreduce(x, out, code(dtype), OPS[op])
                inplace = x.copy()
                c.allreduce(inplace, inplace, code(dtype), OPS[op])
                agree(
                    same_bits(out, want)
                    and same_bits(inplace, want)
                    and same_bits(x, exact_inputs(dtype, count, r, seed)),
                    f"{where}: {np.dtype(dtype).name} {op} count={count}: out "
                    f"{out[:5]}, in place {inplace[:5]}, want {want[:5]}",
                )


@pytest.mark.parametrize("algo", ALGOS)
def test_every_algorithm_gives_exact_results_for_every_dtype_and_op(algo):
    with make_comm(HVD_LITE_ALLREDUCE_ALGO=algo) as c:
        exact_for_every_dtype_and_op(c, counts(hvd.size()), algo)


@pytest.mark.parametrize("algo", WITH_HIER)
def test_every_algorithm_is_bitwise_identical_across_ranks_in_place_and_on_rerun(algo):
    r = hvd.rank()
    with make_comm(**forced(algo)) as c:
        for count in (3, 1000, 33_333):
            x = order_dependent(count, 100 + r)
            out, again = np.empty_like(x), np.empty_like(x)
            c.allreduce(x, out, F32, OPS["sum"])
            inplace = x.copy()
            c.allreduce(inplace, inplace, F32, OPS["sum"])
            c.allreduce(x, again, F32, OPS["sum"])
            everyone = world().allgather(out.tobytes())
            agree(all(b == everyone[0] for b in everyone), f"{algo} count {count}: ranks differ")
            agree(
                same_bits(out, inplace) and same_bits(out, again),
                f"{algo} count {count}: in place or a rerun differs",
            )


def test_recursive_doubling_and_rabenseifner_reduce_in_the_balanced_tree_order():
    n, r = hvd.size(), hvd.rank()
    for count in (1, n + 1, 1000, 4099):
        inputs = [order_dependent(count, 7 * count + q) for q in range(n)]
        want = balanced_tree_sum(inputs)
        for algo in ("rd", "rab"):
            with make_comm(HVD_LITE_ALLREDUCE_ALGO=algo) as c:
                out = np.empty(count, np.float32)
                c.allreduce(inputs[r], out, F32, OPS["sum"])
            agree(same_bits(out, want), f"{algo} count {count}: got {out[:3]}, want {want[:3]}")


def binomial_tree_sum(values, r=0, width=None):
    """allreduce_tree.c's order: rank r's subtree (ranks r .. r+width-1) is x(r), then each child
    r+m's subtree (m = 1, 2, 4 ...) added on the right."""
    n = len(values)
    width = n if width is None else width
    acc, m = values[r], 1
    while m < width and r + m < n:
        acc = acc + binomial_tree_sum(values, r + m, m)
        m *= 2
    return acc


def test_the_tree_reduces_each_subtree_lower_ranks_first_and_broadcasts_rank_0s_bytes():
    n, r = hvd.size(), hvd.rank()
    for count in (1, n + 1, 1000, 4099):
        inputs = [order_dependent(count, 11 * count + q) for q in range(n)]
        want = binomial_tree_sum(inputs)
        with make_comm(HVD_LITE_ALLREDUCE_ALGO="tree") as c:
            out = np.empty(count, np.float32)
            c.allreduce(inputs[r], out, F32, OPS["sum"])
        agree(same_bits(out, want), f"tree count {count}: got {out[:3]}, want {want[:3]}")


def test_the_latency_path_reduces_in_rank_order():
    n, r = hvd.size(), hvd.rank()
    inputs = [order_dependent(999, 50 + q) for q in range(n)]
    want = inputs[0].copy()
    for v in inputs[1:]:
        want = want + v
    with make_comm(HVD_LITE_ALLREDUCE_ALGO="small") as c:
        out = np.empty(999, np.float32)
        c.allreduce(inputs[r], out, F32, OPS["sum"])
    agree(same_bits(out, want), f"got {out[:3]}, want {want[:3]}")


@pytest.mark.parametrize("algo", WITH_HIER)
def test_reduce_gives_the_root_the_bits_of_the_allreduce(algo):
    n, r = hvd.size(), hvd.rank()
    with make_comm(**forced(algo)) as c:
        for count in (5, 4099, 300_001):  # shm: both sides of the crossover
            x = order_dependent(count, 900 + r)
            full = np.empty_like(x)
            c.allreduce(x, full, F32, OPS["avg"])
            for root in range(n):
                out = np.full_like(x, np.nan)
                c.reduce(x, out if r == root else None, F32, OPS["avg"], root)
                agree(
                    r != root or same_bits(out, full),
                    f"{algo} count {count} root {root}: {out[:3]} against {full[:3]}",
                )


@pytest.mark.parametrize("cma", [1, 0], ids=["single-copy", "areas-only"])
def test_the_selector_takes_the_shared_memory_path_on_one_host_up_to_its_crossover(cma):
    # Up to SHM_ALLREDUCE_MAX through the segment's areas; above it, where the single-copy form
    # runs (the peers' memory readable: Comm.shm_cma()), still the shared-memory path, else the
    # model's choice.
    n, top = hvd.size(), _core.SHM_ALLREDUCE_MAX  # algorithms.h: 1 MiB, measured
    with make_comm(HVD_LITE_SHM_CMA=cma) as c:
        single = c.shm_cma()
        agree(cma or not single, "HVD_LITE_SHM_CMA=0 left the single-copy form on")
        for nbytes in (4, 4096, 1 << 16, top, top + 4, 4 << 20, 1 << 26):
            plan = c.allreduce_plan(nbytes)
            want = "shm" if nbytes <= top or single else ("ring" if n == 2 else None)
            # (one rank runs no algorithm: the call is a copy); above 4 MiB the model's choice
            agree(
                (n == 1 or plan["algorithm"] == want or (want is None and plan["algorithm"] != "shm"))
                and plan["predicted"]["shm"] is None
                and plan["predicted"]["hier"] is None
                and plan["predicted"]["hier_p2p"] is None,
                f"{nbytes} B: {plan}",
            )


def test_the_selector_keeps_the_measured_crossover_on_one_host_without_shared_memory():
    n = hvd.size()
    with make_comm(HVD_LITE_SHM=0) as c:
        small = 128 * 1024 if n == 2 else 2048
        below, above = c.allreduce_plan(small), c.allreduce_plan(small + 4)
        agree(below["hosts"] == 1 and below["local_size"] == n, f"layout {below}")
        if n > 1:
            agree(below["algorithm"] == "small", f"{small} B: {below}")
            agree(above["algorithm"] != "small", f"{small + 4} B: {above}")
        if n == 2:  # today's choice at 2 ranks: the ring above the crossover, at every size
            for nbytes in (small + 4, 1 << 20, 1 << 26):
                agree(c.allreduce_plan(nbytes)["algorithm"] == "ring", f"{nbytes} B")


def test_a_forced_algorithm_is_chosen_at_every_size():
    with make_comm(HVD_LITE_ALLREDUCE_ALGO="rab") as c:
        agree(all(c.allreduce_plan(b)["algorithm"] == "rab" for b in (4, 1 << 20)), "rab not kept")


def test_the_model_weighs_both_hierarchical_paths_across_emulated_hosts():
    n = hvd.size()
    # the default terms, not this machine's measured ones (whose noise can make tree win at 4 B)
    with make_comm(HVD_LITE_RANKS_PER_HOST=2, HVD_LITE_COST_MODEL_MEASURE=0) as c:
        plans = [c.allreduce_plan(b) for b in (4, 1 << 20, 1 << 26)]
    for p in plans:
        if n > 2:  # hosts of 2 (and 1): hier is a candidate, shm is not; hier_p2p where hosts are equal
            p2p = p["predicted"]["hier_p2p"]
            agree(
                p["hosts"] == (n + 1) // 2
                and p["local_size"] == 2
                and p["predicted"]["hier"] > 0
                and (p2p > 0 if n % 2 == 0 else p2p is None)
                and p["algorithm"] in ("ring", "rd", "rab", "hier", "hier_p2p"),
                f"{p}",
            )
        else:  # one host (one rank runs no algorithm; shm up to 128 KiB)
            agree(
                (n == 1 or p["algorithm"] in ("shm", "ring"))
                and p["predicted"]["hier"] is None
                and p["predicted"]["hier_p2p"] is None,
                f"{p}",
            )


@pytest.mark.parametrize(
    "algo,env,why",
    [
        ("shm", {"HVD_LITE_SHM": 0}, r"the shared-memory path is off \(HVD_LITE_SHM=0\)"),
        ("hier", {"HVD_LITE_SHM": 0}, r"it works through the shared-memory path, which is off"),
        ("hier", {}, r"every rank is on one host \(use shm\)"),
        (
            "shm",
            {"HVD_LITE_RANKS_PER_HOST": 2},
            r"the ranks are on more than one host \(use hier or hier_p2p\)",
        ),
        ("hier_p2p", {}, r"all \d ranks are on one host"),
    ],
    ids=["shm-off", "hier-shm-off", "hier-one-host", "shm-several-hosts", "hier_p2p-one-host"],
)
def test_a_forced_algorithm_that_cannot_run_here_is_refused_at_init_with_why(algo, env, why):
    n = hvd.size()
    several = n > 2 and "HVD_LITE_RANKS_PER_HOST" in env
    if n == 1 or ("HVD_LITE_RANKS_PER_HOST" in env and not several):
        with make_comm(HVD_LITE_ALLREDUCE_ALGO=algo, **env) as c:  # one rank only copies; one host
            y = np.ones(3, np.float32)
            c.allreduce(y, y, F32, OPS["sum"])
            agree(np.array_equal(y, np.full(3, float(n))), f"{algo} {env}: {y}")
        return
    raises_on_every_rank(
        hvd.InvalidArgumentError,
        rf"HVD_LITE_ALLREDUCE_ALGO={algo} cannot run on this communicator of {n} "
        rf"ranks: {why}",
        lambda: make_comm(HVD_LITE_ALLREDUCE_ALGO=algo, **env).__enter__(),
    )


def test_rank_0s_forced_shared_memory_path_is_every_ranks():
    r = hvd.rank()
    with make_comm(HVD_LITE_ALLREDUCE_ALGO="shm" if r == 0 else "ring") as c:
        plans = [c.allreduce_plan(b)["algorithm"] for b in (4, 1 << 20)]
    agree(plans == ["shm", "shm"], f"{plans}")
    if hvd.size() > 2:  # rank 0's hier across emulated hosts, though the others ask for rd
        with make_comm(HVD_LITE_RANKS_PER_HOST=2, HVD_LITE_ALLREDUCE_ALGO="hier" if r == 0 else "rd") as c:
            agree(c.allreduce_plan(64)["algorithm"] == "hier", "hier not agreed")


def test_rank_0s_shared_memory_settings_are_every_ranks():
    r = hvd.rank()
    with make_comm(
        HVD_LITE_SHM="1" if r == 0 else "0", HVD_LITE_SHM_BYTES="65536" if r == 0 else "1048576"
    ) as c:
        layout = c.shm_layout()
        y = np.arange(100003, dtype=np.float32)
        c.allreduce(y, y, F32, OPS["sum"])
        ok = np.array_equal(y, np.arange(100003, dtype=np.float32) * hvd.size())
    agree(ok and (hvd.size() == 1 or layout is not None), f"layout {layout}, exact {ok}")
    with make_comm(HVD_LITE_SHM="0" if r == 0 else "1") as c:
        agree(c.shm_layout() is None, "rank 0 turned the shared-memory path off")
    with make_comm(HVD_LITE_SHM_CMA="0" if r == 0 else "1") as c:
        agree(not c.shm_cma(), "rank 0 turned the single-copy form off")


def test_an_unknown_algorithm_is_refused_when_the_communicator_is_made():
    raises_on_every_rank(
        hvd.InvalidArgumentError,
        "HVD_LITE_ALLREDUCE_ALGO=tri is not valid",
        lambda: make_comm(HVD_LITE_ALLREDUCE_ALGO="tri").__enter__(),
    )


def test_the_forced_latency_path_refuses_more_than_64_mib_before_sending():
    with make_comm(HVD_LITE_ALLREDUCE_ALGO="small") as c:
        if hvd.size() > 1:  # one rank only copies: no algorithm runs
            x = np.empty((1 << 24) + 1, np.float32)  # 64 MiB + 4 B, never touched
            raises_on_every_rank(
                hvd.InvalidArgumentError, "over the latency path", lambda: c.allreduce(x, x, F32, OPS["sum"])
            )
        y = np.ones(3, np.float32)
        c.allreduce(y, y, F32, OPS["sum"])
        agree(np.array_equal(y, np.full(3, float(hvd.size()))), f"after the refusal: {y}")


def test_the_cost_model_file_sets_the_terms_and_a_bad_line_is_refused(tmp_path_factory):
    r = hvd.rank()
    path = os.path.join(str(tmp_path_factory.mktemp(f"model{r}")), "model.conf")
    with open(path, "w") as f:
        f.write("# a model\nintra_alpha 1e-3   # slow messages\nintra_beta 0\ngamma 0\n")
    with make_comm(HVD_LITE_COST_MODEL_FILE=path) as c:
        plan = c.allreduce_plan(1 << 20)
    n = hvd.size()
    # ring: 2(n-1) messages of 1 ms, nothing else costs; rd on a power of two: log2(n) of them
    agree(n == 1 or abs(plan["predicted"]["ring"] - 2e-3 * (n - 1)) < 1e-9, f"{plan}")
    with open(path, "w") as f:
        f.write("intra_alpha 1e-6\nintra_bandwidth 10\n")
    raises_on_every_rank(
        hvd.InvalidArgumentError,
        r"line 2: expected `key value`",
        lambda: make_comm(HVD_LITE_COST_MODEL_FILE=path).__enter__(),
    )


# Terms under which a lane of hier (2 hosts, 1 MiB a lane) takes Rabenseifner on one NIC of its own
# and the ring on one shared by 2 lanes: with gamma above beta the ring's bytes cost b/2 beta less
# per lane share, and its latency at the 45 us step (the fail-safe rule's worst case) 80 us more.
SHARED_NIC_TERMS = "inter_alpha 5e-6\ninter_beta 1e-10\ninter_alpha_step 4194304 45e-6\ngamma 1e-9\n"


def test_hiers_lanes_run_what_the_selector_prices_them_as_running(tmp_path):
    # The selector prices hier with what its lanes' own communicator (comm->cross, one rank a host,
    # its NIC shared by the host's lanes) picks; every lane holder's pick must be that one.
    n = hvd.size()
    model = tmp_path / "shared_nic.conf"
    model.write_text(SHARED_NIC_TERMS)
    with make_comm(HVD_LITE_RANKS_PER_HOST=2, HVD_LITE_COST_MODEL_FILE=str(model)) as c:
        plans = {b: c.allreduce_plan(b) for b in (4096, 1 << 20, 2 << 20, 64 << 20)}
    for b, p in plans.items():
        if n <= 2:  # one host: no lanes
            agree(p["hier_lane"] is None and p["hier_lane_runs"] is None, f"{b} B: {p}")
            continue
        runs = p["hier_lane_runs"]
        agree(runs is None or runs == p["hier_lane"], f"{b} B: priced {p['hier_lane']}, runs {runs}")
    holders = world().allgather(plans[2 << 20]["hier_lane_runs"] is not None)
    lanes = 2 if n % 2 == 0 else 1  # the fewest ranks on a host
    agree(n <= 2 or sum(holders) == (n + 1) // 2 * lanes, f"lane holders {holders}")
    if n == 4:  # 2 hosts of 2: 2 lanes share each NIC, and take the ring; one lane would take rab
        agree(plans[2 << 20]["hier_lane"] == "ring", f"{plans[2 << 20]}")


def test_rank_0s_algorithm_crossover_and_model_file_are_every_ranks(tmp_path_factory):
    n, r = hvd.size(), hvd.rank()
    path = os.path.join(str(tmp_path_factory.mktemp(f"own{r}")), "model.conf")
    if r == 0:
        with open(path, "w") as f:
            f.write("intra_alpha 1e-3\n")
    # the other ranks name a file that does not exist, another algorithm and crossover
    env = (
        {"HVD_LITE_ALLREDUCE_ALGO": "rab", "HVD_LITE_SMALL_ALLREDUCE_BYTES": 64}
        if r == 0
        else {"HVD_LITE_ALLREDUCE_ALGO": "ring", "HVD_LITE_SMALL_ALLREDUCE_BYTES": 0}
    )
    with make_comm(HVD_LITE_COST_MODEL_FILE=path, **env) as c:
        plan = c.allreduce_plan(1 << 20)
        x = exact_inputs(np.float32, 1001, r)
        out = np.empty_like(x)
        c.allreduce(x, out, F32, OPS["sum"])
    want = fold([exact_inputs(np.float32, 1001, q) for q in range(n)], "sum", np.float32)
    agree(plan["algorithm"] == "rab" and same_bits(out, want), f"{plan['algorithm']}: {out[:3]}")
    # rank 0's file: 2(n-1) messages of 1 ms each (the default is 1.5 us)
    agree(plan["predicted"]["ring"] >= 2e-3 * (n - 1), f"{plan['predicted']}")
