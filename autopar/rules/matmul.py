"""Matrix products: linear, mm, addmm, bmm, baddbmm, matmul (and einsum, in `einsum`).

For `a @ b` with a = [..., M, K] and b = [..., K, N] the splits over one mesh axis are the
Alpa set:

- batch: a dim of the broadcast batch, split in every operand that has it (`R` where an
  operand broadcasts it) -> the output is split there;
- M (rows of a) -> output split on M; N (columns of b) -> output split on N;
- K (the contraction): a split on K and b split on K -> each rank holds a summand, `P`;
- a `P` operand times an `R` one -> `P` (a product is linear in each factor).

`linear(x, W, bias)` is `x @ W.T + bias` with W = [N, K]: batch/sequence split (x on a leading
dim, W and bias `R`), column split (W `S(0)`, bias `S(0)` -> output `S(-1)`), row split
(x `S(-1)`, W `S(1)` -> `P`), and x `P` with W `R` -> `P`. An additive operand (bias of
`linear`, `self` of addmm/baddbmm) follows the output: split with it where it has the dim,
`R` where it broadcasts, and `P` when the output is `P`. A bias that is `R` on a row-split
rank would be added once per rank, so a partial output needs a partial bias: the row split
with a bias is offered with bias `P` (the caller converts the replicated parameter to a
summand, e.g. the value on one rank and zeros on the others); without a bias it needs
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from autopar.rules.base import AxisStrategy, OpSpec, Rule
from autopar.rules.common import P, R, S, finish, follow, is_float, tensor_slots
from autopar.rules.einsum import RULES as EINSUM_RULES
from autopar.values.placement import Placement, Shard
from autopar.values.specs import TensorSpec

aten = torch.ops.aten

Split = tuple[Placement, Placement, Placement]
"""(a, b, output) placements of one split of a product."""


def product_splits(a: Sequence[int], b: Sequence[int], out: Sequence[int],
                   partial_b: bool = True) -> list[Split]:
    """The splits of `torch.matmul(a, b)` (shapes), following its 1-D and broadcast rules."""
    a_k, b_k = len(a) - 1, (0 if len(b) == 1 else len(b) - 2)
    a_m = len(a) - 2 if len(a) >= 2 else None
    b_n = len(b) - 1 if len(b) >= 2 else None
    batch = len(out) - (a_m is not None) - (b_n is not None)
    splits: list[Split] = []
    for d in range(batch):
        if out[d] <= 1:
            continue
        pa = _batch_placement(a, batch, d, out[d])
        pb = _batch_placement(b, batch, d, out[d])
        if pa != R or pb != R:
            splits.append((pa, pb, S(d)))
    if a_m is not None and a[a_m] > 1:
        splits.append((S(a_m), R, S(batch)))
    if b_n is not None and b[b_n] > 1:
        splits.append((R, S(b_n), S(len(out) - 1)))
    if a[a_k] > 1:
        splits.append((S(a_k), S(b_k), P))
    splits.append((P, R, P))
    if partial_b:
        splits.append((R, P, P))
    return splits


def _batch_placement(shape: Sequence[int], batch: int, d: int, size: int) -> Placement:
    """Placement of an operand for output batch dim d: its aligned batch dim, else `R`."""
    own_batch = max(len(shape) - 2, 0)
    local = d - (batch - own_batch)
    return S(local) if local >= 0 and shape[local] == size else R


def _valid(split: Split, specs: Sequence[TensorSpec], out: TensorSpec) -> bool:
    """Partial only on floating operands and outputs."""
    partial = [s for p, s in zip(split, (*specs, out)) if p == P]
    return all(map(is_float, partial))


def _product(op: OpSpec) -> list[AxisStrategy]:
    """mm, bmm, matmul: two operands, no additive term."""
    a, b = op.inputs
    out = op.outputs[0]
    return finish(AxisStrategy((pa, pb), po)
                  for pa, pb, po in product_splits(a.shape, b.shape, out.shape)
                  if _valid((pa, pb, po), (a, b), out))


def _fused(first: str, second: str) -> Rule:
    """addmm / baddbmm: `beta * self + alpha * (first @ second)`, self broadcast to the
    output and following it."""

    def rule(op: OpSpec) -> list[AxisStrategy]:
        slots = dict(tensor_slots(op))
        a, b, add, out = slots[first], slots[second], slots["self"], op.outputs[0]
        strategies = []
        for pa, pb, po in product_splits(a.shape, b.shape, out.shape):
            placed = {first: pa, second: pb, "self": follow(out.shape, add, po)}
            if _valid((pa, pb, po), (a, b), out) and (po != P or is_float(add)):
                strategies.append(AxisStrategy(tuple(placed[n] for n, _ in tensor_slots(op)),
                                               po))
        return finish(strategies)

    return rule


def _weight_placement(b: Placement) -> Placement:
    """Placement of W = [N, K] given that of b = W.T = [K, N]."""
    if isinstance(b, Shard):
        return S(1 - b.dim)
    return b


def _linear(op: OpSpec) -> list[AxisStrategy]:
    slots = tensor_slots(op)
    specs = dict(slots)
    x, w, out = specs["input"], specs["weight"], op.outputs[0]
    b_shape = (w.shape[1], w.shape[0])
    strategies = []
    for px, pb, po in product_splits(x.shape, b_shape, out.shape, partial_b=False):
        placed = {"input": px, "weight": _weight_placement(pb)}
        if "bias" in specs:
            placed["bias"] = follow(out.shape, specs["bias"], po)
        if _valid((px, placed["weight"], po), (x, w), out):
            strategies.append(AxisStrategy(tuple(placed[n] for n, _ in slots), po))
    return finish(strategies)


RULES: dict[object, Rule] = {
    aten.linear.default: _linear,
    aten.mm.default: _product,
    aten.bmm.default: _product,
    aten.matmul.default: _product,
    aten.dot.default: _product,
    aten.addmm.default: _fused("mat1", "mat2"),
    aten.baddbmm.default: _fused("batch1", "batch2"),
    **EINSUM_RULES,
}
