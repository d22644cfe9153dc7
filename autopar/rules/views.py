"""Shape ops that move elements without computing: view/reshape family, expand, permutes,
repeat. All are linear, so `P -> P` passes through each of them.

view/reshape: the input and output dims (size-1 dims left out) fall into consecutive groups
of equal product. Splitting the FIRST dim of an input group in n chunks gives each rank one
contiguous n-th of the group's elements, which is exactly what splitting the output group's
first dim in n chunks gives, so `S(first in) -> S(first out)` is offered for every group (the
caller checks that n divides both dims). Other dims of a group are not offered: their chunks
are strided in the flat order.

These ops carry global sizes as arguments (view's shape, expand's size, unflatten's sizes).
`LOCAL_ARGS` holds, for each of them, the rewrite to the sizes a rank must pass instead; see
`autopar.rules.local_args`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from autopar.rules.base import AxisStrategy, OpSpec, Rule
from autopar.rules.common import P, R, S, argument, finish, is_float, norm_dim, unary_moves
from autopar.values.placement import Placement

aten = torch.ops.aten

LocalArgs = Callable[[OpSpec, Sequence[int]], tuple[tuple[Any, ...], dict[str, Any]]]
"""(op, the rank's local output shape) -> (args, kwargs) a rank runs the op with."""


def view_groups(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, int]]:
    """(first input dim, first output dim) of each group of dims with equal products."""
    if 0 in src or 0 in dst:
        return []
    si = [i for i, n in enumerate(src) if n != 1]
    di = [j for j, n in enumerate(dst) if n != 1]
    pairs, i, j = [], 0, 0
    while i < len(si) and j < len(di):
        pairs.append((si[i], di[j]))
        ps, pd = src[si[i]], dst[di[j]]
        i, j = i + 1, j + 1
        while ps != pd:
            if ps < pd:
                ps, i = ps * src[si[i]], i + 1
            else:
                pd, j = pd * dst[di[j]], j + 1
    return pairs


def _reshape(op: OpSpec) -> list[AxisStrategy]:
    """view, reshape, flatten, unflatten, squeeze, unsqueeze: one rule, driven by shapes."""
    src, dst = op.inputs[0], op.outputs[0]
    return unary_moves(view_groups(src.shape, dst.shape), src, dst, partial=True)


def _squeeze_all(op: OpSpec) -> list[AxisStrategy]:
    """squeeze() drops every size-1 dim, and a dim split down to one row per rank would be
    dropped locally too, so no split is offered (squeeze.dims with the dims named is)."""
    src, dst = op.inputs[0], op.outputs[0]
    return unary_moves([], src, dst, partial=True)


def _view_as(op: OpSpec) -> list[AxisStrategy]:
    """view_as(self, other): `other` only gives the shape, so it takes the output's
    placement (a rank then reads the local shape off its local `other`), `R` under `P`."""
    src, dst = op.inputs[0], op.outputs[0]
    out = [AxisStrategy((S(a), S(b)), S(b)) for a, b in view_groups(src.shape, dst.shape)
           if src.shape[a] > 1 and dst.shape[b] > 1]
    if is_float(src):
        out.append(AxisStrategy((P, R), P))
    return finish(out)


def _expand_moves(src: Sequence[int], dst: Sequence[int]) -> list[tuple[Placement, int]]:
    """(input placement, output dim) pairs of an expand: a kept dim moves its split; a
    broadcast dim can be split in the output from a replicated input (each rank expands
    to its chunk)."""
    pad = len(dst) - len(src)
    moves: list[tuple[Placement, int]] = []
    for d, size in enumerate(dst):
        if size <= 1:
            continue
        local = d - pad
        moves.append((S(local) if local >= 0 and src[local] == size else R, d))
    return moves


def _expand(op: OpSpec) -> list[AxisStrategy]:
    src, dst = op.inputs[0], op.outputs[0]
    out = [AxisStrategy((p, *[S(d)] * (len(op.inputs) - 1)), S(d))
           for p, d in _expand_moves(src.shape, dst.shape)]
    if is_float(src):
        out.append(AxisStrategy((P, *[R] * (len(op.inputs) - 1)), P))
    return finish(out)


