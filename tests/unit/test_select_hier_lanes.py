"""The shared-memory hierarchical all-reduce's price (csrc/select/select_allreduce.c, hier_lanes_cost)
on layouts no test job has: _core.plan_allreduce_model with shm_lanes gives every host a shared
segment, as on a real cluster."""

import pytest
from test_select_fail_safe import MEASURED_8X8BB

from hvd_lite import _core

# (ranks, hosts, the most ranks on a host, lanes: the fewest ranks on a host)
LAYOUTS = [(64, 8, 8, 8), (64, 16, 4, 4), (256, 32, 8, 8), (10, 3, 4, 2)]
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


def lane(hosts, lanes, nbytes, model):
    """What one lane across hosts (one rank a host) runs, by its own selector on the model with
    beta across times `lanes` (the host's NIC shared by its lanes, as comm.c gives the lanes), and
    that algorithm's time."""
    shared = {**model, "inter_beta": model["inter_beta"] * lanes}
    p = _core.plan_allreduce_model(hosts, hosts, 1, nbytes // lanes, shared)
    return p["algorithm"], p["predicted"][p["algorithm"]]


def ring_within(per_host, nbytes, model):
    return _core.plan_allreduce_model(per_host, 1, per_host, nbytes, model)["predicted"]["ring"]


@pytest.mark.parametrize("model", [MEASURED_8X8BB, STEPPED_FILE], ids=["measured", "file"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda y: "%d:%dx%d/%d" % y)
@pytest.mark.parametrize("nbytes", SIZES)
def test_hier_is_its_ring_within_a_host_plus_what_its_lanes_run(layout, nbytes, model):
    size, hosts, per_host, lanes = layout
    p = _core.plan_allreduce_model(size, hosts, per_host, nbytes, model, lanes)
    pick, across = lane(hosts, lanes, nbytes, model)
    want = ring_within(per_host, nbytes, model) + across
    assert p["predicted"]["hier"] == pytest.approx(want, rel=1e-12), (p, pick)


def test_the_lanes_choose_on_their_shared_nic():
    # 8 hosts of 8, 4 MiB: on a NIC of its own a lane of 512 KiB would take rd; 8 lanes through one
    # NIC make rab the cheaper, and hier is priced with it.
    plain = _core.plan_allreduce_model(8, 8, 1, 512 << 10, MEASURED_8X8BB)
    pick, across = lane(8, 8, 4 << 20, MEASURED_8X8BB)
    assert plain["algorithm"] == "rd" and pick == "rab", plain
    p = _core.plan_allreduce_model(64, 8, 8, 4 << 20, MEASURED_8X8BB, 8)
    assert p["hier_lane"] == "rab", p
    assert p["predicted"]["hier"] == pytest.approx(ring_within(8, 4 << 20, MEASURED_8X8BB) + across)


def test_without_a_segment_on_each_host_hier_is_no_candidate():
    p = _core.plan_allreduce_model(64, 8, 8, 4 << 20, MEASURED_8X8BB)
    assert p["predicted"]["hier"] is None and p["algorithm"] != "hier", p


def test_the_lanes_pay_the_latency_of_their_messages():
    # 8 MiB lanes on 8 hosts, run as a ring: its messages are past the 64 KiB step, so each of its
    # 14 steps across costs 24 us, not the base 4 us.
    pick, across = lane(8, 8, 64 << 20, STEPPED_FILE)
    _, at_base = lane(8, 8, 64 << 20, {**STEPPED_FILE, "inter_alpha_steps": []})
    assert pick == "ring" and across - at_base == pytest.approx(14 * 20e-6)
    p = _core.plan_allreduce_model(64, 8, 8, 64 << 20, STEPPED_FILE, 8)
    assert p["predicted"]["hier"] == pytest.approx(ring_within(8, 64 << 20, STEPPED_FILE) + across)


def test_the_lanes_keep_the_ring_out_on_16_hosts_with_the_default_terms():
    # The lanes' own selector applies the fail-safe rule: 16 hosts, terms not measured (a slow
    # reduction, with which the ring would be the cheapest prediction).
    terms = {"inter_source": "default", "inter_beta": 1e-10, "gamma": 1e-9}
    plain = _core.plan_allreduce_model(16, 16, 1, 16 << 20, terms)
    best = min((t, a) for a, t in plain["predicted"].items() if t is not None)[1]
    assert best == "ring" and plain["algorithm"] != "ring", plain
    pick, across = lane(16, 4, 64 << 20, terms)
    p = _core.plan_allreduce_model(64, 16, 4, 64 << 20, terms, 4)
    assert pick == plain["algorithm"]
    assert p["predicted"]["hier"] == pytest.approx(ring_within(4, 64 << 20, terms) + across)


@pytest.mark.parametrize("lanes", [-1, 9])
def test_shm_lanes_outside_the_host_is_refused(lanes):
    with pytest.raises(ValueError, match="shm_lanes %d" % lanes):
        _core.plan_allreduce_model(64, 8, 8, 4 << 20, {}, lanes)
