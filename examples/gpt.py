"""GPT-2-style decoder: learned positions, pre-LayerNorm blocks, LM head tied to the embedding."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from examples import init_weights, random_tokens


class Attention(nn.Module):
    """Causal multi-head self-attention with one fused qkv projection."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        assert hidden % heads == 0, "hidden must be a multiple of heads"
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(x).split(hidden, dim=-1)
        # (batch, seq, hidden) -> (batch, heads, seq, head_dim)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, seq, hidden))


class MLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.proj = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Forward takes token ids and next-token targets, both (batch, seq); returns the loss."""

    def __init__(self, vocab: int, seq: int, hidden: int, heads: int, layers: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        self.layers = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def build(*, vocab: int = 256, seq: int = 32, hidden: int = 64, heads: int = 4,
          layers: int = 2, batch: int = 2, seed: int = 0, device: str = "cpu",
          dtype: torch.dtype = torch.float32,
          ) -> tuple[GPT, tuple[torch.Tensor, torch.Tensor]]:
    """The model and `(idx, targets)` token ids of shape (batch, seq)."""
    with torch.device(device):
        model = GPT(vocab, seq, hidden, heads, layers).to(dtype)
    init_weights(model, seed)
    idx = random_tokens((batch, seq), vocab, seed + 1, device)
    targets = random_tokens((batch, seq), vocab, seed + 2, device)
    return model, (idx, targets)
