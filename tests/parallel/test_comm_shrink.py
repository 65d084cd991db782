"""hvdlCommShrink without a failure (HVDL_SHRINK_DEFAULT, NCCL's ncclCommShrink): the ranks left make
a communicator of their own, in their old order, that runs every collective exactly; the excluded
ranks do not call it; bad arguments are refused before anything is sent. (After a failure,
HVDL_SHRINK_ABORT needs ULFM: tests/system/test_elastic.py's shrink mode.)"""

import numpy as np
import pytest
from conftest import agree, make_comm

import hvd_lite as hvd
from hvd_lite import _core

F32, I32, SUM = _core.hvdlFloat32, _core.hvdlInt32, _core.hvdlSum

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("which", ["last", "first", "every_other"])
def test_the_ranks_left_form_a_communicator_in_their_old_order_that_reduces_exactly(which):
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("one rank: excluding any leaves none")
    excluded = {"last": [n - 1], "first": [0], "every_other": list(range(1, n, 2))}[which]
    left = [q for q in range(n) if q not in excluded]
    with make_comm() as c:
        if r in excluded:
            small = None  # an excluded rank does not call it
        else:
            small = c.shrink(excluded)
            x = np.full(1001, float(r + 1), np.float32)
            small.allreduce(x, x, F32, SUM)
            order = np.zeros(len(left), np.int32)  # each member's old rank, in its new rank's place
            small.allgather(np.array([r], np.int32), order, I32)
            ok = order.tolist() == left
            ok = ok and np.array_equal(x, np.full(1001, float(sum(q + 1 for q in left)), np.float32))
            small.destroy()
        # the parent still works for everybody
        y = np.ones(5, np.float32)
        c.allreduce(y, y, F32, SUM)
    agree(small is None or ok, f"rank {r}: the shrunk communicator of {left} was wrong")
    agree(np.array_equal(y, np.full(5, float(n), np.float32)), "the parent no longer reduces")


@pytest.mark.parametrize(
    "exclude,flags,why",
    [
        ([99], 0, r"excludeRanksList\[0\] = 99 is not a rank of this communicator of \d+"),
        ([-1], 0, r"excludeRanksList\[0\] = -1 is not a rank"),
        ("all", 0, r"excludeRanksList names all \d+ ranks: at least one must be left"),
        ("self", 0, r"rank \d+ is in excludeRanksList: with HVDL_SHRINK_DEFAULT an excluded rank"),
        ("twice", 0, r"rank \d+ is in excludeRanksList twice"),
        ([], 7, r"shrinkFlags 7 is not HVDL_SHRINK_DEFAULT \(0\) or HVDL_SHRINK_ABORT \(1\)"),
    ],
    ids=["out-of-range", "negative", "everyone", "self", "twice", "flags"],
)
def test_bad_arguments_are_refused_on_the_calling_rank_before_anything_is_sent(exclude, flags, why):
    n, r = hvd.size(), hvd.rank()
    if exclude in ("self", "twice") and n == 1:
        pytest.skip("one rank: excluding itself excludes every rank")
    named = {"all": list(range(n)), "self": [r], "twice": [(r + 1) % n] * 2}
    exclude = named[exclude] if isinstance(exclude, str) else exclude
    with make_comm() as c:
        with pytest.raises(hvd.InvalidArgumentError, match=why):
            c.shrink(exclude, flags)
        y = np.ones(3, np.float32)  # nothing was sent: the communicator still works
        c.allreduce(y, y, F32, SUM)
    agree(np.array_equal(y, np.full(3, float(n), np.float32)), "a refused shrink left traffic behind")


def test_abort_without_ulfm_is_refused_as_invalid_usage_on_every_rank():
    if _core.mpi_ft():
        pytest.skip("this job runs with ULFM (mpirun --with-ft ulfm)")
    with make_comm() as c:
        with pytest.raises(hvd.CollectiveError, match=r"HVDL_SHRINK_ABORT needs an MPI with ULFM"):
            c.shrink([], 1)


def test_an_agreement_without_ulfm_is_refused_as_invalid_usage_on_every_rank():
    """hvd.elastic.run's agreement after a failure (MPIX_Comm_agree) needs an MPI with ULFM; its
    use under one: tests/system/test_elastic.py's shrink mode."""
    if _core.mpi_ft():
        pytest.skip("this job runs with ULFM (mpirun --with-ft ulfm)")
    with pytest.raises(hvd.CollectiveError, match=r"an agreement after a failure needs ULFM") as info:
        _core.mpi_agree(None, True)
    assert info.value.code == _core.hvdlInvalidUsage
