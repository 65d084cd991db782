"""hvd_lite.run.run(func): real jobs started from this process."""

import time

import pytest

from hvd_lite.exceptions import LauncherError, RemoteRankError
from hvd_lite.run import run


def rank_and_size(offset, scale=1):
    import hvd_lite as hvd

    hvd.init()
    time.sleep(0.2 * (hvd.size() - hvd.rank()))  # higher ranks answer first
    return {"rank": hvd.rank(), "size": hvd.size(), "value": (hvd.rank() + offset) * scale}


def fail_on_rank_one():
    import hvd_lite as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise KeyError("no such parameter on rank 1")
    return hvd.rank()


def test_results_come_back_in_rank_order():
    results = run(rank_and_size, args=(10,), kwargs={"scale": 2}, np=3)
    assert results == [{"rank": r, "size": 3, "value": (r + 10) * 2} for r in range(3)]


def test_closures_and_large_results_travel():
    n = 50_000  # the result pickles to ~250 kB: over a hundred marker lines per rank
    assert run(lambda: list(range(n)), np=2) == [list(range(n))] * 2


def test_a_payload_too_large_for_the_environment_is_refused_before_launch():
    big = bytes(200_000)
    with pytest.raises(LauncherError, match="pass large data through files"):
        run(lambda: len(big), np=1)


def test_remote_exception_is_raised_with_rank_and_traceback():
    with pytest.raises(RemoteRankError) as info:
        run(fail_on_rank_one, np=2)
    err = info.value
    assert err.rank == 1
    assert isinstance(err.exception, KeyError) and isinstance(err.__cause__, KeyError)
    assert "in fail_on_rank_one" in err.remote_traceback
    assert "KeyError: 'no such parameter on rank 1'" in err.remote_traceback
    assert str(err).startswith("rank 1 raised an exception; its traceback:")


def test_a_rank_that_dies_without_an_answer_is_a_launcher_error():
    def die():
        import os

        os._exit(9)

    with pytest.raises(LauncherError, match=r"got no result from rank\(s\) 0.*exit code 9"):
        run(die, np=1)
