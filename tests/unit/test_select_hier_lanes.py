"""The shared-memory hierarchical all-reduce's price (csrc/select/select_allreduce.c, hier_lanes_cost)
on layouts no test job has: _core.plan_allreduce_model with shm_lanes gives every host a shared
segment, as on a real cluster."""

import pytest
from test_select_fail_safe import MEASURED_8X8BB

from hvd_lite import _core

# (hosts, ranks a host, lanes): lanes are the fewest ranks on any host
LAYOUTS = [(8, 8, 8), (16, 4, 4), (32, 8, 8), (3, 4, 2)]
SIZES = [256 << 10, 4 << 20, 64 << 20]
# A model file's terms, with a latency across hosts that steps up 6x from 64 KiB
STEPPED_FILE = {
    "inter_source": "file",
    "inter_alpha": 4e-6,
    "inter_beta": 1e-10,
    "inter_alpha_steps": [(65536, 24e-6)],
}


@pytest.fixture(autouse=True)
def no_model_file(monkeypatch):
    monkeypatch.delenv("HVD_LITE_COST_MODEL_FILE", raising=False)
    monkeypatch.delenv("HVD_LITE_ALLREDUCE_ALGO", raising=False)


def lane_plan(hosts, lanes, nbytes, model):
    """The selector of one lane across hosts (one rank a host), its NIC shared by `lanes` lanes."""
    shared = {**model, "inter_beta": model["inter_beta"] * lanes}
    return _core.plan_allreduce_model(hosts, hosts, 1, nbytes // lanes, shared)


@pytest.mark.parametrize("model", [MEASURED_8X8BB, STEPPED_FILE], ids=["measured", "file"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda y: "%dx%d/%d" % y)
@pytest.mark.parametrize("nbytes", SIZES)
def test_hier_is_its_ring_within_a_host_plus_what_its_lanes_run(layout, nbytes, model):
    hosts, per_host, lanes = layout
    p = _core.plan_allreduce_model(hosts * per_host, hosts, per_host, nbytes, model, lanes)
    within = _core.plan_allreduce_model(per_host, 1, per_host, nbytes, model)["predicted"]["ring"]
    lane = lane_plan(hosts, lanes, nbytes, model)
    across = lane["predicted"][lane["algorithm"]]
    assert p["predicted"]["hier"] == pytest.approx(within + across, rel=1e-12), (p, lane)


def test_without_a_segment_on_each_host_hier_is_no_candidate():
    p = _core.plan_allreduce_model(64, 8, 8, 4 << 20, MEASURED_8X8BB)
    assert p["predicted"]["hier"] is None and p["algorithm"] != "hier", p


def test_the_lanes_pay_the_latency_of_their_messages():
    # 8 MiB lanes on 8 hosts: the ring's messages are past the 64 KiB step, so each of its 14
    # steps across costs 24 us, not the base 4 us.
    p = _core.plan_allreduce_model(64, 8, 8, 64 << 20, STEPPED_FILE, 8)
    at_base = lane_plan(8, 8, 64 << 20, {**STEPPED_FILE, "inter_alpha_steps": []})
    stepped = lane_plan(8, 8, 64 << 20, STEPPED_FILE)
    assert stepped["predicted"]["ring"] - at_base["predicted"]["ring"] == pytest.approx(14 * 20e-6)
    within = _core.plan_allreduce_model(8, 1, 8, 64 << 20, STEPPED_FILE)["predicted"]["ring"]
    assert p["predicted"]["hier"] >= within + min(
        t for t in stepped["predicted"].values() if t is not None
    ), p


def test_the_lanes_keep_the_ring_out_on_16_hosts_with_the_default_terms():
    # The lanes' own selector applies the fail-safe rule: 16 hosts, terms not measured (a slow
    # reduction, with which the ring would be the cheapest prediction).
    terms = {"inter_source": "default", "inter_beta": 1e-10, "gamma": 1e-9}
    lane = lane_plan(16, 4, 64 << 20, terms)
    best = min((t, a) for a, t in lane["predicted"].items() if t is not None)[1]
    assert best == "ring" and lane["algorithm"] != "ring", lane
    p = _core.plan_allreduce_model(64, 16, 4, 64 << 20, terms, 4)
    within = _core.plan_allreduce_model(4, 1, 4, 64 << 20, terms)["predicted"]["ring"]
    assert p["predicted"]["hier"] == pytest.approx(within + lane["predicted"][lane["algorithm"]], rel=1e-12)


@pytest.mark.parametrize("lanes", [-1, 9])
def test_shm_lanes_outside_the_host_is_refused(lanes):
    with pytest.raises(ValueError, match="shm_lanes %d" % lanes):
        _core.plan_allreduce_model(64, 8, 8, 4 << 20, {}, lanes)
