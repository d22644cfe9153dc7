"""Small models whose graphs reach the rule families the examples do not: gathers and
scatters by index, reductions along a dim, joins and splits, factories, further losses.

`build(name)` returns `(model, inputs)` with a scalar loss as the model's output, like the
examples, so the same equivalence harness runs them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Indexing(nn.Module):
    """index_select, gather, scatter_add, one_hot, bmm and a top-k routing, as a mixture
    of experts combines its experts' outputs."""

    def __init__(self, hidden: int = 8, experts: int = 4) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(16, hidden))
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.Parameter(torch.randn(experts, hidden, hidden) / hidden ** 0.5)

    def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = torch.index_select(self.table, 0, ids)  # [T, H]
        weights, chosen = self.router(x).softmax(-1).topk(2, dim=-1)  # [T, 2]
        mask = F.one_hot(chosen, self.experts.shape[0]).to(x.dtype)  # [T, 2, E]
        gate = (mask * weights.unsqueeze(-1)).sum(1)  # [T, E]
        experts = self.experts.shape[0]
        outs = torch.bmm(x.expand(experts, *x.shape), self.experts).permute(1, 0, 2)
        y = (outs * gate.unsqueeze(-1)).sum(1)  # [T, H]
        picked = torch.gather(y, 1, target.unsqueeze(-1).expand(-1, 2))  # [T, 2]
        pooled = torch.zeros(4, y.shape[1]).scatter_add(
            0, (ids % 4).unsqueeze(-1).expand_as(y), y)
        return picked.square().sum() + pooled.square().mean()


class Reductions(nn.Module):
    """Reductions along a dim (amax, var, cumsum, log_softmax), joins and splits (cat,
    stack, split, chunk), factories (arange, zeros_like, full), and nll, l1 and
    smooth-l1 losses."""

    def __init__(self, hidden: int = 8, classes: int = 6) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, 2 * hidden)
        self.head = nn.Linear(hidden, classes)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        a, b = self.fc(x).split(x.shape[-1], dim=-1)
        h = self.norm(torch.cat([a * torch.sigmoid(b), a], dim=0).chunk(2, dim=0)[0])
        h = h - h.amax(dim=-1, keepdim=True) + h.var(dim=-1, keepdim=True)
        steps = torch.arange(h.shape[-1], dtype=h.dtype)
        h = h.cumsum(dim=-1) / (steps + 1) + torch.zeros_like(h)
        stacked = torch.stack([h, torch.full_like(h, 0.5)], dim=1).sum(1)
        logp = F.log_softmax(self.head(stacked), dim=-1)
        return (F.nll_loss(logp, labels) + F.l1_loss(h, x)
                + F.smooth_l1_loss(stacked, x, reduction="sum"))


def build(name: str, *, seed: int = 0, tokens: int = 8) -> tuple[nn.Module, tuple]:
    """The probe `name` ("indexing" or "reductions") and its inputs, seeded."""
    generator = torch.Generator().manual_seed(seed + 1)
    torch.manual_seed(seed)
    if name == "indexing":
        model = Indexing()
        ids = torch.randint(0, 16, (tokens,), generator=generator)
        target = torch.randint(0, 8, (tokens,), generator=generator)
        return model, (ids, target)
    assert name == "reductions", name
    model = Reductions()
    x = torch.randn(tokens, 8, generator=generator)
    labels = torch.randint(0, 6, (tokens,), generator=generator)
    return model, (x, labels)
