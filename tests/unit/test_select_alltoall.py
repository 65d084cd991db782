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
@pytest.mark.parametrize(
    "layout", [(64, 1, 64), (1024, 128, 8), (4096, 512, 8)], ids=lambda x: f"{x[0]}r{x[1]}h"
)
def test_the_selector_takes_bruck_for_small_blocks_on_many_ranks_and_pairwise_for_large(terms, layout):
    size, hosts, local = layout
    small = plan(size, hosts, local, 16, TERMS[terms])
    large = plan(size, hosts, local, 64 << 10, TERMS[terms])
    assert small["algorithm"] == "bruck", small
    assert large["algorithm"] == "pairwise", large


@pytest.mark.parametrize("terms", TERMS)
@pytest.mark.parametrize("block", [1, 64, 4096, 1 << 20])
def test_two_ranks_take_pairwise_their_one_message_each_way_being_brucks_one_step(terms, block):
    for hosts, local in ((1, 2), (2, 1)):
        p = plan(2, hosts, local, block, TERMS[terms])
        assert p["algorithm"] == "pairwise" and p["predicted"]["pairwise"] == p["predicted"]["bruck"], p


def test_one_rank_has_nothing_to_send():
    p = plan(1, 1, 1, 4096, {})
    assert p["algorithm"] == "pairwise" and p["predicted"] == {"pairwise": 0.0, "bruck": 0.0}, p


@pytest.mark.parametrize("terms", TERMS)
@pytest.mark.parametrize(
    "layout", [(64, 8, 8), (256, 32, 8), (60, 8, 8), (7, 1, 7)], ids=lambda x: f"{x[0]}r{x[1]}h"
)
def test_the_choice_is_the_cheaper_prediction_and_bruck_never_wins_back_once_lost(terms, layout):
    # Bruck's bytes grow log2(n)/2 times faster than pairwise's with the block, so once pairwise is
    # cheaper it stays so at every larger block.
    size, hosts, local = layout
    picks = []
    for block in [1 << k for k in range(0, 25, 2)]:
        p = plan(size, hosts, local, block, TERMS[terms])
        assert p["algorithm"] == min(p["predicted"], key=p["predicted"].get), p
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
