"""What the engine is given for one collective: a Submission, by field. It imports nothing of
hvd_lite's, so every layer (basics, _submit, the adapters) may build one."""

from operator import itemgetter
from typing import Any, Optional

# The fields in the order Engine.submit takes them (csrc/python/py_engine.c), which is a Submission's.
FIELDS = ("coll", "send", "recv", "dtype", "op", "pre", "post", "name", "shape", "root", "splits", "error")


def _field(name: str, doc: str) -> Any:
    """A Submission's field: a property over the list item at `name`'s place in FIELDS."""
    index = FIELDS.index(name)

    def set_item(s: list, value: Any) -> None:
        s[index] = value

    return property(itemgetter(index), set_item, doc=doc)


class Submission(list):
    """One collective as the engine's submit takes it (csrc/python/py_engine.c, Engine.submit): a list of
    the FIELDS in the binding's order, so that handing it over is `submit(*s, at_once)`, read and
    written by field name. Built by field with Submission.of; a small call's quick route
    (ops.plain_args, hvd_lite.torch's _plain_args) builds it from a list in FIELDS order, a list
    literal and one C call (docs/benchmarks-history.md, "Through the numpy API"), and
    tests/unit/test_plain_args.py holds that route's fields to the checked route's. Filled in
    once (the name of an automatic call, an armed fault's error) before it is handed over."""

    __slots__ = ()

    coll = _field("coll", "the collective (_core.COLL_*)")
    send = _field("send", "the input buffer (None: no data)")
    recv = _field("recv", "the output buffer (None: the engine allocates it)")
    dtype = _field("dtype", "the hvdl dtype code")
    op = _field("op", "the hvdl op code")
    pre = _field("pre", "the prescale factor")
    post = _field("post", "the postscale factor")
    name = _field("name", "the name (None, or a stand-in, until an automatic call is named)")
    shape = _field("shape", "the shape (a tuple)")
    root = _field("root", "the broadcast's root")
    splits = _field("splits", "alltoall's rows per rank (None: even)")
    error = _field("error", "a problem this rank found, which fails the collective on every rank")

    @classmethod
    def of(
        cls,
        coll: int,
        send: Any,
        recv: Any,
        dtype: int,
        name: Optional[str],
        shape: tuple,
        op: int = 0,
        pre: float = 1.0,
        post: float = 1.0,
        root: int = 0,
        splits: Optional[list] = None,
        error: str = "",
    ) -> "Submission":
        """A Submission by field (the fields but the first six have their defaults)."""
        return cls([coll, send, recv, dtype, op, pre, post, name, shape, root, splits, error])

    def entry(self) -> tuple:
        """The argument tuple Engine.submit_group takes for one collective."""
        return tuple(self)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in zip(FIELDS, self))
        return f"Submission({fields})"
