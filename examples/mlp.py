"""Two-layer MLP with GELU, trained against a regression target (MSE loss)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from examples import init_weights, random_floats


class MLP(nn.Module):
    """`fc2(gelu(fc1(x)))`; forward returns the MSE loss against `target`."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.fc2(F.gelu(self.fc1(x))), target)


def build(*, batch: int = 8, hidden: int = 32, ffn: int = 128, seed: int = 0,
          device: str = "cpu", dtype: torch.dtype = torch.float32,
          ) -> tuple[MLP, tuple[torch.Tensor, torch.Tensor]]:
    """The model and `(x, target)`, both of shape (batch, hidden)."""
    with torch.device(device):
        model = MLP(hidden, ffn).to(dtype)
    init_weights(model, seed)
    x = random_floats((batch, hidden), seed + 1, device, dtype)
    target = random_floats((batch, hidden), seed + 2, device, dtype)
    return model, (x, target)
