"""What the quick-route tests share (test_plain_args.py for numpy arrays, test_torch_plain_args.py
for torch tensors): the matrix of call arguments, and the comparison of two routes' engine
arguments past the buffers."""
import hvd_lite as hvd


def cases(ops, factors, names):
    """(op, prescale, postscale, name) for every op, every factor on either side, every name."""
    return ([(op, 1.0, 1.0, None) for op in ops] + [(hvd.Sum, f, 1.0, None) for f in factors]
            + [(hvd.Sum, 1.0, f, None) for f in factors] + [(hvd.Sum, 1.0, 1.0, n) for n in names])


def assert_same_past_buffers(quick, full):
    """The two routes' engine arguments agree, in value and type, but for the buffers (1, 2)."""
    rest = [a for i, a in enumerate(quick) if i not in (1, 2)]
    full_rest = [a for i, a in enumerate(full) if i not in (1, 2)]
    assert rest == full_rest and [type(a) for a in rest] == [type(a) for a in full_rest]


def taken(items, ops, factors, names, recognize, check):
    """The (label, inplace, op, prescale, postscale, name) of every call of the matrix, over the
    labelled `items` in place and out of place, that `recognize` (the quick route) takes; each
    one's engine arguments are passed to check(quick, item, inplace, op, pre, post, name)."""
    out = set()
    for label, item in items.items():
        for inplace in (True, False):
            for op, pre, post, name in cases(ops, factors, names):
                quick = recognize(item, inplace, op, pre, post, name)
                if quick is not None:
                    check(quick, item, inplace, op, pre, post, name)
                    out.add((label, inplace, op, pre, post, name))
    return out
