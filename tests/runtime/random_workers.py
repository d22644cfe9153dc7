"""Rank bodies of test_random_ops: a model with dropout, trained on a mesh and alone."""

from __future__ import annotations

import copy
import hashlib

import torch
import torch.nn.functional as F
from torch import nn

import autopar

STEPS = 3


class DropoutMLP(nn.Module):
    """Two linears with dropout on the hidden activation and on the input."""

    def __init__(self, width: int = 32, hidden: int = 64, p: float = 0.25) -> None:
        super().__init__()
        self.fc1, self.fc2, self.p = nn.Linear(width, hidden), nn.Linear(hidden, width), p

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        h = F.dropout(F.gelu(self.fc1(F.dropout(x, self.p))), self.p)
        noise = torch.rand_like(h) * 1e-3  # a "like" draw too
        return F.mse_loss(self.fc2(h + noise), target)


def build() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model = DropoutMLP()
    generator = torch.Generator().manual_seed(1)
    return model, (torch.randn(16, 32, generator=generator),
                   torch.randn(16, 32, generator=generator))


def _replicated(pm) -> str:
    digest = hashlib.sha256()
    for slot in pm.slots:
        if slot.role == "parameter" and all(p.is_replicate() for p in slot.placements):
            digest.update(pm.value(slot).detach().numpy().tobytes())
    return digest.hexdigest()


def train_with_dropout(rank: int, constraints: dict) -> dict:
    """STEPS AdamW steps of the compiled model; rank 0 also steps the plain model from the
    same generator state each step (then puts the generator back where the mesh's ranks
    are). Per step: losses and the largest gradient difference; then the replicated
    parameters' digest and the dropouts' placements."""
    model, inputs = build()
    reference = copy.deepcopy(model) if rank == 0 else None
    mesh = autopar.Mesh((2, 2), ("dp", "tp"), hardware="cpu")
    pm = autopar.compile(model, mesh, inputs, constraints=constraints, microbatches=1)
    torch.manual_seed(1234)  # every rank alike, as a torchrun script seeds them
    optimizer = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    if reference is not None:
        reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    steps = []
    for _ in range(STEPS):
        before = torch.get_rng_state()
        loss = pm(*inputs)
        loss.backward()
        grads = pm.full_grads()
        optimizer.step()
        optimizer.zero_grad()
        if reference is None:
            steps.append((float(loss.detach()), None, None))
            continue
        after = torch.get_rng_state()
        torch.set_rng_state(before)
        expected = reference(*inputs)
        expected.backward()
        torch.set_rng_state(after)
        error = max(float((grads[n] - p.grad).abs().max()) for n, p in
                    reference.named_parameters())
        reference_optimizer.step()
        reference_optimizer.zero_grad()
        steps.append((float(loss.detach()), float(expected.detach()), error))
    random = [node.output for node in pm.plan.nodes
              if "dropout" in node.op or "rand_like" in node.op]
    return {"steps": steps, "replicated": _replicated(pm), "random": random}
