"""The cost model's terms measured when a communicator spans hosts (csrc/select/select_measure.c), on
hosts emulated with HVD_LITE_RANKS_PER_HOST: positive, the same on every rank, used by the selector;
skipped by HVD_LITE_COST_MODEL_MEASURE=0, overridden by a model file, decided by rank 0, and not
made on one host."""

import pytest
from conftest import agree, make_comm, raises_on_every_rank, world

import hvd_lite as hvd

pytestmark = pytest.mark.mpi

SEGMENT = 256 << 10  # config.c's default HVD_LITE_SEGMENT_BYTES


def alpha_inter(model: dict, nbytes: float) -> float:
    """select.h's hvdl_select_alpha_inter: the latency step that nbytes reaches."""
    a = model["inter_alpha"]
    for at, step in model["inter_alpha_steps"]:
        if nbytes >= at:
            a = step
    return a


def same_everywhere(value) -> bool:
    values = world().allgather(value)
    return all(v == values[0] for v in values)


def test_the_terms_across_emulated_hosts_are_measured_positive_and_agreed():
    n = hvd.size()
    if n == 1:
        pytest.skip("one rank is one host")
    with make_comm(HVD_LITE_RANKS_PER_HOST=1) as c:
        m = c.cost_model()
    steps = m["inter_alpha_steps"]
    agree(
        m["inter_source"] == "measured"
        and m["inter_alpha"] > 0
        and m["inter_beta"] > 0
        and len(steps) >= 2
        and all(b > 0 and a > 0 for b, a in steps)
        and [b for b, _ in steps] == sorted(b for b, _ in steps)
        and m["measure_s"] > 0
        and m["inter_measure_error"] is None,
        f"{m}",
    )
    # One rank a host: nobody shares rank 0's host, so the terms within stay the defaults.
    agree(m["intra_source"] == "default", f"{m}")
    agree(same_everywhere(m), f"rank {hvd.rank()}: {m}")


def test_the_measured_terms_are_what_the_selector_prices_the_ring_with():
    n = hvd.size()
    if n == 1:
        pytest.skip("one rank is one host")
    nbytes = n * (64 << 10)  # the ring's messages: 64 KiB, within one segment
    with make_comm(HVD_LITE_RANKS_PER_HOST=1) as c:
        m, plan = c.cost_model(), c.allreduce_plan(nbytes)
    piece = min(nbytes / n, SEGMENT)
    beta, gamma = m["inter_beta"], m["gamma"]
    want = 2 * (n - 1) * alpha_inter(m, piece) + (n - 1) / n * nbytes * (beta + max(beta, gamma))
    agree(plan["predicted"]["ring"] == pytest.approx(want, rel=1e-9), f"{plan} against {want}")
    agree(same_everywhere(plan["algorithm"]), f"rank {hvd.rank()}: {plan['algorithm']}")


def test_hosts_of_two_measure_the_terms_within_a_host_too():
    n = hvd.size()
    if n < 4 or n % 2:
        pytest.skip("needs hosts of 2, at least two of them")
    with make_comm(HVD_LITE_RANKS_PER_HOST=2) as c:
        m = c.cost_model()
    agree(
        m["inter_source"] == "measured"
        and m["intra_source"] == "measured"
        and m["intra_alpha"] > 0
        and m["intra_beta"] > 0,
        f"{m}",
    )
    agree(same_everywhere(m), f"rank {hvd.rank()}: {m}")


def test_the_measurement_can_be_skipped():
    with make_comm(HVD_LITE_RANKS_PER_HOST=1, HVD_LITE_COST_MODEL_MEASURE=0) as c:
        m = c.cost_model()
    agree(
        m["inter_source"] == "default"
        and m["inter_alpha_steps"] == []
        and m["inter_alpha"] == 2e-6
        and m["inter_beta"] == 8e-11
        and m["measure_s"] == 0
        and m["inter_measure_error"] is None,
        f"{m}",
    )


def test_a_model_file_overrides_the_measurement_of_its_terms(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / f"model_{hvd.rank()}.conf"
    path.write_text("inter_alpha 5e-6\ninter_beta 1e-10\ninter_alpha_step 65536 4e-5  # rendezvous\n")
    with make_comm(HVD_LITE_RANKS_PER_HOST=1, HVD_LITE_COST_MODEL_FILE=str(path)) as c:
        m = c.cost_model()
    agree(
        m["inter_source"] == "file"
        and m["inter_alpha"] == 5e-6
        and m["inter_beta"] == 1e-10
        and m["inter_alpha_steps"] == [(65536.0, 4e-5)],
        f"{m}",
    )


def test_a_model_file_with_unordered_steps_is_refused_on_every_rank(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / f"bad_{hvd.rank()}.conf"
    path.write_text("inter_alpha_step 65536 4e-5\ninter_alpha_step 1024 1e-5\n")
    raises_on_every_rank(
        hvd.InvalidArgumentError,
        r"line 2: expected `inter_alpha_step bytes seconds`",
        lambda: make_comm(HVD_LITE_COST_MODEL_FILE=str(path)).__enter__(),
    )


def test_rank_0s_knob_decides_whether_every_rank_measures():
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("one rank is one host")
    with make_comm(HVD_LITE_RANKS_PER_HOST=1, HVD_LITE_COST_MODEL_MEASURE=1 if r == 0 else 0) as c:
        on = c.cost_model()
    with make_comm(HVD_LITE_RANKS_PER_HOST=1, HVD_LITE_COST_MODEL_MEASURE=0 if r == 0 else 1) as c:
        off = c.cost_model()
    agree(on["inter_source"] == "measured" and off["inter_source"] == "default", f"{on} / {off}")


def test_a_bad_knob_is_refused_on_every_rank():
    raises_on_every_rank(
        hvd.InvalidArgumentError,
        r"HVD_LITE_COST_MODEL_MEASURE=2 is not valid: expected 0 \(off\) or 1 \(on\)",
        lambda: make_comm(HVD_LITE_COST_MODEL_MEASURE=2).__enter__(),
    )


def test_one_host_measures_nothing():
    with make_comm() as c:
        m, plan = c.cost_model(), c.allreduce_plan(4)
    agree(
        plan["hosts"] == 1 and m["inter_source"] == "default" and m["intra_source"] == "default",
        f"{m}",
    )
    agree(m["measure_s"] == 0 and m["inter_alpha_steps"] == [], f"{m}")
