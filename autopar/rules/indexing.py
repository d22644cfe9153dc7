"""Gathers and scatters by index tensors: index, index_select, gather, scatter_add,
scatter, scatter_reduce, index_add, index_put (what `x[i] = v`, `x[mask] = v` and
`x[i] += v` export to), index_copy (a static KV cache's update), index_fill, one_hot.

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
from autopar.rules.common import (
    P,
    R,
    S,
    argument,
    finish,
    follow,
    is_float,
    norm_dim,
    tensor_slots,
)
from autopar.values.placement import Placement
from autopar.values.specs import TensorSpec

aten = torch.ops.aten


class _Layout:
    """Where the dims of `x` go in `x[indices]` (advanced indexing, integer indices; None for
    a full slice): the indexed dims are replaced by the broadcast index shape, in place when
    they are adjacent, else at the front."""

    def __init__(self, src: TensorSpec, indices: list) -> None:
        self.positions = [k for k, t in enumerate(indices) if t is not None]
        self.specs: list[TensorSpec] = [indices[k] for k in self.positions]
        self.index_shape = tuple(torch.broadcast_shapes(*(s.shape for s in self.specs)))
        first, last = self.positions[0], self.positions[-1]
        self.adjacent = self.positions == list(range(first, last + 1))
        self.front = first if self.adjacent else 0
        self.rest = [d for d in range(src.ndim) if d not in self.positions]
        rest_sizes = [src.shape[d] for d in self.rest]
        self.shape = (*rest_sizes[:self.front], *self.index_shape, *rest_sizes[self.front:])

    def moved(self, d: int) -> int:
        """The result dim of a dim `d` of x that is not indexed."""
        nb = len(self.index_shape)
        if self.adjacent:
            return d if d < self.front else d - len(self.positions) + nb
        return nb + self.rest.index(d)

    def index_split(self, j: int) -> list[Placement]:
        """Placements of the index tensors that cut dim j of their broadcast shape."""
        nb = len(self.index_shape)
        placed = []
        for s in self.specs:
            local = j - (nb - s.ndim)
            placed.append(S(local) if local >= 0 and s.shape[local] == self.index_shape[j]
                          else R)
        return placed


def _is_mask(spec: TensorSpec) -> bool:
    return spec.dtype in (torch.bool, torch.uint8)


def _index(op: OpSpec) -> list[AxisStrategy]:
    """x[i0, i1, ...] with integer tensor indices (see `_Layout`)."""
    src, out = op.inputs[0], op.outputs[0]
    indices = argument(op, "indices")
    if all(t is None for t in indices) or any(t is not None and _is_mask(t) for t in indices):
        return []  # boolean masks give data-dependent shapes
    layout = _Layout(src, indices)
    none = [R] * len(layout.specs)
    strategies = [AxisStrategy((S(d), *none), S(layout.moved(d)))
                  for d in layout.rest if src.shape[d] > 1]
    strategies += [AxisStrategy((R, *layout.index_split(j)), S(layout.front + j))
                   for j, size in enumerate(layout.index_shape) if size > 1]
    if is_float(src) and is_float(out):
        strategies.append(AxisStrategy((P, *none), P))
    return finish(strategies)


def _index_put(op: OpSpec) -> list[AxisStrategy]:
    """index_put(self, indices, values, accumulate): `self[indices] = values` (or `+=`)."""
    dst, values = argument(op, "self"), argument(op, "values")
    indices = argument(op, "indices")
    accumulate = bool(argument(op, "accumulate", False))
    specs = [t for t in indices if t is not None]
    if not specs:
        return []
    if any(map(_is_mask, specs)):
        return _masked_put(op, dst, values, indices, accumulate)
    layout = _Layout(dst, indices)
    none = [R] * len(specs)
    strategies = [AxisStrategy((S(d), *none, follow(layout.shape, values, S(layout.moved(d)))),
                               S(d))
                  for d in layout.rest if dst.shape[d] > 1]
    linear = accumulate and is_float(dst) and is_float(values)
    if linear:
        # Each rank adds the values of its chunk of the index positions: a summand.
        for j, size in enumerate(layout.index_shape):
            if size > 1:
                placed = follow(layout.shape, values, S(layout.front + j))
                strategies.append(AxisStrategy((P, *layout.index_split(j), placed), P))
        strategies.append(AxisStrategy((P, *none, P), P))
    return finish(strategies)


def _index_copy(op: OpSpec) -> list[AxisStrategy]:
    """index_copy(self, dim, index, source): `self` with its rows `index` along `dim`
    replaced by `source`'s (a static KV cache's update). Any other dim keeps its split in
    `self`, `source` and the result; the index stays whole."""
    dst, source = op.inputs[0], argument(op, "source")
    dim = norm_dim(argument(op, "dim"), dst.ndim)
    return finish(AxisStrategy((S(d), R, S(d)), S(d)) for d in range(dst.ndim)
                  if d != dim and dst.shape[d] > 1 and source.shape[d] == dst.shape[d])


def _masked_put(op: OpSpec, dst: TensorSpec, values: TensorSpec, indices: list,
                accumulate: bool) -> list[AxisStrategy]:
    """`self[mask] = values` with one boolean mask over dims k .. k + m - 1 of self: the
    result of `self[mask]` has one dim of data-dependent size there."""
    positions = [k for k, t in enumerate(indices) if t is not None]
    if len(positions) != 1:
        return []  # several masks, or a mask with integer indices
    k = positions[0]
    mask = indices[k]
    m = mask.ndim
    # values broadcast to self[:k] + [count] + self[k + m:]; count is values' own size there
    # (or 1 when values are broadcast along it).
    shape = [*dst.shape[:k], 1, *dst.shape[k + m:]]
    offset = len(shape) - values.ndim
    if offset <= k:
        shape[k] = values.shape[k - offset]
    fill = offset > k or shape[k] == 1
    strategies = []
    for d in range(dst.ndim):
        if dst.shape[d] <= 1:
            continue
        if k <= d < k + m:
            if fill:  # the same values at every masked position
                strategies.append(AxisStrategy((S(d), S(d - k), R), S(d)))
            continue
        placed = follow(shape, values, S(d if d < k else d - m + 1))
        strategies.append(AxisStrategy((S(d), R, placed), S(d)))
    if accumulate and is_float(dst) and is_float(values):
        strategies.append(AxisStrategy((P, R, P), P))
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


def _scatter_reduce(op: OpSpec) -> list[AxisStrategy]:
    """scatter_reduce(self, dim, index, src, reduce, include_self)."""
    reduce, with_self = argument(op, "reduce"), bool(argument(op, "include_self", True))
    if reduce == "sum" and with_self:
        return _scatter(True, "src")(op)  # scatter_add
    strategies = _scatter(False, "src")(op)
    if reduce in ("sum", "mean") and all(map(is_float, op.inputs[::2])):
        strategies.append(AxisStrategy((P, R, P), P))
    return finish(strategies)


def _index_fill(op: OpSpec) -> list[AxisStrategy]:
    """index_fill(self, dim, index, value): the value (a scalar, or a 0-d tensor) written
    at the positions `index` names along `dim`."""
    dst, value = op.inputs[0], argument(op, "value")
    dim = norm_dim(argument(op, "dim"), dst.ndim)
    tensor_value = isinstance(value, TensorSpec)
    whole = (R, R) if tensor_value else (R,)  # index (and value) stay whole
    strategies = [AxisStrategy((S(d), *whole), S(d)) for d in range(dst.ndim)
                  if d != dim and dst.shape[d] > 1]
    if is_float(dst):
        # Linear in (self, value) jointly; a fill with the scalar 0 is linear in self alone.
        if tensor_value and is_float(value):
            strategies.append(AxisStrategy((P, R, P), P))
        elif not tensor_value and value == 0:
            strategies.append(AxisStrategy((P, R), P))
    return finish(strategies)


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
    aten.scatter_reduce.two: _scatter_reduce,
    aten.index_put.default: _index_put,
    aten.index_put_.default: _index_put,
    aten.index_copy.default: _index_copy,
    aten.index_copy_.default: _index_copy,
    aten.index_fill.int_Scalar: _index_fill,
    aten.index_fill.int_Tensor: _index_fill,
    aten.one_hot.default: _one_hot,
}
