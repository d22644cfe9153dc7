"""Gathers and scatters by index tensors: index, index_select, gather, scatter_add,
scatter, index_add, one_hot.

A dim that is looked up by index values cannot be split in the looked-up tensor (a rank's
chunk would not hold the rows named), but every other dim keeps its split, and the index
tensor itself can be split (each rank looks up its own indices in the whole table). Gathers
are linear in the looked-up tensor (`P` table, `R` indices -> `P`). Accumulating scatters
(`scatter_add`, `index_add`) are linear in (self, src) jointly, and a rank holding a chunk of
the indices and the matching chunk of src adds a summand of the total: with `self` `P`, the
output is `P` (the expert-combine step of a mixture of experts).
"""

from __future__ import annotations

import torch

from autopar.rules.base import AxisStrategy, OpSpec, Rule
from autopar.rules.common import P, R, S, argument, finish, is_float, norm_dim, tensor_slots
from autopar.specs import TensorSpec

aten = torch.ops.aten


def _index(op: OpSpec) -> list[AxisStrategy]:
    """x[i0, i1, ...] with tensor indices (None for a full slice), the advanced-indexing
    layout: indexed dims are replaced by the broadcast index shape, in place when they are
    adjacent, else at the front."""
    src, out = op.inputs[0], op.outputs[0]
    indices = argument(op, "indices")
    positions = [k for k, t in enumerate(indices) if t is not None]
    specs: list[TensorSpec] = [indices[k] for k in positions]
    if not specs or any(s.dtype in (torch.bool, torch.uint8) for s in specs):
        return []  # boolean masks give data-dependent shapes
    shape = tuple(torch.broadcast_shapes(*(s.shape for s in specs)))
    nb = len(shape)
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    front = positions[0] if adjacent else 0
    rest = [d for d in range(src.ndim) if d not in positions]
    strategies = []
    for d in rest:
        to = (d if d < front else d - len(positions) + nb) if adjacent else nb + rest.index(d)
        if src.shape[d] > 1:
            strategies.append(AxisStrategy((S(d), *[R] * len(specs)), S(to)))
    for j in range(nb):
        if shape[j] <= 1:
            continue
        ins = []
        for s in specs:
            local = j - (nb - s.ndim)
            ins.append(S(local) if local >= 0 and s.shape[local] == shape[j] else R)
        strategies.append(AxisStrategy((R, *ins), S(front + j)))
    if is_float(src) and is_float(out):
        strategies.append(AxisStrategy((P, *[R] * len(specs)), P))
    return finish(strategies)


def _index_select(op: OpSpec) -> list[AxisStrategy]:
    src, index = op.inputs
    dim = norm_dim(argument(op, "dim"), src.ndim)
    strategies = [AxisStrategy((S(d), R), S(d)) for d in range(src.ndim)
                  if d != dim and src.shape[d] > 1]
    if index.ndim == 1 and index.shape[0] > 1:
        strategies.append(AxisStrategy((R, S(0)), S(dim)))
    if is_float(src):
        strategies.append(AxisStrategy((P, R), P))
    return finish(strategies)


def _gather(op: OpSpec) -> list[AxisStrategy]:
    """out[i][j] = self[index[i][j]][j] (dim 0): other dims line up when sizes agree."""
    src, index = op.inputs
    dim = norm_dim(argument(op, "dim"), src.ndim)
    strategies = [AxisStrategy((S(d), S(d)), S(d)) for d in range(src.ndim)
                  if d != dim and src.shape[d] == index.shape[d] > 1]
    if index.shape[dim] > 1:
        strategies.append(AxisStrategy((R, S(dim)), S(dim)))
    if is_float(src):
        strategies.append(AxisStrategy((P, R), P))
    return finish(strategies)


def _scatter(accumulate: bool, source: str):
    """scatter_add / index_add (accumulate) and scatter (overwrite)."""

    def rule(op: OpSpec) -> list[AxisStrategy]:
        slots = dict(tensor_slots(op))
        names = [n for n, _ in tensor_slots(op)]
        dst, index = slots["self"], slots["index"]
        src = slots.get(source)
        dim = norm_dim(argument(op, "dim"), dst.ndim)
        flat = index.ndim <= 1 and dst.ndim > 1  # index_add: a 1-D list of rows
        strategies = []
        others = [t for t in (index, src) if t is not None]
        for d in range(dst.ndim):
            if d == dim or dst.shape[d] <= 1:
                continue
            if flat and src is not None and src.shape[d] == dst.shape[d]:
                placed = {"self": S(d), source: S(d)}
            elif not flat and all(t.ndim == dst.ndim and t.shape[d] == dst.shape[d]
                                  for t in others):
                # scatter reads index and src only where index has entries: sizes must agree
                placed = {"self": S(d), "index": S(d), source: S(d)}
            else:
                continue
            strategies.append(AxisStrategy(tuple(placed.get(n, R) for n in names), S(d)))
        if accumulate and is_float(dst) and src is not None and is_float(src):
            along = 0 if flat else dim
            if index.shape[along] > 1 and index.shape[along] == src.shape[dim]:
                placed = {"self": P, "index": S(along), source: S(dim)}
                strategies.append(AxisStrategy(tuple(placed.get(n, R) for n in names), P))
            placed = {"self": P, source: P}
            strategies.append(AxisStrategy(tuple(placed.get(n, R) for n in names), P))
        return finish(strategies)

    return rule


def _one_hot(op: OpSpec) -> list[AxisStrategy]:
    src = op.inputs[0]
    if argument(op, "num_classes", -1) < 0:
        return []  # the class count would be each rank's own maximum
    return finish(AxisStrategy((S(d),), S(d)) for d in range(src.ndim) if src.shape[d] > 1)


RULES: dict[object, Rule] = {
    aten.index.Tensor: _index,
    aten.index_select.default: _index_select,
    aten.gather.default: _gather,
    aten.scatter_add.default: _scatter(True, "src"),
    aten.index_add.default: _scatter(True, "source"),
    aten.scatter.src: _scatter(False, "src"),
    aten.scatter.value: _scatter(False, "src"),
    aten.one_hot.default: _one_hot,
}
