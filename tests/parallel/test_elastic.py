"""hvd_lite.elastic and hvd_lite.torch.elastic inside one job (no relaunch: that is
tests/system/test_elastic.py): commit, restore and sync of ObjectState and TorchState, the
ElasticSampler's split, the reset callbacks and Horovod's reset order after HostsUpdatedInterrupt,
and a failed collective raised as HorovodInternalError outside an elastic launch."""

import os
import socket

import numpy as np
import pytest

import hvd_lite

pytestmark = pytest.mark.mpi


@pytest.fixture(autouse=True)
def _init():
    hvd_lite.init()
    yield


def test_object_state_commit_restore_and_sync_from_rank_0():
    state = hvd_lite.elastic.ObjectState(epoch=hvd_lite.rank(), names=("a",))
    state.commit()
    state.epoch = 99
    state.restore()
    assert state.epoch == hvd_lite.rank()
    state.sync()
    assert state.epoch == 0 and state.names == ("a",)


def test_run_syncs_first_then_runs_reset_callbacks_in_order_after_hosts_updated():
    state = hvd_lite.elastic.ObjectState(step=10 + hvd_lite.rank())
    events = []
    state.register_reset_callbacks([lambda: events.append("first"), lambda: events.append("second")])
    calls = []

    @hvd_lite.elastic.run
    def train(state, scale):
        calls.append(state.step)
        if len(calls) == 1:
            state.step = 50  # not committed: kept, as Horovod keeps it, on HostsUpdatedInterrupt
            raise hvd_lite.HostsUpdatedInterrupt(skip_sync=True)
        return state.step * scale

    assert train(state, 2) == 100
    assert calls == [10, 50] and events == ["first", "second"]
    assert hvd_lite.is_initialized()


def test_a_relaunched_state_resumes_from_its_commit_once_and_its_later_calls_do_not(
    tmp_path, monkeypatch, capfd
):
    """In a relaunched elastic job the first call of a state's elastic function loads the newest
    commit and runs the reset callbacks (Horovod's order); the commits stay on disk until the
    process ends, and the state's later calls (a function decorated per epoch, say) only sync, as
    in any job: no second resume, no reset."""
    from hvd_lite.run.rank import ELASTIC_DIR_VAR, ELASTIC_RESTARTS_VAR

    directory = hvd_lite.broadcast_object(str(tmp_path / "commits") if hvd_lite.rank() == 0 else None)
    monkeypatch.setenv(ELASTIC_DIR_VAR, directory)
    monkeypatch.setenv(ELASTIC_RESTARTS_VAR, "0")
    first = hvd_lite.elastic.ObjectState(step=0)

    @hvd_lite.elastic.run
    def epoch(state):
        state.step += 1
        state.commit()
        return state.step

    assert epoch(first) == 1
    monkeypatch.setenv(ELASTIC_RESTARTS_VAR, "1")  # as a relaunched process sees it, with a new state
    again = hvd_lite.elastic.ObjectState(step=0)
    again._commit_name = first._commit_name  # a relaunched process's first state: the same file
    resets = []
    again.register_reset_callbacks([lambda: resets.append(again.step)])
    capfd.readouterr()
    assert [epoch(again) for _ in range(3)] == [2, 3, 4]  # from the commit of step 1, then on
    assert resets == [1]
    said = capfd.readouterr().err
    assert said.count("resume from commit") == (1 if hvd_lite.rank() == 0 else 0), said


