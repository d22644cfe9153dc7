"""Reductions and ops along one dim: sum, mean, amax, max, argmax, var_mean, norms of
vectors, softmax, log_softmax, cumsum, cumprod, cummax, cummin, topk, sort.

A dim that is not reduced keeps its split. A reduced dim can be split only for a sum: each
rank's sum over its chunk is a summand of the total, so `S(d) -> P` (for any dtype: sums of
integers are exact). `mean` is linear, so `P -> P` passes through it, but a mean over a split
dim is NOT offered: the local mean over a chunk of k of N elements is k/N times a summand,
not a summand, and by the contract a rank's output is the op on its local inputs, unscaled.
(`decompositions.DECOMPOSITIONS` rewrites a mean as `sum(x) / N`, which these rules cover
exactly.) max/min/amax/var/norm over a split dim would need a non-sum reduction and are
not offered. softmax, the scans (cumsum, cumprod, cummax, cummin), topk and sort work along
`dim`, which must stay whole; every other dim keeps its split, and the indices cummax,
cummin, topk and sort return are positions along `dim`, the same on a rank's chunk.
"""

from __future__ import annotations

import torch

from autopar.rules.base import AxisStrategy, OpSpec, Rule
from autopar.rules.common import P, S, argument, dim_list, finish, is_float, norm_dim

aten = torch.ops.aten


def reduction(dims: str | None = "dim", split_to_partial: bool = False,
              partial_through: bool = False, none_flattens: bool = False) -> Rule:
    """Rule for a reduction over argument `dims` (None: the op reduces every dim).

    `split_to_partial`: a split reduced dim gives `P` (sums). `partial_through`: `P -> P`
    (the op is linear). `none_flattens`: a None dim means "over the flattened tensor",
    whose result (an index) cannot be computed from chunks.
    """

    def rule(op: OpSpec) -> list[AxisStrategy]:
        src = op.inputs[0]
        raw = None if dims is None else argument(op, dims)
        if raw is None and none_flattens:
            return []
        reduced = dim_list(raw, src.ndim)
        keep = bool(argument(op, "keepdim", False))
        strategies = []
        for d in range(src.ndim):
            if src.shape[d] <= 1:
                continue
            if d not in reduced:
                to = d if keep else d - sum(r < d for r in reduced)
                strategies.append(AxisStrategy((S(d),), S(to)))
            elif split_to_partial and all(map(_summable, op.outputs)):
                strategies.append(AxisStrategy((S(d),), P))
        if partial_through and is_float(src) and all(map(is_float, op.outputs)):
            strategies.append(AxisStrategy((P,), P))
        return finish(strategies)

    return rule


def _summable(spec: object) -> bool:
    return getattr(spec, "dtype", None) != torch.bool


def along(linear: bool = False) -> Rule:
    """Rule for an op along `dim` that keeps the other dims (softmax, cumsum, topk, ...)."""

    def rule(op: OpSpec) -> list[AxisStrategy]:
        src = op.inputs[0]
        dim = norm_dim(argument(op, "dim", -1), src.ndim)
        strategies = [AxisStrategy((S(d),), S(d)) for d in range(src.ndim)
                      if d != dim and src.shape[d] > 1]
        if linear and is_float(src) and all(map(is_float, op.outputs)):
            strategies.append(AxisStrategy((P,), P))
        return finish(strategies)

    return rule


_sum = reduction(split_to_partial=True, partial_through=True)
_sum_all = reduction(dims=None, split_to_partial=True, partial_through=True)
_mean = reduction(partial_through=True)
_plain = reduction()
_index = reduction(none_flattens=True)

RULES: dict[object, Rule] = {
    aten.sum.default: _sum_all,
    aten.sum.dim_IntList: _sum,
    aten.nansum.default: reduction(split_to_partial=True),
    aten.count_nonzero.dim_IntList: reduction(split_to_partial=True),
    aten.mean.default: reduction(dims=None, partial_through=True),
    aten.mean.dim: _mean,
    aten.amax.default: _plain,
    aten.amin.default: _plain,
    aten.max.dim: _plain,
    aten.min.dim: _plain,
    aten.max.default: reduction(dims=None),
    aten.min.default: reduction(dims=None),
    aten.argmax.default: _index,
    aten.argmin.default: _index,
    aten.any.dim: _plain,
    aten.any.dims: _plain,
    aten.all.dim: _plain,
    aten.prod.dim_int: _plain,
    aten.logsumexp.default: _plain,
    aten.var_mean.correction: _plain,
    aten.var_mean.dim: _plain,
    aten.var.correction: _plain,
    aten.var.dim: _plain,
    aten.std.correction: _plain,
    aten.std.dim: _plain,
    aten.linalg_vector_norm.default: _plain,
    aten.softmax.int: along(),
    aten._softmax.default: along(),
    aten.log_softmax.int: along(),
    aten._log_softmax.default: along(),
    aten.cumsum.default: along(linear=True),
    aten.cumprod.default: along(),
    aten.logcumsumexp.default: along(),
    aten.cummax.default: along(),
    aten.cummin.default: along(),
    aten.topk.default: along(),
    aten.sort.default: along(),
    aten.sort.stable: along(),
    aten.argsort.default: along(),
    aten.argsort.stable: along(),
}
