"""Every all-gather and reduce-scatter algorithm forced through HVD_LITE_ALLGATHER_ALGO and
HVD_LITE_REDUCESCATTER_ALGO under mpirun at 1-4 ranks: exact results for every dtype (and every op
of the reduce-scatter), in place and out of place, equal blocks through the C API's bare
`_core.Comm` and uneven and empty blocks through the engine; the halving reduce-scatter's fixed
order (the bits of the rd and rab all-reduce, whatever the blocks); the selectors' choices (the
single-copy all-gather, shm, wherever it can run), the forced choice, rank 0's choice agreed, an
unknown name refused, and a forced shm refused where it cannot run, saying why. (The single-copy
all-gather's failures: test_shm.py.)"""

import numpy as np
import pytest
from conftest import agree, make_comm, raises_on_every_rank, reinit, single_copy_runs, skip_unless_single_copy
from helpers import ALL_DTYPES, MOVE_DTYPES, exact_inputs, fold, same_bits

import hvd_lite as hvd
from hvd_lite import _core
from hvd_lite._submit import HVDL_DTYPES

pytestmark = pytest.mark.mpi

GATHER = ["ring", "rd", "rd_far", "shm"]
SCATTER = ["ring", "halving", "shm"]
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
HVD_OPS = {"sum": hvd.Sum, "prod": hvd.Product, "max": hvd.Max, "min": hvd.Min, "avg": hvd.Average}


def code(dtype) -> int:
    """The hvdl datatype code."""
    return HVDL_DTYPES[np.dtype(dtype)]


def counts(n: int):
    """Elements per rank: 0, 1, around n (blocks of the fold's pairs), and a few larger ones that
    cross many 16-byte segments of the rings."""
    return sorted({0, 1, 2, n - 1, n, n + 1, 2 * n + 1, 37, 1009})


def allgather_ok(c, dtype, count, inplace, seed):
    n, r = hvd.size(), hvd.rank()
    x = exact_inputs(dtype, count, r, seed)
    want = np.concatenate([exact_inputs(dtype, count, q, seed) for q in range(n)])
    out = np.zeros(n * count, np.dtype(dtype))
    if inplace:
        out[r * count : (r + 1) * count] = x
        c.allgather(out[r * count : (r + 1) * count], out, code(dtype))
        return same_bits(out, want)
    src = x.copy()
    c.allgather(src, out, code(dtype))
    return same_bits(out, want) and same_bits(src, x)


def reducescatter_ok(c, dtype, op, count, inplace, seed):
    n, r = hvd.size(), hvd.rank()
    whole = exact_inputs(dtype, n * count, r, seed)
    want = fold([exact_inputs(dtype, n * count, q, seed) for q in range(n)], op, dtype)[
        r * count : (r + 1) * count
    ]
    src = whole.copy()
    if inplace:
        c.reducescatter(src, src[r * count : (r + 1) * count], code(dtype), OPS[op])
        return same_bits(src[r * count : (r + 1) * count], want)
    out = np.zeros(count, np.dtype(dtype))
    c.reducescatter(src, out, code(dtype), OPS[op])
    return same_bits(out, want) and same_bits(src, whole)


@pytest.mark.parametrize("algo", GATHER)
def test_every_allgather_algorithm_gathers_every_dtype_exactly_in_place_and_not(algo):
    # 16-byte segments for the rings, 64-byte chunks for the single copy's writes.
    skip_unless_single_copy(algo)
    bad = []
    with make_comm(HVD_LITE_ALLGATHER_ALGO=algo, HVD_LITE_SEGMENT_BYTES=16, HVD_LITE_SHM_BYTES=64) as c:
        agree(c.gather_plan("allgather", 1 << 20)["algorithm"] == algo, "not forced")
        for dtype in MOVE_DTYPES:
            for count in counts(hvd.size()):
                for inplace in (False, True):
                    if not allgather_ok(c, dtype, count, inplace, seed=count):
                        bad.append((np.dtype(dtype).name, count, inplace))
    agree(not bad, f"{algo}: wrong at (dtype, count, in place) {bad[:5]}")


