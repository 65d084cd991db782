"""Horovod's argument rules, written once (hvd_lite._horovod_args) and shared by the adapters:
`groups=k` cuts contiguous runs as Horovod's split_list, the same in hvd_lite.torch and
hvd_lite.tensorflow, and (op, average) resolves as Horovod's handle_average_backwards_compatibility."""

import warnings

import pytest

import hvd_lite as hvd
from hvd_lite._horovod_args import resolve_groups, resolve_op, split_list


def _horovods_split_list(items, n):
    """Horovod 0.28.1's rule, stated as its sizes: run i holds len // n items, one more for the
    first len % n runs, in order."""
    size, longer = divmod(len(items), n)
    sizes = [size + (1 if i < longer else 0) for i in range(n)]
    starts = [sum(sizes[:i]) for i in range(n)]
    return [list(items[s : s + k]) for s, k in zip(starts, sizes) if k]


def test_groups_k_cuts_contiguous_runs_the_first_ones_longer():
    assert split_list(list(range(10)), 3) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert split_list(list(range(4)), 1) == [[0, 1, 2, 3]]
    assert split_list(list(range(3)), 5) == [[0], [1], [2]]  # empty runs left out
    assert split_list([], 2) == []
    for n in range(0, 14):
        for k in range(1, 9):
            assert split_list(list(range(n)), k) == _horovods_split_list(list(range(n)), k)


def test_op_and_average_resolve_as_horovods():
    with pytest.raises(ValueError, match="supersedes average"):
        resolve_op("f", hvd.Sum, True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_op("f", None, None) == hvd.Average
        assert resolve_op("f", hvd.Min, None) == hvd.Min
    for average, op in ((True, hvd.Average), (False, hvd.Sum)):
        with pytest.warns(DeprecationWarning, match="average") as caught:
            assert resolve_op("f", None, average) == op
        assert caught[0].filename == __file__  # the user's line, past hvd_lite's frames
    with pytest.warns(DeprecationWarning, match="num_groups"):
        assert resolve_groups("f", None, 3) == 3
    assert resolve_groups("f", 2, 0) == 2


@pytest.fixture
def initialized():
    hvd.init()
    yield
    hvd.shutdown()


@pytest.mark.parametrize("count", [1, 2, 5, 7, 10])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_torch_and_tensorflow_put_the_same_gradients_in_the_same_groups(initialized, count, k):
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("tensorflow")
    import hvd_lite.torch as htorch
    from hvd_lite.tensorflow.functions import GradientReduction

    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(count)]
    opt = htorch.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), groups=k)
    index = {id(p): i for i, p in enumerate(params)}
    torch_groups = [[index[id(p)] for p in g] for g in opt._hvd_groups]
    variables = [tf.Variable([0.0]) for _ in range(count)]
    tf_groups = GradientReduction("test", groups=k)._partition(list(range(count)), variables)
    assert torch_groups == tf_groups == split_list(list(range(count)), k)
