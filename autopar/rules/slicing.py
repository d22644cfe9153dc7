"""Ops that cut, join or shift along dims: split, chunk, unbind, slice, narrow, select, cat,
stack, repeat_interleave, pad (constant_pad_nd), diff, and their inverses slice_scatter and
select_scatter (what `x[:, 2:5] = y` and `x[:, 2] = y` export to). All are linear (`P -> P`;
the scatters jointly in self and src), but for a pad with a non-zero value or a non-constant
mode.

The dim being cut (or joined) cannot be split: a rank's chunk would not hold the positions
the op names. Any other dim keeps its split. Two exceptions, both exact: a `slice` that keeps
the whole dim (start 0, step 1, end past the size; what `x[:T]` gives when T is the full
length) is the identity there, and `repeat_interleave` with an int count repeats each element
in place, so chunk i of the input gives chunk i of the output along the repeated dim too. A
pad works on the dims its pad list names (the last ones), a diff on its `dim` (its prepend
and append tensors split with the input). A scatter writes src into the positions of `dim`
it names: self and src split together on any other dim (src lacks `dim` in select_scatter),
and on `dim` too for a slice_scatter over the whole dim (the output is then src).

`x[:, 2:5] = y` exports as `slice_scatter(x, copy(slice(x), y), ...)`, and the functional
`aten.copy` has no derivative in eager torch (the rank programs run eagerly), so such a
model could not train. `DECOMPOSITIONS` (run by capture) writes `copy(self, src)` as what it
computes, src cast to self's dtype, broadcast to self's shape and cloned: ops with rules
and derivatives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from autopar.rules.base import AxisStrategy, OpSpec, Rule
from autopar.rules.common import P, R, S, argument, finish, is_float, norm_dim, unary_moves

aten = torch.ops.aten


def _cut(keep_cut: bool = False, drops_dim: bool = False):
    """Rule for a one-input op that cuts `dim`: every other dim maps to itself (shifted down
    when the op removes `dim`)."""

    def rule(op: OpSpec) -> list[AxisStrategy]:
        src, dst = op.inputs[0], op.outputs[0]
        dim = norm_dim(argument(op, "dim", 0), src.ndim)
        pairs = []
        for d in range(src.ndim):
            if d == dim and not (keep_cut and _whole_slice(op, src.shape[dim])):
                continue
            pairs.append((d, d - 1 if drops_dim and d > dim else d))
        return unary_moves(pairs, src, dst, partial=True)

    return rule


def _whole_slice(op: OpSpec, size: int) -> bool:
    start, end, step = argument(op, "start"), argument(op, "end"), argument(op, "step", 1)
    return start in (None, 0) and step == 1 and (end is None or end >= size)


def _join(new_dim: bool):
    """cat (new_dim False) or stack (True): every input split the same way on a dim other
    than the joined one."""

    def rule(op: OpSpec) -> list[AxisStrategy]:
        out = op.outputs[0]
        dim = norm_dim(argument(op, "dim", 0), out.ndim)
        # Legacy cat accepts empty 1-D inputs of any other shape; they are replicated.
        joined = [s.ndim == out.ndim - new_dim for s in op.inputs]
        strategies = []
        for d in range(out.ndim):
            if d == dim or out.shape[d] <= 1:
                continue
            src = d - 1 if new_dim and d > dim else d
            ins = tuple(S(src) if j else R for j in joined)
            strategies.append(AxisStrategy(ins, S(d)))
        if all(map(is_float, op.inputs)):
            strategies.append(AxisStrategy((P,) * len(op.inputs), P))
        return finish(strategies)

    return rule


def _repeat_interleave(op: OpSpec) -> list[AxisStrategy]:
    """repeat_interleave(x, int, dim): any dim keeps its split, the repeated one included."""
    src, dst = op.inputs[0], op.outputs[0]
    if argument(op, "dim") is None:
        # Flattens first: only the leading dim maps to a contiguous output range.
        return unary_moves([(0, 0)] if src.ndim else [], src, dst, partial=True)
    return unary_moves([(d, d) for d in range(src.ndim)], src, dst, partial=True)


def _repeat_interleave_args(op: OpSpec, shape: Sequence[int]) -> tuple[tuple, dict[str, Any]]:
    """A given `output_size` is the global length of the repeated dim: use the local one."""
    size = argument(op, "output_size")
    args, kwargs = tuple(op.args), dict(op.kwargs)
    if size is None:
        return args, kwargs
    dim = argument(op, "dim")
    dim = 0 if dim is None else norm_dim(dim, op.outputs[0].ndim)
    names = [a.name for a in op.target._schema.arguments]
    index = names.index("output_size")
    local = shape[dim]
    if index < len(args):
        args = (*args[:index], local, *args[index + 1:])
    else:
        kwargs["output_size"] = local
    return args, kwargs


def _pad(op: OpSpec) -> list[AxisStrategy]:
    """pad / constant_pad_nd: pairs of the pad list apply to the last dims, last first."""
    src, dst = op.inputs[0], op.outputs[0]
    pad = list(argument(op, "pad", ()))
    padded = {src.ndim - 1 - i for i in range(len(pad) // 2) if pad[2 * i] or pad[2 * i + 1]}
    linear = argument(op, "mode", "constant") == "constant" and not argument(op, "value")
    return unary_moves([(d, d) for d in range(src.ndim) if d not in padded], src, dst,
                       partial=linear)


def _diff(op: OpSpec) -> list[AxisStrategy]:
    """diff(x, n, dim, prepend, append): differences along `dim`; prepend and append (same
    rank as x) are joined to it there first."""
    out = op.outputs[0]
    dim = norm_dim(argument(op, "dim", -1), out.ndim)
    strategies = [AxisStrategy(tuple(S(d) for _ in op.inputs), S(d))
                  for d in range(out.ndim) if d != dim and out.shape[d] > 1]
    if all(map(is_float, op.inputs)):
        strategies.append(AxisStrategy((P,) * len(op.inputs), P))
    return finish(strategies)


def _slice_scatter(op: OpSpec) -> list[AxisStrategy]:
    """slice_scatter(self, src, dim, start, end, step): src is self's slice, same rank."""
    dst = op.outputs[0]
    dim = norm_dim(argument(op, "dim", 0), dst.ndim)
    whole = _whole_slice(op, dst.shape[dim])
    strategies = [AxisStrategy((S(d), S(d)), S(d)) for d in range(dst.ndim)
                  if (d != dim or whole) and dst.shape[d] > 1]
    return _with_partial(op, strategies)