def test_the_shared_memory_allgather_takes_one_step_up_to_its_minimum_and_the_single_copy_above():
    """With the areas of the default size, a forced shm all-gather of at most SHM_ALLGATHER_MIN
    bytes in all goes through the segment in one step (no single copy needed), above through the
    single copy: exact either side of the boundary, many calls in a row (the areas alternate),
    in place and not."""
    skip_unless_single_copy("shm")
    n, least, bad = hvd.size(), _core.SHM_ALLGATHER_MIN, []
    with make_comm(HVD_LITE_ALLGATHER_ALGO="shm") as c:
        for dtype in MOVE_DTYPES:
            per_rank = least // (n * np.dtype(dtype).itemsize)
            for count in sorted({1, 3, per_rank - 1, per_rank, per_rank + 1}):
                for seed in range(3):
                    for inplace in (False, True):
                        if not allgather_ok(c, dtype, count, inplace, seed=seed):
                            bad.append((np.dtype(dtype).name, count, seed, inplace))
    agree(not bad, f"wrong at (dtype, count, seed, in place) {bad[:5]}")


@pytest.mark.parametrize("algo", SCATTER)
def test_every_reducescatter_algorithm_reduces_every_dtype_and_op_exactly_in_place_and_not(algo):
    # 16-byte segments for the rings, 64-byte chunks for the single copy's reads.
    skip_unless_single_copy(algo)
    bad = []
    with make_comm(HVD_LITE_REDUCESCATTER_ALGO=algo, HVD_LITE_SEGMENT_BYTES=16, HVD_LITE_SHM_BYTES=64) as c:
        agree(c.gather_plan("reducescatter", 1 << 20)["algorithm"] == algo, "not forced")
        for dtype in ALL_DTYPES:
            for op in OPS:
                for count in counts(hvd.size()):
                    for inplace in (False, True):
                        if not reducescatter_ok(c, dtype, op, count, inplace, seed=count):
                            bad.append((np.dtype(dtype).name, op, count, inplace))
    agree(not bad, f"{algo}: wrong at (dtype, op, count, in place) {bad[:5]}")


def rows_of(r: int, pattern: int) -> int:
    """Rows a rank sends: uneven, with empty ranks (pattern 0: rank 0 sends none; 1: every odd
    rank; 2: all but the last; 3: none at all)."""
    n = hvd.size()
    return [(r * 3) % 4, 0 if r % 2 else r + 2, 0 if r < n - 1 else 5, 0][pattern]


def engine_allgather_wrong():
    """hvd.allgather of uneven and empty blocks on the current engine: the (dtype, pattern, row
    shape) it got wrong."""
    n, r = hvd.size(), hvd.rank()
    bad = []
    for dtype in (np.float32, np.int8, np.float64, np.bool_):
        for pattern in range(4):
            for rest in ((), (3,)):
                k = int(np.prod(rest, dtype=int))
                mine = exact_inputs(dtype, rows_of(r, pattern) * k, r, pattern)
                want = np.concatenate(
                    [exact_inputs(dtype, rows_of(q, pattern) * k, q, pattern) for q in range(n)]
                )
                got = hvd.allgather(mine.reshape((rows_of(r, pattern),) + rest))
                if not same_bits(got.reshape(-1), want):
                    bad.append((np.dtype(dtype).name, pattern, rest))
    return bad


