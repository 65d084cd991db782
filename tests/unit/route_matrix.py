"""What the quick-route tests share (test_plain_args.py for numpy arrays, test_torch_plain_args.py
for torch tensors): the matrix of call arguments, and the comparison of two routes' engine
Submissions past the buffers."""

import hvd_lite as hvd
from hvd_lite._submission import FIELDS


def cases(ops, factors, names):
    """(op, prescale, postscale, name) for every op, every factor on either side, every name."""
    return (
        [(op, 1.0, 1.0, None) for op in ops]
        + [(hvd.Sum, f, 1.0, None) for f in factors]
        + [(hvd.Sum, 1.0, f, None) for f in factors]
        + [(hvd.Sum, 1.0, 1.0, n) for n in names]
    )


def past_buffers(submission, unnamed: bool = False) -> dict:
    """A Submission's fields but the buffers (send, recv), and but the name when `unnamed`."""
    left_out = ("send", "recv") + (("name",) if unnamed else ())
    return {k: getattr(submission, k) for k in FIELDS if k not in left_out}


def assert_same_past_buffers(quick, full, unnamed: bool = False):
    """The two routes' Submissions agree, in value and type, but for the buffers (and the name
    when `unnamed`)."""
    rest, full_rest = past_buffers(quick, unnamed), past_buffers(full, unnamed)
    assert rest == full_rest
    assert {k: type(v) for k, v in rest.items()} == {k: type(v) for k, v in full_rest.items()}


def taken(items, ops, factors, names, recognize, check):
    """The (label, inplace, op, prescale, postscale, name) of every call of the matrix, over the
    labelled `items` in place and out of place, that `recognize` (the quick route) takes; each
    one's Submission is passed to check(quick, item, inplace, op, pre, post, name)."""
    out = set()
    for label, item in items.items():
        for inplace in (True, False):
            for op, pre, post, name in cases(ops, factors, names):
                quick = recognize(item, inplace, op, pre, post, name)
                if quick is not None:
                    check(quick, item, inplace, op, pre, post, name)
                    out.add((label, inplace, op, pre, post, name))
    return out
