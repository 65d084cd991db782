"""hvd_lite.tensorflow.elastic and hvd_lite.keras.elastic inside one job: the Keras model's and
optimizer's variables saved, restored, synced from rank 0 and loaded from a commit's snapshot into a
fresh (unbuilt) optimizer, as a relaunched rank does; the callbacks during model.fit."""

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed (pip install -e '.[tensorflow]')")
keras = pytest.importorskip("keras", reason="Keras 3 is not installed (pip install -e '.[tensorflow]')")

import hvd_lite.keras as hvdk  # noqa: E402
import hvd_lite.tensorflow as hvd  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture(autouse=True)
def _init():
    hvd.init()
    yield


def make():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    for v in model.variables:  # a different start on every rank
        v.assign(np.full(v.shape, float(hvd.rank() + 1), np.float32))
    return model


def data(n=6):
    x = np.arange(n * 4, dtype=np.float32).reshape(n, 4) / 10
    return x, x.sum(1, keepdims=True)


def weights(model):
    return [v.numpy().copy() for v in model.variables]


def test_keras_state_syncs_from_rank_0_commits_restores_and_loads_into_a_fresh_optimizer():
    model = make()
    state = hvd.elastic.TensorFlowKerasState(model, epoch=hvd.rank())
    state.sync()
    assert all((w == 1.0).all() for w in weights(model)) and state.epoch == 0
    model.fit(*data(), batch_size=6, epochs=1, verbose=0)  # builds the optimizer
    state.commit()
    committed = weights(model)
    model.fit(*data(), batch_size=6, epochs=1, verbose=0)
    state.restore()
    assert all((a == b).all() for a, b in zip(weights(model), committed))
    # a relaunched rank: a fresh model and optimizer, the commit's snapshot loaded
    fresh = make()
    again = hvd.elastic.TensorFlowKerasState(fresh)
    again._load_snapshot(state._snapshot())
    assert all((a == b).all() for a, b in zip(weights(fresh), committed))
    moments = [v.numpy() for v in fresh.optimizer.variables]
    assert len(moments) == len(model.optimizer.variables) and int(fresh.optimizer.iterations.numpy()) == 1


def test_tensorflow_state_syncs_and_restores_variables():
    v = tf.Variable(np.full(3, float(hvd.rank()), np.float32))
    state = hvd.elastic.TensorFlowState([v], step=hvd.rank())
    state.sync()
    assert (v.numpy() == 0).all() and state.step == 0
    v.assign([5.0, 5.0, 5.0])
    state.restore()
    assert (v.numpy() == 0).all()


def test_the_callbacks_keep_epoch_and_batch_and_commit_every_n_batches_and_each_epoch():
    model = make()
    state = hvdk.elastic.KerasState(model, epoch=0, batch=0)
    callbacks = [
        hvdk.elastic.CommitStateCallback(state, batches_per_commit=2),
        hvdk.elastic.UpdateBatchStateCallback(state),
        hvdk.elastic.UpdateEpochStateCallback(state),
    ]

    @hvdk.elastic.run
    def train(state):
        model.fit(*data(), batch_size=2, epochs=2 - state.epoch, callbacks=callbacks, verbose=0)

    train(state)
    assert (state.epoch, state.batch) == (2, 0)
    # 3 batches an epoch: commits after batches 2 and 4 and 6 of the 6, and at each epoch's end
    assert state._commits == 5


def test_the_epoch_callback_counts_the_epochs_done_when_fit_starts_at_initial_epoch():
    """Keras's way of resuming (`initial_epoch=state.epoch, epochs=epochs`): fit numbers the
    epochs from state.epoch, not from 0 as with Horovod's `epochs=epochs - state.epoch`."""
    model = make()
    state = hvdk.elastic.KerasState(model, epoch=1, batch=0)
    callback = hvdk.elastic.UpdateEpochStateCallback(state)
    model.fit(*data(), batch_size=6, initial_epoch=state.epoch, epochs=3, callbacks=[callback], verbose=0)
    assert state.epoch == 3
    model.fit(*data(), batch_size=6, epochs=4 - state.epoch, callbacks=[callback], verbose=0)
    assert state.epoch == 4


def test_a_collective_failure_inside_a_tf_function_is_raised_by_run_as_the_horovod_internal_error():
    """TensorFlow turns an op's exception into tf.errors.UnknownError (message only); the elastic
    run of hvd_lite.tensorflow and hvd_lite.keras raises the failure itself, which an elastic
    launch survives (outside one, as here, it is raised); another error stays as it is."""
    from hvd_lite import basics
    from hvd_lite.exceptions import CollectiveError, HorovodInternalError
    from hvd_lite.tensorflow import mpi_ops

    failure = CollectiveError(basics._core.hvdlRemoteError, "rank(s) 1 died: the MPI reports it (ULFM)")

    def dies(x):
        raise failure

    def breaks(x):
        raise RuntimeError("not a collective")

    @tf.function
    def step(x, fn):
        return mpi_ops.graph_op(fn, [x], [tf.float32], "allreduce")[0]

    with pytest.raises(tf.errors.UnknownError, match="rank\\(s\\) 1 died"):
        step(tf.constant(1.0), dies)
    state = hvd.elastic.ObjectState(step=0)
    for elastic in (hvd.elastic, hvdk.elastic):

        @elastic.run
        def train(state, fn):
            step(tf.constant(1.0), fn)

        with pytest.raises(HorovodInternalError) as raised:
            train(state, dies)
        assert raised.value is failure and isinstance(raised.value.__cause__, tf.errors.UnknownError)
        with pytest.raises(tf.errors.UnknownError, match="not a collective"):
            train(state, breaks)


def test_what_the_elastic_states_do_not_take_is_refused():
    with pytest.raises(ValueError, match="needs variables="):
        hvd.elastic.TensorFlowState()
    with pytest.raises(NotImplementedError, match="TensorFlow 1 sessions"):
        hvd.elastic.TensorFlowKerasState(make(), backend=object())
    with pytest.raises(ValueError, match="batches_per_commit must be an int >= 1, got 0"):
        hvdk.elastic.CommitStateCallback(hvd.elastic.ObjectState(), batches_per_commit=0)