def engine_reducescatter_wrong():
    """hvd.reducescatter of rows cut unevenly (the first ranks one more; with fewer rows than ranks
    the last blocks empty) on the current engine: the (dtype, op, rows) it got wrong."""
    n, r = hvd.size(), hvd.rank()
    bad = []
    for dtype in (np.float32, np.int32, np.float16):
        for op in OPS:
            for rows in sorted({0, 1, n - 1, n + 1, 2 * n + 3, 101}):
                x = exact_inputs(dtype, rows * 3, r, seed=rows).reshape(rows, 3)
                full = fold(
                    [exact_inputs(dtype, rows * 3, q, seed=rows) for q in range(n)], op, dtype
                ).reshape(rows, 3)
                starts = np.cumsum([0] + [rows // n + (q < rows % n) for q in range(n)])
                got = hvd.reducescatter(x, op=HVD_OPS[op])
                if not same_bits(got, full[starts[r] : starts[r + 1]]):
                    bad.append((np.dtype(dtype).name, op, rows))
    return bad


@pytest.mark.parametrize("algo", GATHER)
def test_every_allgather_algorithm_gathers_uneven_and_empty_blocks_through_the_engine(algo):
    skip_unless_single_copy(algo)
    with reinit(HVD_LITE_ALLGATHER_ALGO=algo, HVD_LITE_SEGMENT_BYTES=16, HVD_LITE_SHM_BYTES=64):
        bad = engine_allgather_wrong()
    agree(not bad, f"{algo}: wrong at (dtype, pattern, row shape) {bad[:5]}")


@pytest.mark.parametrize("algo", SCATTER)
def test_every_reducescatter_algorithm_reduces_uneven_and_empty_blocks_through_the_engine(algo):
    # The engine cuts the rows as evenly as it can, the first ranks taking one more: with fewer
    # rows than ranks the last blocks are empty.
    skip_unless_single_copy(algo)
    with reinit(HVD_LITE_REDUCESCATTER_ALGO=algo, HVD_LITE_SEGMENT_BYTES=16, HVD_LITE_SHM_BYTES=64):
        bad = engine_reducescatter_wrong()
    agree(not bad, f"{algo}: wrong at (dtype, op, rows) {bad[:5]}")


def random_floats(count, seed):
    """Order-dependent float32 sums: identity must not depend on luck."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(count) * 10.0 ** rng.integers(-6, 6, count)).astype(np.float32)


@pytest.mark.parametrize(
    "reducescatter,allreduce", [("ring", "ring"), ("halving", "rd"), ("halving", "rab"), ("shm", "ring")]
)
def test_the_reducescatter_gives_its_allreduces_bits_reruns_and_in_place_alike(reducescatter, allreduce):
    # The ring: with n * count elements the ring all-reduce cuts chunks of `count`, the
    # reduce-scatter's blocks, and both combine block k in the order k+1, k+2, ..., k; so does the
    # single copy (shm), chunk by chunk of 4 KiB. Halving, rd and rab all build the balanced tree
    # over the ranks in order, element by element.
    skip_unless_single_copy(reducescatter)
    with make_comm(
        HVD_LITE_SEGMENT_BYTES=4096,
        HVD_LITE_REDUCESCATTER_ALGO=reducescatter,
        HVD_LITE_ALLREDUCE_ALGO=allreduce,
        HVD_LITE_SHM_BYTES=4096,
    ) as c:
        for count in (1, 777, 20_000):
            agree(
                gives_the_allreduces_block(c, count, "sum"),
                f"count {count}: the {reducescatter} reduce-scatter differs from the {allreduce} "
                "all-reduce's block",
            )


def gives_the_allreduces_block(c, count: int, op: str) -> bool:
    """Whether c's reduce-scatter of n * count order-dependent floats gives this rank's block of c's
    all-reduce of them, bit for bit: twice, and in place."""
    n, r = hvd.size(), hvd.rank()
    x = random_floats(n * count, 300 + r)
    every = np.empty_like(x)
    c.allreduce(x, every, code(np.float32), OPS[op])
    outs = [np.empty(count, np.float32) for _ in range(2)]
    for out in outs:
        c.reducescatter(x, out, code(np.float32), OPS[op])
    inplace = x.copy()
    mine = inplace[r * count : (r + 1) * count]
    c.reducescatter(inplace, mine, code(np.float32), OPS[op])
    want = every[r * count : (r + 1) * count]
    return same_bits(outs[0], want) and same_bits(outs[1], want) and same_bits(mine, want)


def test_the_halving_reducescatter_of_uneven_blocks_gives_the_rab_allreduces_bits():
    n, r = hvd.size(), hvd.rank()
    with reinit(HVD_LITE_REDUCESCATTER_ALGO="halving", HVD_LITE_ALLREDUCE_ALGO="rab"):
        for rows in (n + 1, 2 * n + 3, 1001):
            x = random_floats(rows * 5, 400 + r).reshape(rows, 5)
            every = hvd.allreduce(x, op=hvd.Sum, name=f"every.{rows}")
            starts = np.cumsum([0] + [rows // n + (q < rows % n) for q in range(n)])
            got = hvd.reducescatter(x, op=hvd.Sum, name=f"mine.{rows}")
            agree(
                same_bits(got, every[starts[r] : starts[r + 1]]),
                f"rows {rows}: reduce-scatter differs from the rab all-reduce's rows",
            )


def test_the_allgather_selector_takes_shm_on_one_host_in_one_step_up_to_its_minimum_and_the_single_copy_above():  # noqa: E501
    runs, least = single_copy_runs(), _core.SHM_ALLGATHER_MIN
    model = {"ring", "rd", "rd_far"}
    for cma in ("1", "0"):
        for area in ("262144", "64"):  # an area of 64 bytes holds no 4 KiB all-gather
            with make_comm(HVD_LITE_SHM_CMA=cma, HVD_LITE_SHM_BYTES=area) as c:
                one_host = c.shm_layout() is not None and c.shm_layout()[0] == 1
                tiny = c.gather_plan("allgather", 4)["algorithm"]
                small = c.gather_plan("allgather", least)["algorithm"]
                large = {c.gather_plan("allgather", b)["algorithm"] for b in (least + 1, 1 << 30)}
                shm_predicted = c.gather_plan("allgather", 4096)["predicted"]["shm"]
            want_large = {"shm"} if runs and cma == "1" else None
            agree(
                (tiny == "shm" if one_host else tiny in model)  # 4 B fit any area
                and (small == "shm" if one_host and area != "64" else small in model)
                and (large == want_large if want_large else large <= model)
                and shm_predicted is None,
                f"HVD_LITE_SHM_CMA={cma}, areas of {area} B, one host: {one_host}, single copy "
                f"runs: {runs}; picks at 4 B {tiny}, at {least} B {small}, above {large}; shm's "
                f"predicted time {shm_predicted}",
            )


def test_the_reducescatter_selector_takes_the_single_copy_on_one_host_above_its_minimum():
    runs, least = single_copy_runs(), _core.SHM_REDUCESCATTER_MIN
    model = {"ring", "halving"}
    for cma in ("1", "0"):
        with make_comm(HVD_LITE_SHM_CMA=cma) as c:
            small = c.gather_plan("reducescatter", least)["algorithm"]
            large = {c.gather_plan("reducescatter", b)["algorithm"] for b in (least + 1, 1 << 30)}
            shm_predicted = c.gather_plan("reducescatter", 1 << 20)["predicted"]["shm"]
        want_large = {"shm"} if runs and cma == "1" else None
        agree(
            small in model
            and (large == want_large if want_large else large <= model)
            and shm_predicted is None,
            f"HVD_LITE_SHM_CMA={cma}, single copy runs: {runs}; picks at {least} B {small}, "
            f"above {large}; shm's predicted time {shm_predicted}",
        )


def test_the_selectors_pick_the_cheapest_modelled_the_ring_where_its_steps_are_few():
    # The model's picks: without the shared-memory forms (HVD_LITE_SHM=0), which are not modelled.
    n = hvd.size()
    if n > 4:
        pytest.skip(
            "the picks pinned below are one host's at 1-4 ranks (past 4 the fold's steps move the crossovers)"
        )
    with make_comm(HVD_LITE_SHM=0) as c:
        picks = {}
        # hier_p2p (test_hier_p2p_collectives.py) needs several hosts: named, not modelled, on one.
        for coll, names in (("allgather", GATHER + ["hier_p2p"]), ("reducescatter", SCATTER + ["hier_p2p"])):
            for nbytes in (4096, 1 << 20, 1 << 30):
                plan = c.gather_plan(coll, nbytes)
                picks[coll, nbytes] = plan["algorithm"]
                modelled = {k: v for k, v in plan["predicted"].items() if v is not None}
                agree(
                    set(plan["predicted"]) == set(names)
                    and set(modelled) == set(names) - {"shm", "hier_p2p"},
                    f"{coll}: {plan}",
                )
                best = min(modelled.values())
                agree(n == 1 or modelled[plan["algorithm"]] == best, f"{coll}: {plan}")
    # One host. The reduce-scatter: the ring overlaps reducing with receiving, the halving steps do
    # not (and add the fold's two at 3 ranks), so the ring but for 4 KiB on 4 ranks (two steps
    # against three). The all-gather: a tie at 2 ranks (one step each) goes to the ring, the fold's
    # steps keep it at 3; at 4 ranks rd's two steps beat the ring's three, moving the same bytes.
    want_rs = {4096: "halving" if n == 4 else "ring", 1 << 20: "ring", 1 << 30: "ring"}
    want_ag = "ring" if n < 4 else "rd"
    agree(n == 1 or all(picks["reducescatter", b] == want_rs[b] for b in want_rs), f"{picks}")
    agree(n == 1 or all(picks["allgather", b] == want_ag for b in want_rs), f"{picks}")


def test_unknown_allgather_and_reducescatter_algorithms_are_refused_when_the_communicator_is_made():
    raises_on_every_rank(
        hvd.InvalidArgumentError,
        "HVD_LITE_ALLGATHER_ALGO=halving is not valid",
        lambda: make_comm(HVD_LITE_ALLGATHER_ALGO="halving").__enter__(),
    )
    raises_on_every_rank(
        hvd.InvalidArgumentError,
        "HVD_LITE_REDUCESCATTER_ALGO=rd is not valid",
        lambda: make_comm(HVD_LITE_REDUCESCATTER_ALGO="rd").__enter__(),
    )


@pytest.mark.parametrize("var", ["HVD_LITE_ALLGATHER_ALGO", "HVD_LITE_REDUCESCATTER_ALGO"])
def test_a_forced_single_copy_allgather_or_reducescatter_that_cannot_run_is_refused_saying_why(var):
    n = hvd.size()
    if n == 1:  # one rank runs anything (a copy), as the all-reduce
        with make_comm(**{var: "shm", "HVD_LITE_SHM_CMA": "0"}) as c:
            ok = (
                allgather_ok(c, np.float32, 1001, False, 1)
                if "GATHER" in var
                else reducescatter_ok(c, np.float32, "sum", 1001, False, 1)
            )
        agree(ok, f"{var}=shm on one rank: a wrong copy")
        return
    why = {
        "HVD_LITE_SHM_CMA": "its single copy is off \\(HVD_LITE_SHM_CMA=0\\)",
        "HVD_LITE_SHM": "it works through the shared-memory path, which is off \\(HVD_LITE_SHM=0\\)",
    }
    for knob, reason in why.items():
        raises_on_every_rank(
            hvd.InvalidArgumentError,
            f"{var}=shm cannot run on this communicator of {n} ranks: {reason}",
            lambda: make_comm(**{var: "shm", knob: "0"}).__enter__(),
        )
    raises_on_every_rank(  # emulated hosts of one rank each
        hvd.InvalidArgumentError,
        f"{var}=shm cannot run .*: no two ranks share",
        lambda: make_comm(**{var: "shm", "HVD_LITE_RANKS_PER_HOST": "1"}).__enter__(),
    )


def test_rank_0s_allgather_and_reducescatter_algorithms_are_every_ranks():
    r = hvd.rank()
    with make_comm(
        HVD_LITE_ALLGATHER_ALGO="rd_far" if r == 0 else "ring",
        HVD_LITE_REDUCESCATTER_ALGO="halving" if r == 0 else "ring",
    ) as c:
        plans = [c.gather_plan(coll, 1 << 20)["algorithm"] for coll in ("allgather", "reducescatter")]
        ok = allgather_ok(c, np.float32, 1001, False, 1) and reducescatter_ok(
            c, np.float32, "sum", 1001, False, 1
        )
    agree(plans == ["rd_far", "halving"] and ok, f"{plans}, right {ok}")
