"""The allreduce's quick route (ops.plain_args, taken by the synchronous calls and by every
allreduce_request) against its full checks (ops.checked_request): it takes only arguments the
checks accept, and gives the engine the same ones they would."""

import ml_dtypes
import numpy as np
import pytest
import route_matrix

import hvd_lite as hvd
from hvd_lite import basics, ops


@pytest.fixture
def initialized():
    hvd.init()
    yield
    hvd.shutdown()


class _Other(np.ndarray):
    pass


def _arrays():
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    frozen = base.copy()
    frozen.flags.writeable = False
    return {
        "float32": base,
        "float64": np.ones(5),
        "int8": np.ones(3, np.int8),
        "bfloat16": np.ones(3, ml_dtypes.bfloat16),
        "0-d": np.array(2.0, np.float32),
        "empty": np.ones(0, np.float16),
        "bool": np.ones(3, bool),
        "complex": np.ones(3, np.complex64),
        "big-endian": np.ones(3, ">f4"),
        "strided": base[:, 1],
        "transposed": base.T,
        "read-only": frozen,
        "17 dims": np.ones((1,) * 17, np.float32),
        "list": [1.0, 2.0],
        "subclass": np.ones(3, np.float32).view(_Other),
    }


_OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product, ops.ReduceOp.Adasum, 1, 1.0, True, "Sum", None]
_FACTORS = [1.0, 0.5, 1, 2, True, np.float32(1.0), "1", float("nan")]
_NAMES = [None, "loss", "é" * 127, "x" * 128, "é" * 300, "a\0b", 3, b"loss"]


def _full(array, inplace, op, pre, post, name):
    """checked_request's Submission and automatic kind, or the exception it raises."""
    try:
        where = basics.set_for("allreduce", None)
        request = ops.checked_request("allreduce", array, inplace, op, pre, post, name, where)
        return request.submission, request.auto
    except Exception as exc:  # pylint: disable=broad-except
        return exc


def _same(quick, full, inplace):
    """quick gives the engine what full does: the same arguments, the output array the same one
    in place and a fresh one like the input out of place; the automatic name is run()'s to set,
    from the same kind (a rank on one route meets a rank on the other under one name)."""
    assert isinstance(full, tuple), f"the quick route took arguments the checks refuse: {full!r}"
    full, auto = full
    if auto is not None:
        assert quick.name is None and auto == ops._KIND
    assert quick.send is full.send
    if inplace:
        assert quick.recv is full.recv is quick.send
    else:
        assert quick.recv is not quick.send
        assert (quick.recv.shape, quick.recv.dtype) == (full.recv.shape, full.recv.dtype)
    route_matrix.assert_same_past_buffers(quick, full, unnamed=auto is not None)


def test_the_quick_route_takes_only_what_the_checks_accept_and_gives_the_same_args(initialized):
    taken = route_matrix.taken(
        _arrays(),
        _OPS,
        _FACTORS,
        _NAMES,
        ops.plain_args,
        lambda quick, array, inplace, *call: _same(quick, _full(array, inplace, *call), inplace),
    )
    # The common calls do take it: without that this test would pass with a route never taken.
    for label in ("float32", "float64", "int8", "bfloat16", "0-d", "empty"):
        for inplace in (True, False):
            for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
                assert (label, inplace, op, 1.0, 1.0, None) in taken
    assert ("float32", True, hvd.Sum, 1.0, 1.0, "loss") in taken
    assert ("float32", True, hvd.Sum, 0.5, 1.0, None) in taken


def test_the_quick_route_declines_while_an_adapter_fault_is_armed(initialized):
    x = np.ones(3, np.float32)
    assert ops.plain_args(x, True, hvd.Sum, 1.0, 1.0, None) is not None
    basics.inject_fault("adapter")
    assert ops.plain_args(x, True, hvd.Sum, 1.0, 1.0, None) is None
    with pytest.raises(hvd.HvdLiteError, match="the adapter failed"):
        hvd.allreduce_(x, op=hvd.Sum)


def test_a_synchronous_allreduce_checks_its_process_set_first():
    x = np.ones(3, np.float32)
    with pytest.raises(hvd.NotInitializedError):
        hvd.allreduce_(x, op=hvd.Sum)
    hvd.init()
    try:
        with pytest.raises(ValueError, match="is not registered"):
            hvd.allreduce_(x, op=hvd.Sum, process_set=hvd.ProcessSet([0]))
        with pytest.raises(TypeError, match="process_set must be a hvd_lite.ProcessSet"):
            hvd.allreduce(x, process_set="global")
        assert hvd.allreduce_(x, op=hvd.Sum, process_set=None) is x
    finally:
        hvd.shutdown()