def test_a_hosts_commits_go_when_its_last_rank_ends_normally_and_stay_while_one_has_not(
    tmp_path, monkeypatch
):
    """The removal at a normal exit (run by hand here, rank by rank): each rank marks its end, and
    only the host's last one removes the commits and the marks; until then (a rank that never ends
    normally, killed after its function returned) they stay for a relaunch."""
    from hvd_lite import elastic
    from hvd_lite.run.rank import ELASTIC_DIR_VAR, ELASTIC_RESTARTS_VAR

    if hvd_lite.local_size() != hvd_lite.size():
        pytest.skip("the ranks of one host (emulated hosts share the machine's name)")
    directory = hvd_lite.broadcast_object(str(tmp_path / "commits") if hvd_lite.rank() == 0 else None)
    monkeypatch.setenv(ELASTIC_DIR_VAR, directory)
    monkeypatch.setenv(ELASTIC_RESTARTS_VAR, "0")
    monkeypatch.setattr(elastic, "_leaving", [])
    state = hvd_lite.elastic.ObjectState(step=0)

    @hvd_lite.elastic.run
    def train(state):
        state.step += 1
        state.commit()

    train(state)
    for rank in range(hvd_lite.size()):
        if hvd_lite.rank() == rank:
            left = sorted(os.listdir(directory))
            marks = [f"exited.0.{socket.gethostname()}.{r}" for r in range(rank)]
            assert left == sorted([f"{state._commit_name}.commit", *marks]), left
            elastic._leave_host()
        hvd_lite.barrier()
    assert not os.path.exists(directory)
    hvd_lite.barrier()


def test_run_refuses_what_is_not_a_state_and_callbacks_that_are_not_a_list():
    with pytest.raises(TypeError, match="must be an hvd_lite.elastic.State"):
        hvd_lite.elastic.run(lambda state: None)(object())
    with pytest.raises(TypeError, match="takes a list of functions"):
        hvd_lite.elastic.ObjectState().register_reset_callbacks(print)


def test_a_failed_collective_is_horovod_internal_error_raised_outside_an_elastic_launch():
    state = hvd_lite.elastic.ObjectState()

    @hvd_lite.elastic.run
    def train(state):
        hvd_lite.allreduce(
            np.ones(2), name="elastic.mismatch", op=hvd_lite.Sum if hvd_lite.rank() else hvd_lite.Max
        )

    if hvd_lite.size() == 1:
        pytest.skip("a mismatch needs two ranks")
    with pytest.raises(hvd_lite.HorovodInternalError):
        train(state)
    assert hvd_lite.HorovodInternalError is hvd_lite.CollectiveError


def test_torch_state_saves_restores_and_syncs_model_optimizer_and_sampler():
    torch = pytest.importorskip("torch")
    import hvd_lite.torch as hvd

    torch.manual_seed(hvd.rank())
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=hvd.rank())
    state.sync()
    w0 = model.weight.detach().clone()
    everyone = hvd.allgather_object(w0.tolist())
    assert all(w == everyone[0] for w in everyone) and state.epoch == 0
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sampler.record_batch(0, 2)
    state.commit()
    w1 = model.weight.detach().clone()
    opt.step()
    sampler.record_batch(1, 2)
    state.restore()
    assert torch.equal(model.weight, w1) and not torch.equal(w1, w0)
    assert sampler.processed_num == 2 * hvd.size()
    assert opt.state_dict()["state"][0]["momentum_buffer"] is not None


def test_elastic_sampler_splits_what_is_left_of_the_epoch_over_the_ranks():
    pytest.importorskip("torch")
    import hvd_lite.torch as hvd

    n, size, rank = 10, hvd.size(), hvd.rank()

    def share(left):  # padded by repeating its start to a multiple of the size, then every size-th
        per_rank = -(-len(left) // size)
        return per_rank, (left + left[: per_rank * size - len(left)])[rank::size]

    sampler = hvd.elastic.ElasticSampler(list(range(n)), shuffle=False)
    assert (len(sampler), list(sampler)) == share(list(range(n)))
    sampler.record_batch(0, 1)  # one sample on each rank
    sampler.reset()
    assert (len(sampler), list(sampler)) == share(list(range(size, n)))
    sampler.set_epoch(1)
    assert sampler.processed_num == 0 and sampler.state_dict() == {"epoch": 1, "processed_num": 0}
