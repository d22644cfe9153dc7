"""Embedding lookup: `embedding(weight [V, D], indices [...]) -> [..., D]`.

Splits over one mesh axis:

- by indices: indices split on any dim, weight `R` -> output split on the same dim;
- by columns: weight `S(1)`, indices `R` -> output `S(-1)`;
- by vocabulary (Megatron vocab-parallel): weight `S(0)`, indices `R` -> output `P`. A rank
  holds rows [start, start + V/n) and must look up only the indices that fall there, giving
  zeros for the others, so that the ranks' outputs are summands of the lookup. A plain
  `embedding` call on the shard is wrong (it would index out of range). Obligation of the
  lowering: run `masked_embedding` below instead, with `start` the rank's first row;
- weight `P`, indices `R` -> `P` (a lookup is linear in the table).

`scale_grad_by_freq=True` scales each row's gradient by the count of its index in the whole
batch; a rank sees only its own indices (index split) or counts masked-out indices against
row 0 (vocab split), so those two splits are not offered then.

`embedding_bag(weight, indices [n], offsets [B], ...) -> (out [B, D], offset2bag, bag_size,
max_indices)` reduces the looked-up rows of each bag (sum, mean or max). No placement
describes its outputs together, so `DECOMPOSITIONS` (run by capture) writes it as what it
computes, in ops with rules:

    bag[i]  = (number of offsets <= i) - 1       (cumsum of offset marks; padding: bag B)
    rows    = embedding(weight, indices) * per_sample_weights[:, None]
    sum     = zeros(B + 1, D).index_add(0, bag, rows)[:B]
    mean    = sum / max(count, 1),  count = zeros(B + 1).index_add(0, bag, 1)[:B]
    max     = zeros(B + 1, D).scatter_reduce(0, bag, rows, "amax", include_self=False)[:B]

so the table splits by columns (output `S(1)`), by vocabulary (sum and mean: `P`), and the
index list by chunks (sum and mean: `P`). Entries equal to `padding_idx` go to the extra bag
B, which is dropped; an empty bag gives zeros, as torch's kernel does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autopar.rules.base import AxisStrategy, OpSpec, Rule
from autopar.rules.common import P, R, S, argument, finish, is_float

aten = torch.ops.aten


def _embedding(op: OpSpec) -> list[AxisStrategy]:
    weight, indices = op.inputs
    out = op.outputs[0]
    by_freq = bool(argument(op, "scale_grad_by_freq", False))
    strategies = []
    if not by_freq:
        strategies += [AxisStrategy((R, S(d)), S(d)) for d in range(indices.ndim)
                       if indices.shape[d] > 1]
    if weight.shape[1] > 1:
        strategies.append(AxisStrategy((S(1), R), S(out.ndim - 1)))
    if is_float(weight):
        if not by_freq and weight.shape[0] > 1:
            strategies.append(AxisStrategy((S(0), R), P))
        strategies.append(AxisStrategy((P, R), P))
    return finish(strategies)


def is_vocab_split(op: OpSpec, weight_placement: object) -> bool:
    """True when a rank must run `masked_embedding` for this op on this axis."""
    return op.target == aten.embedding.default and weight_placement == S(0)


def masked_embedding(weight: torch.Tensor, indices: torch.Tensor, start: int,
                     padding_idx: int = -1) -> torch.Tensor:
    """Lookup in the row shard `weight` = rows [start, start + len(weight)) of the table:
    indices outside the shard give zero rows. Summed over the shards, equals the full
    lookup; its gradient reaches only the shard's own rows. `padding_idx` is the global
    padding row (or negative for none); it is translated to the shard's numbering."""
    rows = weight.shape[0]
    local = indices - start
    inside = (local >= 0) & (local < rows)
    pad = padding_idx - start if 0 <= padding_idx - start < rows else -1
    looked = aten.embedding.default(weight, torch.where(inside, local, 0), pad)
    return looked * inside.unsqueeze(-1).to(looked.dtype)


SUM, MEAN, MAX = 0, 1, 2


def _embedding_bag(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                   scale_grad_by_freq: bool = False, mode: int = SUM, sparse: bool = False,
                   per_sample_weights: torch.Tensor | None = None,
                   include_last_offset: bool = False, padding_idx: int | None = None):
    """`embedding_bag` as lookups and scatters (see the module docstring); the same four
    outputs as torch's CPU kernel."""
    if sparse or indices.ndim != 1:
        return NotImplemented  # sparse gradients; 2-D indices arrive flattened by F.embedding_bag
    starts = offsets[:-1] if include_last_offset else offsets
    bags, count = starts.shape[0], indices.shape[0]
    marks = aten.index_add.default(indices.new_zeros(count + 1), 0, starts,
                                   torch.ones_like(starts))
    offset2bag = aten.sub.Tensor(aten.cumsum.default(marks[:count], 0), 1)
    pad = -1 if padding_idx is None else padding_idx
    bag = offset2bag if pad < 0 else torch.where(indices == pad, bags, offset2bag)
    rows = aten.embedding.default(weight, indices, pad, scale_grad_by_freq)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(1).to(rows.dtype)
    width = weight.shape[1]
    sizes = aten.index_add.default(indices.new_zeros(bags + 1), 0, bag,
                                   torch.ones_like(bag))[:bags]
    if mode == MAX:
        spread = bag.unsqueeze(1).expand(count, width)
        out = aten.scatter_reduce.two(rows.new_zeros(bags + 1, width), 0, spread, rows, "amax",
                                      include_self=False)
        # Which index gave each bag's maximum (among equal maxima, the largest index).
        won = torch.where(rows == out.index_select(0, bag),
                          indices.unsqueeze(1).expand(count, width), -1)
        max_indices = aten.scatter_reduce.two(indices.new_zeros(bags + 1, width), 0, spread,
                                              won, "amax", include_self=False)
        return out[:bags], offset2bag, sizes, max_indices[:bags]
    out = aten.index_add.default(rows.new_zeros(bags + 1, width), 0, bag, rows)[:bags]
    if mode == SUM:  # the kernel leaves bag_size and max_indices at zero for sums
        return out, offset2bag, torch.zeros_like(sizes), torch.zeros_like(sizes)
    return out / sizes.clamp(min=1).unsqueeze(1).to(out.dtype), offset2bag, sizes, sizes


DECOMPOSITIONS: dict[object, Callable] = {
    aten.embedding_bag.padding_idx: _embedding_bag,
    aten.embedding_bag.default: _embedding_bag,
    aten._embedding_bag.default: _embedding_bag,
}

RULES: dict[object, Rule] = {aten.embedding.default: _embedding}
