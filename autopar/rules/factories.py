"""Ops whose output does not depend on input values: factories, `*_like`, `new_*`, and
queries of a tensor's metadata.

- Factories with no tensor input (arange, zeros, ones, full, empty, scalar_tensor, rand, ...)
  are replicated only: the rule returns no split. Random factories must then draw the same
  values on every rank (a same-seeded generator), an obligation of the runtime.
- `*_like(x)` makes a tensor of x's local shape: split like x. From a `P` input (full shape)
  the deterministic ones give the full constant, `R`.
- `new_*(x, size)` takes only dtype and device from x: whatever x's placement, the output is
  the full tensor, `R`.
- `_assert_tensor_metadata` (dtype/device checks) and `sym_size(x, dim)` read no values:
  any placement works, except that a queried size (or an asserted shape) must be global, so
  that dim stays whole. They have no tensor output; their output placement is `R` by
  convention. `item` needs the whole (one-element) value: replicated only.
"""

from __future__ import annotations

import torch

from autopar.rules.base import AxisStrategy, OpSpec, Rule
from autopar.rules.common import P, R, S, argument, finish, is_float, norm_dim

aten = torch.ops.aten


def _replicated(op: OpSpec) -> list[AxisStrategy]:
    return []


def _like(deterministic: bool) -> Rule:
    def rule(op: OpSpec) -> list[AxisStrategy]:
        (src,) = op.inputs
        out = [AxisStrategy((S(d),), S(d)) for d in range(src.ndim) if src.shape[d] > 1]
        if deterministic and is_float(src):
            out.append(AxisStrategy((P,), R))
        return finish(out)

    return rule


def _any_input(keep: str | None = None) -> Rule:
    """Input in any placement, output `R`; dim argument `keep` (if any) stays whole."""

    def rule(op: OpSpec) -> list[AxisStrategy]:
        (src,) = op.inputs
        whole = norm_dim(argument(op, keep), src.ndim) if keep else None
        out = [AxisStrategy((S(d),), R) for d in range(src.ndim)
               if src.shape[d] > 1 and d != whole]
        if is_float(src):
            out.append(AxisStrategy((P,), R))
        return finish(out)

    return rule


def _assert_metadata(op: OpSpec) -> list[AxisStrategy]:
    if argument(op, "size") is not None or argument(op, "stride") is not None:
        return []
    return _any_input()(op)


_NO_INPUT = (
    "arange", "zeros", "ones", "full", "empty", "empty_strided", "scalar_tensor", "rand",
    "randn", "randint", "randperm", "eye", "linspace", "logspace", "_assert_scalar",
    "item", "_local_scalar_dense", "sym_numel", "sym_stride", "sym_storage_offset",
)
_LIKE = {
    "zeros_like": True, "ones_like": True, "full_like": True, "empty_like": False,
    "rand_like": False, "randn_like": False, "randint_like": False,
}


def _table() -> dict[object, Rule]:
    rules: dict[object, Rule] = {getattr(aten, n): _replicated for n in _NO_INPUT}
    rules.update({getattr(aten, n): _like(det) for n, det in _LIKE.items()})
    for name in ("new_zeros", "new_ones", "new_full", "new_empty", "new_empty_strided"):
        rules[getattr(aten, name)] = _any_input()
    rules[aten.sym_size.int] = _any_input(keep="dim")
    rules[aten._assert_tensor_metadata.default] = _assert_metadata
    return rules


RULES: dict[object, Rule] = _table()

# No gradient flows from the output of any of these ops into its inputs.
NO_GRADIENT: frozenset = frozenset(RULES)
