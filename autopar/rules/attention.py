"""scaled_dot_product_attention(q [..., L, E], k [..., S, E], v [..., S, Ev]) -> [..., L, Ev].

Splits over one mesh axis:

- any leading dim (batch, heads): q, k, v split on it, each operand `R` where it
  broadcasts that dim; with `enable_gqa` and fewer key/value heads, the heads dim (-3) is
  split in all three (the caller checks that the count divides the key/value heads, and then
  the query heads too, so each rank keeps whole groups); with a single key/value head, k and
  v stay `R` (every query head uses it);
- the query length L, when not `is_causal`: q split on L, k and v `R`. Causal masking is
  relative to the local query position, so it would mask the wrong keys on every rank but
  the first: not offered. Splitting keys (ring/context attention) needs collectives inside
  the op: not offered.

An `attn_mask` broadcasts to [..., L, S]: it is split with the output where it has the dim,
`R` where it broadcasts it. Softmax makes the op non-linear: no `P`.
"""

from __future__ import annotations

import torch

from autopar.placement import Placement
from autopar.rules.base import AxisStrategy, OpSpec, Rule
from autopar.rules.common import R, S, argument, by_name, finish, follow, tensor_slots
from autopar.specs import TensorSpec

aten = torch.ops.aten


def _operand(q: TensorSpec, spec: TensorSpec, d: int, gqa: bool) -> Placement:
    """Placement of k or v for a split of q's leading dim d."""
    local = d - (q.ndim - spec.ndim)
    if local < 0 or spec.shape[local] == 1:
        return R  # broadcast (or a single shared key/value head)
    if spec.shape[local] == q.shape[d] or (gqa and d == q.ndim - 3):
        return S(local)
    return R


def _sdpa(op: OpSpec) -> list[AxisStrategy]:
    slots = dict(tensor_slots(op))
    q, k, v = slots["query"], slots["key"], slots["value"]
    mask = slots.get("attn_mask")
    out = op.outputs[0]
    gqa = bool(argument(op, "enable_gqa", False))
    scores = (*out.shape[:-1], k.shape[-2])  # what the mask broadcasts to: [..., L, S]
    strategies = []
    for d in range(q.ndim - 2):
        if q.shape[d] <= 1:
            continue
        placed = {"query": S(d), "key": _operand(q, k, d, gqa),
                  "value": _operand(q, v, d, gqa)}
        if mask is not None:
            placed["attn_mask"] = follow(scores, mask, S(d))
        strategies.append(by_name(op, placed, S(d)))
    length = q.ndim - 2
    if not argument(op, "is_causal", False) and q.shape[length] > 1:
        placed = {"query": S(length)}
        if mask is not None:
            placed["attn_mask"] = follow(scores, mask, S(length))
        strategies.append(by_name(op, placed, S(length)))
    return finish(strategies)


RULES: dict[object, Rule] = {aten.scaled_dot_product_attention.default: _sdpa}
