"""Elementwise ops, with broadcasting.

Any output dim can be split, provided every operand that has that dim (right-aligned, not
broadcast) is split along it the same way; an operand that lacks the dim or has it of size 1
stays `R`, which is correct because each rank then broadcasts the whole of it over its chunk.

`Partial` is offered only where the op is linear in the partial operands with the others
fixed (`_linear_*` below say which): `add`/`sub` of two partials, `mul` of one partial by a
replicated factor or a scalar, `div` of a partial by a replicated divisor or a scalar, `neg`,
copies and float-to-float casts, `where`/`masked_fill` that select or write zero. Adding a
scalar to a partial is affine, not linear, so `add(P, 1.0)` is never offered.

An in-place op (`mul_`, ...) writes its result into `self`, so only strategies where `self`
already has the output placement are kept.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autopar.rules.base import AxisStrategy, OpSpec, Rule
from autopar.rules.common import P, R, S, argument, finish, follow, is_float, tensor_slots
from autopar.values.specs import TensorSpec

aten = torch.ops.aten

Linear = Callable[[OpSpec], list[set[str]]]
"""Which groups of tensor arguments (by schema name) the op is jointly linear in."""


def _is_tensor(op: OpSpec, name: str) -> bool:
    return isinstance(argument(op, name), TensorSpec)


def _linear_self(op: OpSpec) -> list[set[str]]:
    return [{"self"}]


def _linear_add(op: OpSpec) -> list[set[str]]:
    # x + y is linear in (x, y) jointly; x + scalar is affine.
    return [{"self", "other"}] if _is_tensor(op, "other") else []


def _linear_mul(op: OpSpec) -> list[set[str]]:
    return [{"self"}, {"other"}] if _is_tensor(op, "other") else [{"self"}]


def _linear_div(op: OpSpec) -> list[set[str]]:
    # Rounding modes (floor, trunc) are not linear.
    return [{"self"}] if argument(op, "rounding_mode") is None else []


def _linear_cast(op: OpSpec) -> list[set[str]]:
    # A cast between float types is linear up to rounding; to an integer type it is not.
    return [{"self"}] if is_float(op.outputs[0]) else []


def _linear_where(op: OpSpec) -> list[set[str]]:
    tensors = {n for n, _ in tensor_slots(op)} - {"condition"}
    scalars = {n for n in ("self", "other") if n not in tensors}
    # Selecting between summands is linear; selecting a nonzero constant is not.
    if any(argument(op, n) != 0 for n in scalars):
        return []
    return [tensors] if tensors else []


def _linear_masked_fill(op: OpSpec) -> list[set[str]]:
    value = argument(op, "value")
    return [{"self"}] if not isinstance(value, TensorSpec) and value == 0 else []


def _linear_broadcast(op: OpSpec) -> list[set[str]]:
    return [{"tensors"}]


def is_inplace(op: OpSpec) -> bool:
    """True for ops that write their result into their first argument."""
    schema = getattr(op.target, "_schema", None)
    if schema is None or not schema.arguments:
        return False
    info = schema.arguments[0].alias_info
    return bool(info is not None and info.is_write)


def pointwise(linear: Linear | None = None, skip: frozenset[str] = frozenset()) -> Rule:
    """Rule for an elementwise op; `skip` names tensor arguments that only supply a dtype
    or device (they stay `R`)."""

    def rule(op: OpSpec) -> list[AxisStrategy]:
        out = op.outputs[0]
        slots = tensor_slots(op)
        strategies = []
        for d in range(out.ndim):
            if out.shape[d] <= 1:
                continue
            ins = tuple(R if n in skip else follow(out.shape, s, S(d)) for n, s in slots)
            if any(p != R for p in ins):
                strategies.append(AxisStrategy(ins, S(d)))
        if linear is not None and all(map(is_float, op.outputs)):
            for group in linear(op):
                ins = tuple(P if n in group else R for n, _ in slots)
                if P in ins and all(is_float(s) for n, s in slots if n in group):
                    strategies.append(AxisStrategy(ins, P))
        if is_inplace(op):
            strategies = [s for s in strategies if s.inputs[0] == s.output]
        return finish(strategies)

    return rule


def _triangle(op: OpSpec) -> list[AxisStrategy]:
    """triu/tril mask the last two dims, so only leading dims can be split; linear."""
    (spec,) = op.inputs
    out = [AxisStrategy((S(d),), S(d)) for d in range(spec.ndim - 2) if spec.shape[d] > 1]
    if is_float(spec):
        out.append(AxisStrategy((P,), P))
    return finish(out)


def _nonzero(op: OpSpec) -> list[AxisStrategy]:
    """where(cond) with one argument is nonzero: data-dependent output, replicated only."""
    return []


_NONLINEAR = (
    "abs", "acos", "asin", "atan", "ceil", "floor", "round", "trunc", "frac", "cos", "cosh",
    "sin", "sinh", "tan", "tanh", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p",
    "sqrt", "rsqrt", "reciprocal", "sigmoid", "logit", "erf", "erfc", "erfinv", "sign", "sgn",
    "square", "gelu", "silu", "relu", "relu6", "leaky_relu", "elu", "selu", "celu", "hardtanh",
    "hardsigmoid", "hardswish", "mish", "softplus", "threshold", "logical_not", "logical_and",
    "logical_or", "logical_xor", "bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor",
    "__and__", "__or__", "__xor__",
    "eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "isfinite", "nan_to_num", "clamp",
    "clamp_min", "clamp_max", "clip", "maximum", "minimum", "fmax", "fmin", "pow",
    "remainder", "fmod", "floor_divide", "atan2", "lerp", "addcmul", "addcdiv", "copysign",
    "xlogy", "hypot", "fill", "copy", "dropout", "native_dropout", "bernoulli",
)
"""Elementwise ops offered splits but no Partial. Random ones (dropout) are here too:
a partial input would see a different mask on every rank."""

_LINEAR: dict[str, Linear] = {
    "neg": _linear_self, "positive": _linear_self, "clone": _linear_self,
    "contiguous": _linear_self, "alias": _linear_self, "detach": _linear_self,
    "lift_fresh_copy": _linear_self, "_to_copy": _linear_cast, "to": _linear_cast,
    "add": _linear_add, "sub": _linear_add, "rsub": _linear_add, "mul": _linear_mul,
    "div": _linear_div, "masked_fill": _linear_masked_fill,
    "broadcast_tensors": _linear_broadcast,
}


def _table() -> dict[object, Rule]:
    rules: dict[object, Rule] = {}
    entries = [(name, pointwise()) for name in _NONLINEAR]
    entries += [(name, pointwise(lin)) for name, lin in _LINEAR.items()]
    for name, rule in entries:
        for variant in (name, name + "_"):
            if hasattr(aten, variant):
                rules[getattr(aten, variant)] = rule
    # Overloads whose meaning differs from their packet's.
    where = pointwise(_linear_where)
    rules.update({
        aten.where.self: where, aten.where.ScalarOther: where, aten.where.ScalarSelf: where,
        aten.where.Scalar: where, aten.where.default: _nonzero,
        aten.max.other: pointwise(), aten.min.other: pointwise(),
        aten.to.other: pointwise(_linear_cast, skip=frozenset({"other"})),
        aten.type_as.default: pointwise(_linear_cast, skip=frozenset({"other"})),
        aten.triu.default: _triangle, aten.tril.default: _triangle,
        aten.triu_.default: _triangle, aten.tril_.default: _triangle,
    })
    return rules


RULES: dict[object, Rule] = _table()

__all__ = ["RULES", "is_inplace", "pointwise"]
