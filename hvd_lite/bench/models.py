"""Gradient tensor shapes of real models, generated from their architecture.

ResNet-50 (He et al. 2015, torchvision's layout): a 7x7 stem, four stages of
bottleneck blocks (3, 4, 6, 3 blocks; widths 64, 128, 256, 512; expansion 4),
each block 1x1 -> 3x3 -> 1x1 convolutions without bias, each followed by batch
norm (gamma and beta), a 1x1 projection with batch norm on the first block of
each stage, and a 2048 -> 1000 fully connected layer with bias.
"""

from typing import List, Tuple

RESNET50_TENSORS = 161
RESNET50_ELEMENTS = 25_557_032

Shape = Tuple[int, ...]


def _conv(name: str, cin: int, cout: int, k: int) -> List[Tuple[str, Shape]]:
    return [(f"{name}.weight", (cout, cin, k, k))]


def _bn(name: str, c: int) -> List[Tuple[str, Shape]]:
    return [(f"{name}.weight", (c,)), (f"{name}.bias", (c,))]


def resnet50_forward() -> List[Tuple[str, Shape]]:
    """(parameter name, shape) in the order the forward pass defines them."""
    params = _conv("conv1", 3, 64, 7) + _bn("bn1", 64)
    cin = 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        cout = width * 4
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            params += _conv(f"{p}.conv1", cin, width, 1) + _bn(f"{p}.bn1", width)
            params += _conv(f"{p}.conv2", width, width, 3) + _bn(f"{p}.bn2", width)
            params += _conv(f"{p}.conv3", width, cout, 1) + _bn(f"{p}.bn3", cout)
            if b == 0:
                params += _conv(f"{p}.downsample.0", cin, cout, 1) + _bn(f"{p}.downsample.1", cout)
            cin = cout
    params += [("fc.weight", (1000, 2048)), ("fc.bias", (1000,))]
    return params


def resnet50_backward() -> List[Tuple[str, Shape]]:
    """(parameter name, shape) in the order a backward pass produces gradients: last layer first."""
    return resnet50_forward()[::-1]
