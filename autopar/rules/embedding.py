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
"""

from __future__ import annotations

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


RULES: dict[object, Rule] = {aten.embedding.default: _embedding}