def permutation(op: OpSpec) -> list[int]:
    """Output dim j of a permuting op holds input dim `perm[j]`."""
    ndim = op.inputs[0].ndim
    perm = list(range(ndim))
    name = op.target.overloadpacket.__name__ if hasattr(op.target, "overloadpacket") else ""
    if name == "permute":
        return [norm_dim(d, ndim) for d in argument(op, "dims")]
    if name in ("transpose", "swapaxes", "swapdims"):
        keys = ("axis0", "axis1") if name == "swapaxes" else ("dim0", "dim1")
        a, b = (norm_dim(argument(op, k), ndim) for k in keys)
        perm[a], perm[b] = perm[b], perm[a]
    elif name == "t" and ndim == 2:
        perm = [1, 0]
    elif name == "mT":
        perm[-2], perm[-1] = perm[-1], perm[-2]
    elif name == "movedim":
        src, dst = argument(op, "source"), argument(op, "destination")
        src = [norm_dim(d, ndim) for d in ([src] if isinstance(src, int) else src)]
        dst = [norm_dim(d, ndim) for d in ([dst] if isinstance(dst, int) else dst)]
        order: list[int | None] = [None] * ndim
        for s, d in zip(src, dst):
            order[d] = s
        rest = iter(i for i in range(ndim) if i not in src)
        perm = [next(rest) if o is None else o for o in order]
    return perm


def _permute(op: OpSpec) -> list[AxisStrategy]:
    src, dst = op.inputs[0], op.outputs[0]
    pairs = [(p, j) for j, p in enumerate(permutation(op))]
    return unary_moves(pairs, src, dst, partial=True)


def _repeat(op: OpSpec) -> list[AxisStrategy]:
    """repeat tiles; only dims repeated once keep a clean split."""
    src, dst = op.inputs[0], op.outputs[0]
    repeats = argument(op, "repeats")
    pad = len(repeats) - src.ndim
    pairs = [(d - pad, d) for d in range(pad, len(repeats)) if repeats[d] == 1]
    return unary_moves(pairs, src, dst, partial=True)


def _replace(op: OpSpec, name: str, value: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`op`'s args/kwargs with argument `name` set to `value`, where it was given."""
    names = [a.name for a in op.target._schema.arguments]
    index = names.index(name)
    args, kwargs = list(op.args), dict(op.kwargs)
    if index < len(args):
        args[index] = value
    elif name in kwargs:
        kwargs[name] = value
    return tuple(args), kwargs


def _shape_arg(name: str) -> LocalArgs:
    """The argument `name` is the output shape: a rank passes its local output shape."""
    return lambda op, shape: _replace(op, name, list(shape))


def _unflatten_args(op: OpSpec, shape: Sequence[int]) -> tuple[tuple[Any, ...], dict]:
    dim = norm_dim(argument(op, "dim"), op.inputs[0].ndim)
    count = len(argument(op, "sizes"))
    return _replace(op, "sizes", list(shape)[dim:dim + count])


_RESHAPES = (
    aten.view.default, aten.reshape.default, aten._unsafe_view.default,
    aten.flatten.using_ints, aten.unflatten.int, aten.squeeze.dim,
    aten.squeeze.dims, aten.unsqueeze.default,
)
_PERMUTES = (
    aten.permute.default, aten.transpose.int, aten.swapaxes.default, aten.swapdims.default,
    aten.t.default, aten.mT.default, aten.movedim.int, aten.movedim.intlist,
)

RULES: dict[object, Rule] = {
    **{op: _reshape for op in _RESHAPES},
    **{op: _permute for op in _PERMUTES},
    aten.squeeze.default: _squeeze_all,
    aten.view_as.default: _view_as,
    aten.expand.default: _expand,
    aten.expand_as.default: _expand,
    aten.repeat.default: _repeat,
}

LOCAL_ARGS: dict[object, LocalArgs] = {
    aten.view.default: _shape_arg("size"),
    aten.reshape.default: _shape_arg("shape"),
    aten._unsafe_view.default: _shape_arg("size"),
    aten.expand.default: _shape_arg("size"),
    aten.unflatten.int: _unflatten_args,
}
