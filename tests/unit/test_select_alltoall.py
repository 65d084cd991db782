"""The all-to-all's selector (csrc/select/select_alltoall.c) on layouts no test job has:
_core.plan_alltoall_model runs it on a made-up layout and cost model, for n blocks of `block` bytes."""

import pytest

from hvd_lite import _core

# The terms hvdlCommInitMpi measures on the simulated 100 Gb/s platforms
# (tests/unit/test_select_fail_safe.py's, docs/scale.md): about 10 us across hosts up to 4 KiB,
# 58 us from 64 KiB; 0.65 us within a host.
MEASURED = {
    "inter_source": "measured",
    "inter_alpha": 10.1e-6,
    "inter_beta": 8.5e-11,
    "inter_alpha_steps": [(1024, 9.97e-6), (4096, 9.55e-6), (16384, 17.96e-6), (65536, 58.3e-6)],
    "intra_source": "measured",
    "intra_alpha": 0.65e-6,
    "intra_beta": 2.125e-11,
}
TERMS = {"default": {}, "measured": MEASURED}


def plan(size, hosts, local_size, block, model):
    return _core.plan_alltoall_model(size, hosts, local_size, block, model)


@pytest.fixture(autouse=True)
def no_model_file(monkeypatch):
    monkeypatch.delenv("HVD_LITE_COST_MODEL_FILE", raising=False)
    monkeypatch.delenv("HVD_LITE_ALLTOALL_ALGO", raising=False)


@pytest.mark.parametrize("terms", TERMS)
def test_one_host_of_many_ranks_takes_bruck_for_small_blocks_and_pairwise_for_large(terms):
    small = plan(64, 1, 64, 16, TERMS[terms])
    large = plan(64, 1, 64, 64 << 10, TERMS[terms])
    assert small["algorithm"] == "bruck" and small["predicted"]["hier_p2p"] is None, small
    assert large["algorithm"] == "pairwise", large


@pytest.mark.parametrize(
    "layout", [(64, 8, 8), (256, 32, 8), (1024, 128, 8)], ids=lambda x: f"{x[0]}r{x[1]}h"
)
def test_many_hosts_take_a_two_level_algorithm_for_small_blocks_and_pairwise_for_large_on_measured_terms(
    layout,
):
    # The simulation's 64 and 256 ranks, 16 and 64 B blocks: hier_p2p ran 2.2x as fast as Bruck's at
    # 256 ranks; at 64 (8 hosts of 8, every rank carrying at most one host) hier_pairs ran 1.2x as
    # fast as hier_p2p and pairwise (docs/scale.md, "All-to-all").
    size, hosts, local = layout
    for block in (16, 64):
        small = plan(size, hosts, local, block, MEASURED)
        assert small["algorithm"] == ("hier_pairs" if hosts - 1 <= local else "hier_p2p"), small
    large = plan(size, hosts, local, 64 << 10, MEASURED)
    assert large["algorithm"] == "pairwise", large


@pytest.mark.parametrize("terms", TERMS)
@pytest.mark.parametrize(
    "layout",
    [(64, 8, 8), (256, 32, 8), (1024, 128, 8), (64, 16, 4), (16, 4, 4)],
    ids=lambda x: f"{x[0]}r{x[1]}h",
)
def test_a_two_level_algorithm_is_taken_only_where_it_beats_the_others_by_its_margin(terms, layout):
    # Its saving is in message counts the model prices roughly, its cost (every block carried within a
    # host too) is certain: select_alltoall.c's HIER_P2P_MARGIN. The candidate is hier_pairs where
    # every rank carries at most one host (hosts - 1 <= ranks a host), hier_p2p elsewhere, whatever
    # the other's prediction.
    size, hosts, local = layout
    two_level = "hier_pairs" if hosts - 1 <= local else "hier_p2p"
    other = "hier_p2p" if two_level == "hier_pairs" else "hier_pairs"
    for block in [1 << k for k in range(0, 21, 2)]:
        p = plan(size, hosts, local, block, TERMS[terms])
        t = p["predicted"]
        assert p["algorithm"] != other, p
        assert (p["algorithm"] == two_level) == (t[two_level] * 1.25 < min(t["pairwise"], t["bruck"])), p


def test_hier_pairs_is_taken_on_8_hosts_of_8_where_hier_p2p_is_predicted_cheaper():
    # The model prices hier_p2p's seven messages across below hier_pairs' extra step within the host;
    # the simulation ran hier_pairs faster on every platform of that layout (docs/scale.md).
    p = plan(64, 8, 8, 64, MEASURED)
    t = p["predicted"]
    assert t["hier_p2p"] < t["hier_pairs"] and p["algorithm"] == "hier_pairs", p


def test_hier_p2p_predicted_cheaper_but_within_its_margin_is_not_taken():
    p = plan(256, 32, 8, 1024, MEASURED)
    t = p["predicted"]
    assert t["hier_p2p"] < t["pairwise"] < 1.25 * t["hier_p2p"], p
    assert p["algorithm"] == "pairwise", p


@pytest.mark.parametrize("terms", TERMS)
@pytest.mark.parametrize("block", [1, 64, 4096, 1 << 20])
def test_two_ranks_take_pairwise_their_one_message_each_way_being_brucks_one_step(terms, block):
    for hosts, local in ((1, 2), (2, 1)):
        p = plan(2, hosts, local, block, TERMS[terms])
        assert p["algorithm"] == "pairwise" and p["predicted"]["pairwise"] == p["predicted"]["bruck"], p


def test_one_rank_has_nothing_to_send():
    p = plan(1, 1, 1, 4096, {})
    assert p["algorithm"] == "pairwise", p
    assert p["predicted"] == {"pairwise": 0.0, "bruck": 0.0, "hier_p2p": None, "hier_pairs": None}, p


@pytest.mark.parametrize("terms", TERMS)
@pytest.mark.parametrize(
    "layout", [(64, 8, 8), (256, 32, 8), (60, 8, 8), (7, 1, 7)], ids=lambda x: f"{x[0]}r{x[1]}h"
)
def test_the_choice_is_the_cheaper_prediction_and_pairwise_is_never_left_once_taken(terms, layout):
    # Bruck's bytes grow log2(n)/2 times faster than pairwise's with the block, hier_p2p's H times
    # within a host, so once pairwise is taken it stays so at every larger block.
    size, hosts, local = layout
    picks = []
    for block in [1 << k for k in range(0, 25, 2)]:
        p = plan(size, hosts, local, block, TERMS[terms])
        t = {a: v for a, v in p["predicted"].items() if v is not None}
        if p["algorithm"] not in ("hier_p2p", "hier_pairs"):
            assert p["algorithm"] == min(("pairwise", "bruck"), key=t.get), p
        picks.append(p["algorithm"])
    assert picks == sorted(picks, key=lambda a: a == "pairwise"), picks
    assert picks[-1] == "pairwise", picks


def test_a_forced_algorithm_is_not_the_models_business(monkeypatch):
    # The made-up communicator plans auto whatever the environment says: the knob is the
    # communicator's (tests/parallel/test_alltoall_algorithms.py forces it there).
    monkeypatch.setenv("HVD_LITE_ALLTOALL_ALGO", "bruck")
    assert plan(64, 8, 8, 1 << 20, {})["algorithm"] == "pairwise"


@pytest.mark.parametrize("terms", TERMS)
def test_a_few_ranks_on_one_host_take_pairwise_whose_messages_overlap(terms):
    for n in (3, 4, 8):
        p = plan(n, 1, n, 64, TERMS[terms])
        assert p["algorithm"] == "pairwise", (n, p)
