"""Helpers shared by the rule files: placement shorthands, argument access, alignment.

Nothing here decides a strategy; the rule files do. These functions only read an `OpSpec`
(by schema argument name, so a rule does not care whether an argument came positionally or
by keyword) and build placements for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from autopar.rules.base import AxisStrategy, OpSpec
from autopar.values.placement import Partial, Placement, Replicate, Shard
from autopar.values.specs import TensorSpec

R: Placement = Replicate()
P: Placement = Partial("sum")


def S(dim: int) -> Placement:
    """`Shard(dim)`, short to keep strategy tables readable."""
    return Shard(dim)


def norm_dim(dim: int, ndim: int) -> int:
    """A possibly negative dim as an index in `range(ndim)` (0 for a 0-d tensor)."""
    return dim % ndim if ndim else 0


def dim_list(dims: int | Sequence[int] | None, ndim: int) -> list[int]:
    """Reduction dims as sorted indices; None or an empty list means every dim, as in ATen."""
    if dims is None:
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    if len(dims) == 0:
        return list(range(ndim))
    return sorted({norm_dim(d, ndim) for d in dims})


def arg_names(op: OpSpec) -> list[str]:
    """Schema argument names of the op's overload, in order ([] for a non-ATen target)."""
    schema = getattr(op.target, "_schema", None)
    return [a.name for a in schema.arguments] if schema is not None else []


def argument(op: OpSpec, name: str, default: Any = None) -> Any:
    """Argument `name`: given positionally or by keyword, else the schema default, else
    `default`."""
    names = arg_names(op)
    if name in names and names.index(name) < len(op.args):
        return op.args[names.index(name)]
    if name in op.kwargs:
        return op.kwargs[name]
    schema = getattr(op.target, "_schema", None)
    if schema is not None and name in names:
        value = schema.arguments[names.index(name)].default_value
        if value is not None:
            return value
    return default


def tensor_slots(op: OpSpec) -> list[tuple[str, TensorSpec]]:
    """(schema argument name, spec) of every tensor argument, in the order of `op.inputs`.

    The walk follows pytree order of (args, kwargs): positional arguments, lists in order,
    then keyword arguments in insertion order. A tuple of specs is the value of a
    multi-output producer, not a tensor input, and is skipped, as the strategy pass does.
    """
    names = arg_names(op)
    slots: list[tuple[str, TensorSpec]] = []

    def walk(name: str, value: Any) -> None:
        if isinstance(value, TensorSpec):
            slots.append((name, value))
        elif isinstance(value, list) or (isinstance(value, tuple) and not _multi(value)):
            for item in value:
                walk(name, item)

    for index, value in enumerate(op.args):
        walk(names[index] if index < len(names) else str(index), value)
    for name, value in op.kwargs.items():
        walk(name, value)
    assert len(slots) == len(op.inputs), (op.name, slots, op.inputs)
    return slots


def _multi(value: tuple) -> bool:
    return bool(value) and all(isinstance(v, TensorSpec) or v is None for v in value)


def by_name(op: OpSpec, placements: dict[str, Placement], output: Placement) -> AxisStrategy:
    """A strategy giving each tensor argument the placement named for it (default `R`)."""
    return AxisStrategy(tuple(placements.get(n, R) for n, _ in tensor_slots(op)), output)


def aligned_dim(out_shape: Sequence[int], spec: TensorSpec, dim: int) -> int | None:
    """The dim of `spec` that broadcasts onto output dim `dim` (right alignment), or None
    when `spec` lacks it or has it broadcast (size 1 against a larger output)."""
    local = dim - (len(out_shape) - spec.ndim)
    if local < 0 or spec.shape[local] != out_shape[dim]:
        return None
    return local


def follow(out_shape: Sequence[int], spec: TensorSpec, out: Placement) -> Placement:
    """Placement of a broadcast operand (a bias, an addend) that matches output placement
    `out`: the aligned shard, `R` where the operand is broadcast, `P` under a partial output
    (the operand is then a summand too, so it must be linear in it)."""
    if isinstance(out, Shard):
        local = aligned_dim(out_shape, spec, out.dim)
        return R if local is None else S(local)
    return out


def is_float(spec: TensorSpec) -> bool:
    """Partial placements only make sense for floating (or complex) values."""
    return spec.dtype.is_floating_point or spec.dtype.is_complex


def finish(strategies: Iterable[AxisStrategy]) -> list[AxisStrategy]:
    """Drop duplicates and the all-replicated strategy (the caller always adds it)."""
    seen: list[AxisStrategy] = []
    for s in strategies:
        if s in seen or (not any(map(_split, s.inputs)) and not _split(s.output)):
            continue
        seen.append(s)
    return seen


def _split(placement: Placement) -> bool:
    return not isinstance(placement, Replicate)


def unary_moves(pairs: Iterable[tuple[int, int]], src: TensorSpec, dst: TensorSpec,
                partial: bool) -> list[AxisStrategy]:
    """Strategies of a one-input op that maps input dim a to output dim b for each pair,
    plus `P -> P` when `partial` (the op is linear) and both sides are floating."""
    out = [AxisStrategy((S(a),), S(b)) for a, b in pairs
           if src.shape[a] > 1 and dst.shape[b] > 1]
    if partial and is_float(src) and is_float(dst):
        out.append(AxisStrategy((P,), P))
    return finish(out)


def draws(target, args: tuple, kwargs: dict) -> bool:
    """Whether a call of `target` (tagged `nondeterministic_seeded`) draws numbers: not
    with a zero dropout probability (`p`, `dropout_p`, `dropout`: scaled_dot_product_attention's
    is usually 0), `train=False`, or a one-layer RNN (its dropout is between layers)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return True
    for index, argument in enumerate(schema.arguments):
        value = args[index] if index < len(args) else kwargs.get(argument.name,
                                                                 argument.default_value)
        if argument.name in ("p", "dropout_p", "dropout", "num_layers") \
                and isinstance(value, (int, float)) \
                and value == (1 if argument.name == "num_layers" else 0):
            return False
        if argument.name == "train" and value is False:
            return False
    return True
