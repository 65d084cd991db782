"""horovod.torch.elastic's names: elastic training (workers joining and leaving a running job) is
not implemented in hvd_lite, so each one raises NotImplementedError when used."""

_WHY = (
    "elastic training is not implemented in hvd_lite: a job keeps its ranks from start to end "
    "(restart it from a checkpoint to change them)"
)


def run(func):
    """Not supported: raises NotImplementedError (Horovod's decorator for elastic training)."""
    raise NotImplementedError(f"hvd_lite.torch.elastic.run: {_WHY}")


class TorchState:
    """Not supported: raises NotImplementedError (Horovod's elastic state object)."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(f"hvd_lite.torch.elastic.TorchState: {_WHY}")


class ElasticSampler:
    """Not supported: raises NotImplementedError (Horovod's elastic data sampler)."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(f"hvd_lite.torch.elastic.ElasticSampler: {_WHY}")


__all__ = ["TorchState", "ElasticSampler", "run"]
