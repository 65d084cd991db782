"""The benchmark's helpers: size parsing and steps, and the exact input patterns."""

import itertools

import numpy as np
import pytest

from hvd_lite.bench import common, exact
from hvd_lite.bench.__main__ import build_parser


@pytest.mark.parametrize(
    "text,nbytes",
    [("4", 4), ("64K", 65536), ("1M", 1 << 20), ("256M", 256 << 20), ("1G", 1 << 30), ("8KiB", 8192)],
)
def test_parse_size_accepts_nccl_tests_suffixes(text, nbytes):
    assert common.parse_size(text) == nbytes


def test_parse_size_rejects_garbage_with_the_text_in_the_message():
    with pytest.raises(ValueError, match="'12Q'"):
        common.parse_size("12Q")


def test_size_range_steps_by_the_factor_and_includes_the_maximum():
    assert common.size_range(4, 64, 2) == [4, 8, 16, 32, 64]
    assert common.size_range(4, 4, 2) == [4]
    assert common.size_range(1024, 5000, 4) == [1024, 4096]


def test_every_registered_command_parses_its_defaults():
    parser = build_parser()
    assert parser.parse_args(["allreduce", "-b", "64K", "-e", "1M"]).maxbytes == 1 << 20
    assert parser.parse_args(["kernels"]).repeats >= 1
    for name in ("allgather", "reducescatter", "broadcast"):
        assert parser.parse_args([name, "-e", "1M"]).maxbytes == 1 << 20
    assert parser.parse_args(["model", "--algo", "rd", "--algo", "rab"]).algo == ["rd", "rab"]


@pytest.mark.parametrize(
    "name,op,n", list(itertools.product(list(common.DTYPES), ["sum", "prod", "max", "min"], [2, 3, 4, 8]))
)
def test_expected_pattern_does_not_depend_on_the_order_of_reduction(name, op, n):
    dtype = common.DTYPES[name]
    ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    inputs = [exact.rank_pattern(dtype, op, r) for r in range(n)]
    acc = inputs[-1]
    for x in reversed(inputs[:-1]):  # reverse rank order, each step rounded in the dtype
        acc = ufunc(x, acc)
    want = exact.expected_pattern(dtype, op, n)
    bits = np.dtype(f"u{dtype.itemsize}")
    assert np.array_equal(acc.view(bits), want.view(bits))


@pytest.mark.parametrize("name", ["int8", "uint32", "float16", "bfloat16", "float32"])
def test_expected_average_is_the_sum_divided_once_by_n(name):
    dtype = common.DTYPES[name]
    total = exact.expected_pattern(dtype, "sum", 3).astype(np.float64)
    avg = exact.expected_pattern(dtype, "avg", 3).astype(np.float64)
    want = np.trunc(total / 3) if dtype.kind in "iu" else total / 3
    assert np.allclose(avg, want, rtol=1e-2, atol=0)


def test_count_wrong_counts_flipped_elements_in_body_and_tail():
    pattern = exact.expected_pattern(np.dtype(np.float32), "sum", 2)
    buf = np.empty(exact.PERIOD * 3 + 5, np.float32)
    exact.fill(buf, pattern)
    assert exact.count_wrong(buf, pattern) == 0
    buf[1] += 1
    buf[-1] += 1
    assert exact.count_wrong(buf, pattern) == 2


def test_fit_line_goes_through_the_smallest_and_the_largest_size():
    from hvd_lite.bench.fit import fit_line

    sizes = [8, 1 << 10, 1 << 22]
    times = [1e-6 + s * 1e-10 for s in sizes]
    times[1] *= 3  # a noisy middle point does not move the line
    alpha, beta = fit_line(sizes, times)
    assert alpha == pytest.approx(1e-6) and beta == pytest.approx(1e-10)
    assert fit_line([8, 16], [2e-6, 1e-6]) == (pytest.approx(2e-6), 0.0)  # a falling line: flat


def series_of(*runs):
    """A measure(nbytes, series) that gives runs[series][nbytes], and what it was asked."""
    asked = []

    def measure(nbytes, series):
        asked.append((nbytes, series))
        return runs[series][nbytes]

    return measure, asked


def just_this_rank(fitted, times):
    return fitted, times


def test_the_ping_pong_keeps_each_sizes_quickest_over_series_until_a_line_fits():
    from hvd_lite.bench.fit import quickest_series

    sizes = [8, 1 << 20]
    quiet = {8: 1e-6, 1 << 20: 1e-4}
    # the first series' small message lost its core (4 ms, the 1 MiB one then no slower): no line;
    # the second fits, each size keeping its quickest of the two
    measure, asked = series_of({8: 4e-3, 1 << 20: 2e-4}, quiet, quiet)
    one_way, fitted, times0 = quickest_series(sizes, measure, just_this_rank)
    assert fitted and one_way == [1e-6, 1e-4] and times0 == one_way
    assert [s for _, s in asked] == [0, 0, 1, 1]
    # a quiet machine: one series
    measure, asked = series_of(quiet)
    assert quickest_series(sizes, measure, just_this_rank)[1] and len(asked) == 2


def test_the_ping_pong_gives_up_after_its_series_and_follows_rank_0s_word():
    from hvd_lite.bench.fit import FIT_SERIES, quickest_series

    sizes = [8, 1 << 20]
    busy = {8: 4e-3, 1 << 20: 2e-4}
    measure, asked = series_of(*[busy] * FIT_SERIES)
    one_way, fitted, times0 = quickest_series(sizes, measure, just_this_rank)
    assert not fitted and one_way == [4e-3, 2e-4] and len(asked) == 2 * FIT_SERIES
    # another rank runs as many series as rank 0 says, and reports rank 0's times
    measure, asked = series_of(busy, busy)
    said = iter([(False, [9.0, 9.0]), (True, [1e-6, 1e-4])])
    _, fitted, times0 = quickest_series(sizes, measure, lambda ok, t: next(said))
    assert fitted and times0 == [1e-6, 1e-4] and len(asked) == 4