def test_asynchronous_calls_on_either_route_take_the_same_counter_names(initialized):
    """An unnamed allreduce_async on the quick route and one through the full checks (here an int
    factor, which plain_args declines) draw from one counter: a rank on one route meets a rank
    on the other."""
    x, y = np.ones(3, np.float32), np.ones(2)
    assert ops.plain_args(x, True, hvd.Sum, 1, 1.0, None) is None
    handles = [
        hvd.allreduce_async_(x, op=hvd.Sum),
        hvd.allreduce_async_(x, op=hvd.Sum, prescale_factor=1),
        hvd.allreduce_async(y, op=hvd.Sum),
        hvd.allreduce_async(y, op=hvd.Sum, postscale_factor=1),
    ]
    assert [h.name for h in handles] == [f"allreduce.noname.{i}" for i in range(4)]
    assert handles[0].output is handles[1].output is x
    assert handles[2].output is not y and handles[3].output is not y
    for h in handles:
        hvd.synchronize(h)
    np.testing.assert_array_equal(handles[3].output, y)


def test_allreduce_request_takes_the_quick_route_for_plain_arguments(initialized, monkeypatch):
    """What the asynchronous and grouped calls pay for: the full checks only where plain_args
    declines."""
    full = []
    real = ops.checked_request
    monkeypatch.setattr(ops, "checked_request", lambda *a: full.append(a) or real(*a))
    x = np.ones(3, np.float32)
    hvd.synchronize(hvd.allreduce_async_(x, op=hvd.Sum, name="plain"))
    hvd.grouped_allreduce_([x, np.ones(2)], op=hvd.Sum)
    assert full == []
    hvd.synchronize(hvd.allreduce_async_(x, op=hvd.Sum, prescale_factor=1))
    assert len(full) == 1


def test_the_engine_takes_memory_by_address_and_refuses_a_bad_address(initialized):
    """Engine.submit's (owner, address, nbytes) buffer (what hvd_lite.torch passes): written in
    place (one rank: a prescale of 2 doubles it), the owner held while in flight; a null address
    with bytes, a negative size or address, or a malformed tuple is refused before anything runs."""
    import sys

    engine = basics._engine()
    x = np.arange(4, dtype=np.float32)
    refs = sys.getrefcount(x)

    def submit(buf, name="by_address"):
        return engine.submit(
            basics._core.COLL_ALLREDUCE,
            buf,
            buf,
            ops.hvdl_dtype(x.dtype),
            ops.HVDL_OPS[hvd.Sum],
            2.0,
            1.0,
            name,
            (4,),
            0,
            None,
            "",
            True,
        )

    h = submit((x, x.ctypes.data, x.nbytes))
    assert sys.getrefcount(x) > refs
    h.wait()
    del h
    assert sys.getrefcount(x) == refs and x.tolist() == [0.0, 2.0, 4.0, 6.0]
    for bad, exc in [
        ((x, 0, 16), ValueError),
        ((x, x.ctypes.data, -1), ValueError),
        ((x, -8, 16), OverflowError),
        ((x, x.ctypes.data), TypeError),
        ((x, "1", 16), TypeError),
        ((x, x.ctypes.data, 15), ValueError),
    ]:
        with pytest.raises(exc):
            submit(bad, "bad")
    assert x.tolist() == [0.0, 2.0, 4.0, 6.0]


def test_threads_never_draw_the_same_automatic_name():
    """Unnamed calls from several threads take names from one counter per kind: with the
    interpreter switching threads every microsecond, 8 threads drawing 5,000 each get 40,000
    different names (a read-then-write counter gave some twice)."""
    import sys
    import threading

    where = basics._Set(99, [0], None, {})
    drawn = [[] for _ in range(8)]

    def draw(out):
        for _ in range(5000):
            out.append(basics.auto_name("allreduce", where))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=draw, args=(out,)) for out in drawn]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    names = [n for out in drawn for n in out]
    assert len(set(names)) == len(names) == 40000
    assert sorted(int(n.rsplit(".", 1)[1]) for n in names) == list(range(40000))
