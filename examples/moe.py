"""Mixture-of-experts decoder: learned positions, RMSNorm, causal attention, and top-k routed
SwiGLU experts in place of the dense FFN (Mixtral-like).

The expert layer is GShard/Switch capacity dispatch written with static shapes only, so
torch.export captures it and the planner can split the expert dim (expert parallelism):
every expert takes at most `capacity` tokens, chosen in order of routing priority (all
tokens' first choices before any second choice, earlier tokens first), and the tokens an
expert has no room for skip it (their residual carries them). Dispatch and combine are
one-hot tensors of shape (tokens, experts, capacity) contracted with einsum; the experts are
batched weights of shape (experts, ...) applied with bmm.

`build(layers=32, hidden=4096, heads=32, ffn=14336, experts=8, vocab=32000, seq=4096,
device="meta")` gives Mixtral-8x7B's sizes (with full multi-head attention instead of
grouped-query) without allocating its memory.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from examples import init_weights, random_tokens


class Attention(nn.Module):
    """Causal multi-head self-attention without biases."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        assert hidden % heads == 0, "hidden must be a multiple of heads"
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(x).split(hidden, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, seq, hidden))


def route(probs: torch.Tensor, top: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch and combine tensors, both (tokens, experts, capacity), from router `probs`
    of shape (tokens, experts).

    dispatch[t, e, c] is 1 where token t takes slot c of expert e; combine holds the token's
    renormalised gate weight there instead. A token keeps a choice only if its expert has a
    free slot when the choice's turn comes (choice-major, then token order).
    """
    tokens, experts = probs.shape
    gates, chosen = probs.topk(top, dim=-1)  # (tokens, top)
    gates = gates / gates.sum(dim=-1, keepdim=True)
    # (top, tokens, experts): choice-major, so all first choices queue before any second.
    onehot = (chosen.t()[..., None] == torch.arange(experts, device=probs.device)).long()
    position = onehot.flatten(0, 1).cumsum(dim=0).view(top, tokens, experts) - 1
    kept = onehot * (position < capacity).long()
    # Each (choice, token) has one expert: its slot there, 0 where the choice was dropped.
    slot = (position * kept).sum(dim=-1)  # (top, tokens)
    slots = (slot[..., None] == torch.arange(capacity, device=probs.device)).to(probs.dtype)
    kept = kept.to(probs.dtype)
    dispatch = torch.einsum("kte,ktc->tec", kept, slots)
    combine = torch.einsum("kte,ktc,tk->tec", kept, slots, gates)
    return dispatch, combine


class Experts(nn.Module):
    """`experts` SwiGLU FFNs as batched weights; the router picks `top` per token."""

    def __init__(self, hidden: int, ffn: int, experts: int, top: int,
                 capacity_factor: float) -> None:
        super().__init__()
        assert 1 <= top <= experts, "top must be between 1 and experts"
        self.experts, self.top, self.capacity_factor = experts, top, capacity_factor
        self.router = nn.Linear(hidden, experts, bias=False)
        self.gate = nn.Parameter(torch.empty(experts, hidden, ffn))
        self.up = nn.Parameter(torch.empty(experts, hidden, ffn))
        self.down = nn.Parameter(torch.empty(experts, ffn, hidden))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's output, shaped like `x`, and its load-balancing loss (a scalar)."""
        batch, seq, hidden = x.shape
        tokens = x.reshape(batch * seq, hidden)
        probs = self.router(tokens).softmax(dim=-1)
        capacity = math.ceil(self.capacity_factor * self.top * batch * seq / self.experts)
        dispatch, combine = route(probs, self.top, capacity)
        inputs = torch.einsum("tec,th->ech", dispatch, tokens)  # (experts, capacity, hidden)
        hidden_states = F.silu(torch.bmm(inputs, self.gate)) * torch.bmm(inputs, self.up)
        outputs = torch.bmm(hidden_states, self.down)
        out = torch.einsum("tec,ech->th", combine, outputs)
        return out.view(batch, seq, hidden), self.balance_loss(probs, dispatch)

    def balance_loss(self, probs: torch.Tensor, dispatch: torch.Tensor) -> torch.Tensor:
        """Switch-Transformer auxiliary loss: experts x sum over experts of (share of routed
        tokens it took) x (mean router probability); 1 when the load is uniform."""
        share = dispatch.sum(dim=(0, 2)) / (probs.shape[0] * self.top)
        return self.experts * (share * probs.mean(dim=0)).sum()


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, experts: int, top: int,
                 capacity_factor: float, eps: float) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(hidden, eps=eps)
        self.attn = Attention(hidden, heads)
        self.moe_norm = nn.RMSNorm(hidden, eps=eps)
        self.moe = Experts(hidden, ffn, experts, top, capacity_factor)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.attn(self.attn_norm(x))
        out, balance = self.moe(self.moe_norm(x))
        return x + out, balance


class MoE(nn.Module):
    """Forward takes token ids and next-token targets, both (batch, seq); returns the LM
    loss plus `balance_weight` times the layers' mean load-balancing loss."""

    def __init__(self, vocab: int, seq: int, hidden: int, heads: int, ffn: int, experts: int,
                 top: int, layers: int, capacity_factor: float = 1.25,
                 balance_weight: float = 0.01, eps: float = 1e-5) -> None:
        super().__init__()
        self.balance_weight = balance_weight
        self.embed = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        self.layers = nn.ModuleList(
            Block(hidden, heads, ffn, experts, top, capacity_factor, eps)
            for _ in range(layers))
        self.norm = nn.RMSNorm(hidden, eps=eps)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.embed(idx) + self.wpe(positions)
        balance = []
        for layer in self.layers:
            x, loss = layer(x)
            balance.append(loss)
        logits = self.lm_head(self.norm(x))
        lm = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return lm + self.balance_weight * torch.stack(balance).mean()


def build(*, vocab: int = 256, seq: int = 32, hidden: int = 64, heads: int = 4, ffn: int = 128,
          experts: int = 4, top: int = 2, layers: int = 2, batch: int = 2,
          capacity_factor: float = 1.25, seed: int = 0, device: str = "cpu",
          dtype: torch.dtype = torch.float32,
          ) -> tuple[MoE, tuple[torch.Tensor, torch.Tensor]]:
    """The model and `(idx, targets)` token ids of shape (batch, seq)."""
    with torch.device(device):
        model = MoE(vocab, seq, hidden, heads, ffn, experts, top, layers,
                    capacity_factor).to(dtype)
    init_weights(model, seed)
    idx = random_tokens((batch, seq), vocab, seed + 1, device)
    targets = random_tokens((batch, seq), vocab, seed + 2, device)
    return model, (idx, targets)
