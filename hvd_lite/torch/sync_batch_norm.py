"""SyncBatchNorm: batch normalisation over the batch of every rank together (horovod.torch's)."""

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from .. import basics
from .mpi_ops import Sum, allreduce


class SyncBatchNorm(_BatchNorm):
    """BatchNorm whose training statistics are those of every rank's batch together.

    In training (with more than one rank) each forward allreduces, per channel, the count, the
    sum and the sum of squares of its input, so every rank must call it the same number of
    times; the gradient flows back through that allreduce (the sum of every rank's). In eval
    mode, or with one rank, it is torch's batch norm."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects an input of 2 or more dimensions, got {input.dim()}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalizes `input`; in training, with the statistics of every rank's batch."""
        self._check_input_dim(input)
        if not self.training or basics.size() == 1:
            return super().forward(input)
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average, as torch's
                momentum = 1.0 / float(self.num_batches_tracked)
        c = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        x = input.float() if input.dtype in (torch.float16, torch.bfloat16) else input
        count = torch.full((1,), float(x.numel() // max(c, 1)), dtype=x.dtype)
        local = torch.cat([count, x.sum(dims), (x * x).sum(dims)])
        total = allreduce(local, op=Sum, name=None)
        n = total[0]
        if int(n.item()) <= 1:
            raise ValueError(
                "SyncBatchNorm: expected more than 1 value per channel across the "
                f"ranks' batches, got input size {list(input.shape)}"
            )
        mean = total[1 : 1 + c] / n
        var = (total[1 + c :] / n - mean * mean).clamp_min(0)
        if self.track_running_stats:
            with torch.no_grad():
                self.running_mean.mul_(1 - momentum).add_(mean.detach() * momentum)
                unbiased = var.detach() * (n.detach() / (n.detach() - 1))
                self.running_var.mul_(1 - momentum).add_(unbiased * momentum)
        shape = [1, c] + [1] * (input.dim() - 2)
        out = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out.to(input.dtype)
