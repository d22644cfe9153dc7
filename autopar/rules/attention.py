"""scaled_dot_product_attention(q [..., L, E], k [..., S, E], v [..., S, Ev]) -> [..., L, Ev].

Splits over one mesh axis:

- any leading dim (batch, heads): q, k, v split on it, each operand `R` where it
  broadcasts that dim; with `enable_gqa` and fewer key/value heads, the heads dim (-3) is
  split in all three (the caller checks that the count divides the key/value heads, and then
  the query heads too, so each rank keeps whole groups); with a single key/value head, k and
  v stay `R` (every query head uses it);
- the query length L, when not `is_causal`: q split on L, k and v `R`. Causal masking is
  relative to the local query position, so it would mask the wrong keys on every rank but
  the first: not offered;
- context parallel: q split on L, k and v on their length S, output on L, causal or not,
  when no dropout is drawn and q, k, v have the same leading dims (but for grouped
  key/value heads). A boolean `attn_mask` (transformers builds its causal mask as one)
  is split with the queries, its key columns whole: each ring step reads the columns of
  the block at hand. A rank's local attention would see only its own keys, so this
  strategy carries an obligation of the lowering (5 in `autopar.rules`): run
  `autopar.runtime.ring_attention` over that axis, which passes the key/value blocks
  around the ring and merges the partial results. `context_axis` names the axis; one axis
  at most runs the ring, and no other axis splits the lengths (`admissible`).

An `attn_mask` broadcasts to [..., L, S]: it is split with the output where it has the dim,
`R` where it broadcasts it. Softmax makes the op non-linear: no `P`.
"""

from __future__ import annotations

import torch

from autopar.rules.base import AxisStrategy, OpSpec, Rule
from autopar.rules.common import R, S, argument, by_name, finish, follow, tensor_slots
from autopar.values.placement import Placement, Placements
from autopar.values.specs import TensorSpec

aten = torch.ops.aten


def _operand(q: TensorSpec, spec: TensorSpec, d: int, gqa: bool) -> Placement:
    """Placement of k or v for a split of q's leading dim d."""
    local = d - (q.ndim - spec.ndim)
    if local < 0 or spec.shape[local] == 1:
        return R  # broadcast (or a single shared key/value head)
    if spec.shape[local] == q.shape[d] or (gqa and d == q.ndim - 3):
        return S(local)
    return R


def _ring_possible(op: OpSpec, q: TensorSpec, k: TensorSpec, v: TensorSpec, mask,
                   gqa: bool) -> bool:
    """Whether the ring runtime can take this call: no dropout, no mask but a boolean one
    (on 4-d inputs), the same leading dims, and (causal) as many keys as queries."""
    heads = q.ndim - 3
    same_lead = q.ndim == k.ndim == v.ndim and all(
        q.shape[d] == k.shape[d] == v.shape[d] or (gqa and d == heads)
        for d in range(q.ndim - 2))
    causal = bool(argument(op, "is_causal", False))
    mask_fits = mask is None or (mask.dtype == torch.bool and q.ndim == 4 and mask.ndim <= 4)
    return (mask_fits and not argument(op, "dropout_p", 0.0) and same_lead
            and q.shape[-2] > 1 and k.shape[-2] > 1 and k.shape[-2] == v.shape[-2]
            and (not causal or q.shape[-2] == k.shape[-2]))


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
    if _ring_possible(op, q, k, v, mask, gqa):
        placed = {"query": S(length), "key": S(k.ndim - 2), "value": S(v.ndim - 2)}
        if mask is not None:
            placed["attn_mask"] = follow(scores, mask, S(length))
        strategies.append(by_name(op, placed, S(length)))
    return finish(strategies)


def context_axis(op: OpSpec, inputs: tuple[Placements, ...]) -> int | None:
    """The mesh axis on which attention `op` runs context parallel under a strategy with
    input placements `inputs` (one `Placements` per tensor input), else None: the axis
    where its keys are split along their length."""
    if op.target not in RING_TARGETS:
        return None
    slots = [name for name, _ in tensor_slots(op)]
    key = op.inputs[slots.index("key")]
    for axis, placement in enumerate(inputs[slots.index("key")]):
        if placement == S(key.ndim - 2):
            return axis
    return None


def admissible(op: OpSpec, inputs: tuple[Placements, ...], output: Placements) -> bool:
    """Whether a combination of per-axis strategies can run: at most one axis runs the
    ring, and then no other axis splits the query, key or value lengths (a rank's blocks
    are then whole chunks of the sequence, in ring order)."""
    ring = context_axis(op, inputs)
    if ring is None:
        return True
    slots = [name for name, _ in tensor_slots(op)]
    for name in ("query", "key", "value"):
        spec, placements = op.inputs[slots.index(name)], inputs[slots.index(name)]
        if any(p == S(spec.ndim - 2) for axis, p in enumerate(placements) if axis != ring):
            return False
    return True


RULES: dict[object, Rule] = {aten.scaled_dot_product_attention.default: _sdpa}
ADMISSIBLE = {aten.scaled_dot_product_attention.default: admissible}
# The ops with a context-parallel strategy.
RING_TARGETS = frozenset(ADMISSIBLE)
