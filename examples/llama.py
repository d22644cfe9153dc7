"""Llama-style decoder: RMSNorm, rotary positions, grouped-query attention, SwiGLU, untied head.

`build(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, seq=4096,
device="meta")` gives the Llama-3-8B shape without allocating its memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from examples import init_weights, random_tokens


def rotary_tables(seq: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (seq, head_dim), halves repeated to match `rotate_half`."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """Causal grouped-query attention: `kv_heads` key/value heads shared by `heads` queries."""

    def __init__(self, hidden: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        assert hidden % heads == 0 and heads % kv_heads == 0, "heads must divide evenly"
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.wq = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q = self.wq(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = self._repeat_kv(k), self._repeat_kv(v)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, hidden))

    def _repeat_kv(self, t: torch.Tensor) -> torch.Tensor:
        # (b, kv_heads, s, d) -> (b, heads, s, d): expand is a view, the reshape copies once.
        batch, _, seq, dim = t.shape
        groups = self.heads // self.kv_heads
        t = t[:, :, None].expand(batch, self.kv_heads, groups, seq, dim)
        return t.reshape(batch, self.heads, seq, dim)


class FeedForward(nn.Module):
    """SwiGLU: `down(silu(gate(x)) * up(x))`."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int, eps: float) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(hidden, eps=eps)
        self.attn = Attention(hidden, heads, kv_heads)
        self.ffn_norm = nn.RMSNorm(hidden, eps=eps)
        self.ffn = FeedForward(hidden, ffn)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    """Forward takes token ids and next-token targets, both (batch, seq); returns the loss."""

    def __init__(self, vocab: int, seq: int, hidden: int, heads: int, kv_heads: int,
                 ffn: int, layers: int, eps: float = 1e-5, theta: float = 500000.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(
            Block(hidden, heads, kv_heads, ffn, eps) for _ in range(layers))
        self.norm = nn.RMSNorm(hidden, eps=eps)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        cos, sin = rotary_tables(seq, hidden // heads, theta)
        # Derived from the config, so kept out of the state dict.
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """The mean next-token loss against `targets`; without them, the logits."""
        seq = idx.shape[1]
        x = self.embed(idx)
        cos, sin = self.cos[:seq], self.sin[:seq]
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def build(*, vocab: int = 256, seq: int = 32, hidden: int = 64, heads: int = 4,
          kv_heads: int = 2, ffn: int = 176, layers: int = 2, batch: int = 2, seed: int = 0,
          device: str = "cpu", dtype: torch.dtype = torch.float32,
          ) -> tuple[Llama, tuple[torch.Tensor, torch.Tensor]]:
    """The model and `(idx, targets)` token ids of shape (batch, seq)."""
    with torch.device(device):
        model = Llama(vocab, seq, hidden, heads, kv_heads, ffn, layers).to(dtype)
    init_weights(model, seed)
    idx = random_tokens((batch, seq), vocab, seed + 1, device)
    targets = random_tokens((batch, seq), vocab, seed + 2, device)
    return model, (idx, targets)
