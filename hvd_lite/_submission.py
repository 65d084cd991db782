"""What the engine is given for one collective: a Submission, by field, and the one place that
turns it into the argument tuple the C binding takes (csrc/py_engine.c, Engine.submit). It
imports nothing of hvd_lite's, so every layer (basics, _submit, the adapters) may build one."""
from typing import Any, Optional


class Submission:
    """One collective as the engine's submit takes it (csrc/py_engine.c, Engine.submit), by
    field: coll the collective, send the input buffer (None: no data), recv the output buffer
    (None: the engine allocates it), dtype and op the hvdl codes, pre and post the scale
    factors, name, shape, root, splits (alltoall's rows per rank), error a problem this rank
    found, which fails the collective on every rank. Filled in once (the name of an automatic
    call, an armed fault's error) before it is handed over; entry() is the one place that
    knows the binding's order."""

    __slots__ = ("coll", "send", "recv", "dtype", "op", "pre", "post", "name", "shape", "root",
                 "splits", "error")

    def __init__(self, coll: int, send: Any, recv: Any, dtype: int, name: Optional[str],
                 shape: tuple, op: int = 0, pre: float = 1.0, post: float = 1.0, root: int = 0,
                 splits: Optional[list] = None, error: str = ""):
        self.coll = coll
        self.send = send
        self.recv = recv
        self.dtype = dtype
        self.op = op
        self.pre = pre
        self.post = post
        self.name = name
        self.shape = shape
        self.root = root
        self.splits = splits
        self.error = error

    def entry(self) -> tuple:
        """The argument tuple Engine.submit and Engine.submit_group take."""
        return (self.coll, self.send, self.recv, self.dtype, self.op, self.pre, self.post,
                self.name, self.shape, self.root, self.splits, self.error)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"Submission({fields})"
