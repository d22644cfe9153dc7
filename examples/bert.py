"""BERT-style encoder trained on masked language modelling: post-LayerNorm blocks,
bidirectional attention under a padding mask, MLM head tied to the token embedding.

`build(layers=24, hidden=1024, heads=16, vocab=30522, seq=512, device="meta")` gives the
BERT-large shape without allocating its memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from examples import init_weights, random_floats, random_tokens

IGNORE = -100  # label of the positions the loss skips, cross_entropy's ignore_index
# A standard normal lies within +-0.19 with probability 0.15, BERT's share of labelled positions.
LABELLED = 0.19


class Attention(nn.Module):
    """Bidirectional multi-head self-attention; padded keys are masked out."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        assert hidden % heads == 0, "hidden must be a multiple of heads"
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """`keep`: bool (batch, 1, 1, seq), True where a key may be attended to."""
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(x).split(hidden, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.proj(out.transpose(1, 2).reshape(batch, seq, hidden))


class Block(nn.Module):
    """Post-LayerNorm encoder block: the norm follows each residual sum, as in BERT."""

    def __init__(self, hidden: int, heads: int, ffn: int, eps: float) -> None:
        super().__init__()
        self.attn = Attention(hidden, heads)
        self.ln1 = nn.LayerNorm(hidden, eps=eps)
        self.fc = nn.Linear(hidden, ffn)
        self.out = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attn(x, keep))
        return self.ln2(x + self.out(F.gelu(self.fc(x))))


class Bert(nn.Module):
    """Forward takes token ids, token type ids, the padding mask (1 for a real token, 0 for
    padding) and MLM labels (`IGNORE` where unlabelled), all (batch, seq); returns the mean
    cross-entropy over the labelled positions."""

    def __init__(self, vocab: int, seq: int, hidden: int, heads: int, ffn: int, layers: int,
                 types: int = 2, eps: float = 1e-12) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(seq, hidden)
        self.token_type = nn.Embedding(types, hidden)
        self.embed_norm = nn.LayerNorm(hidden, eps=eps)
        self.layers = nn.ModuleList(Block(hidden, heads, ffn, eps) for _ in range(layers))
        self.transform = nn.Linear(hidden, hidden)
        self.head_norm = nn.LayerNorm(hidden, eps=eps)
        self.decoder = nn.Linear(hidden, vocab)
        self.decoder.weight = self.word.weight

    def forward(self, idx: torch.Tensor, token_types: torch.Tensor,
                attention_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.word(idx) + self.position(positions) + self.token_type(token_types)
        x = self.embed_norm(x)
        keep = attention_mask[:, None, None, :].bool()  # broadcast over heads and queries
        for layer in self.layers:
            x = layer(x, keep)
        logits = self.decoder(self.head_norm(F.gelu(self.transform(x))))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)


def batch_of_pairs(batch: int, seq: int, vocab: int, seed: int, device: str,
                   ) -> tuple[torch.Tensor, ...]:
    """`(idx, token_types, attention_mask, labels)`, each (batch, seq) int64.

    Row i is a sentence pair padded at the end: its first half is type 0, the rest type 1,
    and its last `(3 * i) % (seq // 2)` positions are padding (mask 0). About 15%
    of the real positions, at least the first, carry a random label; the
    others are `IGNORE`. On "meta" the tensors are empty, with the same shapes.
    """
    rows = torch.arange(batch, device=device)[:, None]
    columns = torch.arange(seq, device=device)[None, :]
    lengths = seq - (3 * rows) % max(seq // 2, 1)
    attention_mask = (columns < lengths).long()
    token_types = (columns >= seq // 2).long().expand(batch, seq).contiguous()
    idx = random_tokens((batch, seq), vocab, seed, device)
    targets = random_tokens((batch, seq), vocab, seed + 1, device)
    chosen = (random_floats((batch, seq), seed + 2, device).abs() < LABELLED) | (columns == 0)
    labels = torch.where(chosen & attention_mask.bool(), targets, IGNORE)
    return idx, token_types, attention_mask, labels


def build(*, vocab: int = 256, seq: int = 32, hidden: int = 64, heads: int = 4,
          ffn: int | None = None, layers: int = 2, batch: int = 2, seed: int = 0,
          device: str = "cpu", dtype: torch.dtype = torch.float32,
          ) -> tuple[Bert, tuple[torch.Tensor, ...]]:
    """The model and `batch_of_pairs(...)`; `ffn` defaults to 4 x hidden."""
    with torch.device(device):
        model = Bert(vocab, seq, hidden, heads, ffn or 4 * hidden, layers).to(dtype)
    init_weights(model, seed)
    return model, batch_of_pairs(batch, seq, vocab, seed + 1, device)
