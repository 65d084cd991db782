"""What hier_p2p runs across hosts (csrc/select/select_allreduce.c, hier_across): recursive doubling,
Rabenseifner for lanes over 8 KiB, or the direct exchange (csrc/algorithms/allreduce_direct.c) where the
model prices it lower and its bytes through a NIC cost at most its latency. On layouts no test job has:
_core.plan_allreduce_model runs the selector on a made-up layout and cost model."""

import pytest

from hvd_lite import _core


def steps(*pairs):
    return [(float(b), a) for b, a in pairs]


# The terms hvdlCommInitMpi measured at 64 ranks (8 hosts of 8) with no model file, on
# sim/platforms/8x8_400g_fattree.xml, 8x8.xml and 16x4_25g.xml (64 ranks as 16 hosts of 4).
FAT_TREE = {
    "inter_source": "measured",
    "inter_alpha": 1.095e-6,
    "inter_beta": 2.125e-11,
    "inter_alpha_steps": steps((1024, 1.073e-6), (4096, 1.008e-6), (16384, 1.957e-6), (65536, 5.858e-6)),
    "intra_source": "measured",
    "intra_alpha": 0.49e-6,
    "intra_beta": 1.066e-11,
}
LINKS_100G = {
    "inter_source": "measured",
    "inter_alpha": 4.064e-6,
    "inter_beta": 8.505e-11,
    "inter_alpha_steps": steps((1024, 4.088e-6), (4096, 3.937e-6), (16384, 7.512e-6), (65536, 23.33e-6)),
    "intra_source": "measured",
    "intra_alpha": 1.095e-6,
    "intra_beta": 2.125e-11,
}
LINKS_25G = {
    "inter_source": "measured",
    "inter_alpha": 10.11e-6,
    "inter_beta": 3.402e-10,
    "inter_alpha_steps": steps((1024, 10.43e-6), (4096, 9.822e-6), (16384, 19.50e-6), (65536, 58.29e-6)),
    "intra_source": "measured",
    "intra_alpha": 1.040e-6,
    "intra_beta": 5.315e-11,
}


def plan(size, hosts, local_size, nbytes, model):
    return _core.plan_allreduce_model(size, hosts, local_size, nbytes, model)


@pytest.fixture(autouse=True)
def no_model_file(monkeypatch):
    monkeypatch.delenv("HVD_LITE_COST_MODEL_FILE", raising=False)
    monkeypatch.delenv("HVD_LITE_ALLREDUCE_ALGO", raising=False)


@pytest.mark.parametrize("model", [FAT_TREE, LINKS_100G], ids=["fat-tree", "100g"])
def test_8_hosts_of_8_run_the_direct_exchange_across_at_4_kib(model):
    # 2 lanes of 2 KiB: 14 messages through a NIC, fewer bytes than one latency; rd takes 3 steps.
    p = plan(64, 8, 8, 4 << 10, model)
    assert p["algorithm"] == "hier_p2p", p
    assert (p["hier_p2p_across"], p["hier_p2p_lanes"]) == ("direct", 2), p


@pytest.mark.parametrize(
    "hosts, local_size, nbytes, model",
    [(8, 8, 16 << 10, LINKS_100G), (16, 4, 4 << 10, LINKS_25G), (32, 8, 4 << 10, FAT_TREE)],
    ids=["8-lanes-100g", "16-hosts-25g", "32-hosts-fat-tree"],
)
def test_rd_stays_where_the_direct_exchanges_bytes_cost_past_its_latency(hosts, local_size, nbytes, model):
    # The direct exchange lost in each of these in the simulation (docs/scale.md).
    p = plan(hosts * local_size, hosts, local_size, nbytes, model)
    lanes = p["hier_p2p_lanes"]
    lane = nbytes / lanes
    alpha = [a for b, a in model["inter_alpha_steps"] if b <= lane][-1]
    assert lanes * (hosts - 1) * lane * model["inter_beta"] > alpha, p
    assert p["hier_p2p_across"] == "rd", p


def fail_safe_edge(factor):
    """Terms under which the direct exchange's bytes through the NIC cost `factor` times its latency
    (8 hosts, 1 lane of 1 KiB), with latency far above the rest, so that its one step is priced under
    rd's three whatever the factor."""
    alpha = 10e-6
    return {
        "inter_source": "measured",
        "inter_alpha": alpha,
        "inter_beta": factor * alpha / (7 * 1024),
        "inter_alpha_steps": [],
        "intra_alpha": 1e-7,
        "intra_beta": 1e-12,
    }


@pytest.mark.parametrize("factor, across", [(0.9, "direct"), (1.1, "rd")])
def test_the_direct_exchange_is_refused_once_its_bytes_cost_more_than_its_latency(factor, across):
    p = plan(64, 8, 8, 1 << 10, fail_safe_edge(factor))
    assert p["hier_p2p_lanes"] == 1, p
    assert p["hier_p2p_across"] == across, p


def test_the_prediction_for_hier_p2p_takes_the_step_across_it_runs():
    # the edge's two sides differ by 0.2 alpha in bytes: one step across against rd's three
    direct = plan(64, 8, 8, 1 << 10, fail_safe_edge(0.9))["predicted"]["hier_p2p"]
    rd = plan(64, 8, 8, 1 << 10, fail_safe_edge(1.1))["predicted"]["hier_p2p"]
    assert rd - direct > 15e-6, (direct, rd)


def test_two_hosts_run_rd_and_lanes_over_8_kib_run_rabenseifner():
    assert plan(16, 2, 8, 4 << 10, FAT_TREE)["hier_p2p_across"] == "rd"
    big = plan(64, 8, 8, 1 << 20, FAT_TREE)
    assert (big["hier_p2p_across"], big["hier_p2p_lanes"]) == ("rab", 8), big


def test_one_host_has_no_step_across():
    assert plan(8, 1, 8, 4 << 10, FAT_TREE)["hier_p2p_across"] is None
