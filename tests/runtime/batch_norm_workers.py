"""Rank bodies of test_sync_batch_norm: a CNN with batch norm in training mode, its batch
split over the mesh, trained next to the plain model."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import autopar
from autopar.tools.training import Tolerance, worst_gradient

STEPS = 3
TOLERANCE = Tolerance()


class BatchNormCNN(nn.Module):
    """Convolutions, BatchNorm2d with running statistics, BatchNorm1d without, a
    classifier. No parameter's gradient is zero in exact arithmetic, where AdamW would step
    on the sign of its rounding noise and the two models would part: hence no conv bias
    before a norm (the norm's mean removes it), and a channel-mixing conv between norm2 and
    norm3 (else norm3's variance removes norm2's scale, passed through ReLU)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.norm1 = nn.BatchNorm2d(16, momentum=0.3)
        self.conv2 = nn.Conv2d(16, 8, 3, bias=False)
        self.norm2 = nn.BatchNorm2d(8)
        self.mix = nn.Conv2d(8, 8, 1, bias=False)
        self.norm3 = nn.BatchNorm1d(8, track_running_stats=False)
        self.head = nn.Linear(8, 4)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.norm1(self.conv1(images)))
        x = F.relu(self.norm2(self.conv2(x)))
        x = self.norm3(self.mix(x).flatten(2)).mean(-1)  # [N, C, L] statistics over N and L
        return F.cross_entropy(self.head(x), labels)


def build() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model = BatchNormCNN().train()
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(8, 3, 24, 24, generator=generator) * 2 + 0.5
    return model, (images, torch.randint(0, 4, (8,), generator=generator))


@dataclass(frozen=True)
class Step:
    loss: float
    reference_loss: float
    worst_gradient: str | None
    gradient_excess: float
    buffer_excess: float


def _buffer_excess(state: dict, reference: nn.Module) -> float:
    worst = 0.0
    for name, expected in reference.named_buffers():
        difference = float((state[name].to(expected.dtype) - expected).abs().max())
        worst = max(worst, TOLERANCE.excess(difference, float(expected.abs().max())))
    return worst


def train(rank: int, shape: tuple[int, ...], names: tuple[str, ...],
          constraints: dict) -> tuple[list[Step], dict, dict]:
    """STEPS AdamW steps; rank 0 compares each with the plain model's. Returns the steps
    (rank 0's), the bytes the collectives moved and the plan's for the steps."""
    model, inputs = build()
    reference = copy.deepcopy(model)
    pm = autopar.compile(model, autopar.Mesh(shape, names, hardware="cpu"), inputs,
                         constraints=constraints)
    optimizer = torch.optim.AdamW(pm.parameters(), lr=1e-2)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    steps = []
    for _ in range(STEPS):
        loss = pm(*inputs)
        loss.backward()
        grads, state = pm.full_grads(), pm.full_state_dict()  # collectives
        expected = reference(*inputs)
        expected.backward()
        _, worst, _, excess = worst_gradient(grads, reference, TOLERANCE)
        steps.append(Step(float(loss.detach()), float(expected.detach()), worst, excess,
                          _buffer_excess(state, reference)))
        for opt in (optimizer, reference_optimizer):
            opt.step()
            opt.zero_grad()
    predicted = {key: value * STEPS for key, value in pm.plan.comm_bytes().items()}
    return steps, dict(pm.counter.totals()), predicted
