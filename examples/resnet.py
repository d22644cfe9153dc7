"""ResNet-style image classifier: a strided stem, stages of basic residual blocks, global
average pooling and a linear head, trained with cross-entropy over class labels.

Normalisation is GroupNorm, not BatchNorm: batch statistics are taken over the whole batch,
so under a batch split each rank would normalise with its own chunk's mean and variance and
the result (and the running buffers) would differ from one process. GroupNorm's statistics
are per sample, so splitting the batch is exact.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from examples import init_weights, random_floats, random_tokens


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(groups, channels), channels)


class Block(nn.Module):
    """Two 3x3 convolutions with a residual; the first one strides when `stride` > 1. A
    strided 1x1 projection carries the shortcut when the shape changes."""

    def __init__(self, inputs: int, outputs: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _norm(outputs, groups)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, padding=1, bias=False)
        self.norm2 = _norm(outputs, groups)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False), _norm(outputs, groups))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.norm1(self.conv1(x)))
        h = self.norm2(self.conv2(h))
        return F.relu(h + self.shortcut(x))


class ResNet(nn.Module):
    """Forward takes images (batch, channels, size, size) and labels (batch,); returns the
    mean cross-entropy loss."""

    def __init__(self, channels: int, classes: int, widths: tuple[int, ...], blocks: int,
                 groups: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(channels, widths[0], 3, stride=2, padding=1, bias=False)
        self.stem_norm = _norm(widths[0], groups)
        layers = []
        for stage, width in enumerate(widths):
            inputs = widths[max(stage - 1, 0)]
            for index in range(blocks):
                # Every stage after the first halves the resolution in its first block.
                stride = 2 if stage > 0 and index == 0 else 1
                layers.append(Block(inputs if index == 0 else width, width, stride, groups))
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem_norm(self.stem(images)))
        x = self.layers(x)
        # Global average pooling as a mean over space: exact under a batch split.
        return F.cross_entropy(self.head(x.mean(dim=(2, 3))), labels)


def build(*, batch: int = 8, size: int = 16, channels: int = 3, classes: int = 10,
          widths: tuple[int, ...] = (8, 16, 32), blocks: int = 1, groups: int = 4,
          seed: int = 0, device: str = "cpu", dtype: torch.dtype = torch.float32,
          ) -> tuple[ResNet, tuple[torch.Tensor, torch.Tensor]]:
    """The model and `(images, labels)`: images (batch, channels, size, size), labels
    (batch,) in [0, classes). `widths` are the stages' channel counts (each a multiple of
    `groups`), `blocks` the residual blocks per stage."""
    with torch.device(device):
        model = ResNet(channels, classes, tuple(widths), blocks, groups).to(dtype)
    init_weights(model, seed)
    _init_convolutions(model, seed)
    images = random_floats((batch, channels, size, size), seed + 1, device, dtype)
    labels = random_tokens((batch,), classes, seed + 2, device)
    return model, (images, labels)


def _init_convolutions(model: ResNet, seed: int) -> None:
    """He-normal convolution weights (fan-in scaled, so activations keep their size through
    the depth) and GroupNorm weights one; the rest as `init_weights` made them."""
    if any(param.is_meta for param in model.parameters()):
        return
    generator = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Conv2d):
                fan_in = module.weight[0].numel()
                std = (2.0 / fan_in) ** 0.5
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * std)
            elif isinstance(module, nn.GroupNorm):
                module.weight.fill_(1.0)