def _select_scatter(op: OpSpec) -> list[AxisStrategy]:
    """select_scatter(self, src, dim, index): src is self without `dim`."""
    dst = op.outputs[0]
    dim = norm_dim(argument(op, "dim"), dst.ndim)
    strategies = [AxisStrategy((S(d), S(d - (d > dim))), S(d)) for d in range(dst.ndim)
                  if d != dim and dst.shape[d] > 1]
    return _with_partial(op, strategies)


def _with_partial(op: OpSpec, strategies: list[AxisStrategy]) -> list[AxisStrategy]:
    if all(map(is_float, op.inputs)):
        strategies.append(AxisStrategy((P,) * len(op.inputs), P))
    return finish(strategies)


RULES: dict[object, Rule] = {
    aten.slice_scatter.default: _slice_scatter,
    aten.select_scatter.default: _select_scatter,
    aten.pad.default: _pad,
    aten.constant_pad_nd.default: _pad,
    aten.diff.default: _diff,
    aten.split.Tensor: _cut(),
    aten.split_with_sizes.default: _cut(),
    aten.chunk.default: _cut(),
    aten.unsafe_split.Tensor: _cut(),
    aten.narrow.default: _cut(),
    aten.slice.Tensor: _cut(keep_cut=True),
    aten.select.int: _cut(drops_dim=True),
    aten.unbind.int: _cut(drops_dim=True),
    aten.cat.default: _join(new_dim=False),
    aten.stack.default: _join(new_dim=True),
    aten.repeat_interleave.self_int: _repeat_interleave,
}

LOCAL_ARGS = {aten.repeat_interleave.self_int: _repeat_interleave_args}


def _copy(x: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if src.dtype != x.dtype or src.device != x.device:
        src = aten._to_copy.default(src, dtype=x.dtype, device=x.device)
    return aten.clone.default(aten.expand.default(src, list(x.shape)))


DECOMPOSITIONS: dict[object, Callable] = {aten.copy.default: _copy}
