"""Rewrites that make means shardable: `mean = sum / count`, with the count global.

A mean over a split dim is not a summand of anything a rank can compute alone (its local
mean is over its own count), so the rules never split one. Written as a sum divided by the
global count, it is: the sum over a split dim is `P`, and dividing a `P` by an `R` count
(or a constant) stays `P`. For cross-entropy and nll the count is the number of targets not
ignored, itself a sum over the batch: `P` when the batch is split, and made `R` by the
solver's ordinary all-reduce of one number before the division.

`DECOMPOSITIONS` is a table for `ExportedProgram.run_decompositions`, which keeps every op
not in it (the strategy pass then sees the `sum` form). Each entry returns `NotImplemented`
(keep the op) where it would not be exact or not help: other reductions than the mean, and
class weights on cross-entropy/nll (whose mean divides by a weighted count).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

aten = torch.ops.aten

MEAN, SUM = 1, 2


def _mean(x: torch.Tensor, dim: list[int] | None = None, keepdim: bool = False, *,
          dtype: torch.dtype | None = None) -> torch.Tensor:
    dims = range(x.ndim) if not dim else [d % x.ndim for d in dim]
    count = math.prod(x.shape[d] for d in dims)
    return aten.sum.dim_IntList(x, list(dims), keepdim, dtype=dtype) / count


def _mean_all(x: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    return _mean(x, None, False, dtype=dtype)


def _class_count(x: torch.Tensor, target: torch.Tensor, ignore_index: int):
    """The mean's divisor: the targets not ignored, or the samples for probability targets."""
    if target.is_floating_point():
        return target.numel() // x.shape[1] if x.ndim > 1 else 1
    return (target != ignore_index).sum()


def _cross_entropy(x, target, weight=None, reduction=MEAN, ignore_index=-100,
                   label_smoothing=0.0):
    if reduction != MEAN or weight is not None:
        return NotImplemented
    total = aten.cross_entropy_loss.default(x, target, None, SUM, ignore_index, label_smoothing)
    return total / _class_count(x, target, ignore_index)


def _nll(op: object) -> Callable:
    def decompose(x, target, weight=None, reduction=MEAN, ignore_index=-100):
        if reduction != MEAN or weight is not None:
            return NotImplemented
        total = op(x, target, None, SUM, ignore_index)
        return total / _class_count(x, target, ignore_index)

    return decompose


def _elementwise(op: object) -> Callable:
    """Losses with `reduction` as their third argument (mse, l1, smooth_l1, huber): the
    mean is over every element of the broadcast of input and target."""

    def decompose(x, target, reduction=MEAN, *rest):
        if reduction != MEAN:
            return NotImplemented
        return op(x, target, SUM, *rest) / math.prod(torch.broadcast_shapes(x.shape,
                                                                            target.shape))

    return decompose


def _bce_logits(x, target, weight=None, pos_weight=None, reduction=MEAN):
    if reduction != MEAN:
        return NotImplemented
    total = aten.binary_cross_entropy_with_logits.default(x, target, weight, pos_weight, SUM)
    return total / x.numel()


DECOMPOSITIONS: dict[object, Callable] = {
    aten.mean.dim: _mean,
    aten.mean.default: _mean_all,
    aten.cross_entropy_loss.default: _cross_entropy,
    aten.nll_loss.default: _nll(aten.nll_loss.default),
    aten.nll_loss_nd.default: _nll(aten.nll_loss_nd.default),
    aten.mse_loss.default: _elementwise(aten.mse_loss.default),
    aten.l1_loss.default: _elementwise(aten.l1_loss.default),
    aten.smooth_l1_loss.default: _elementwise(aten.smooth_l1_loss.default),
    aten.huber_loss.default: _elementwise(aten.huber_loss.default),
    aten.binary_cross_entropy_with_logits.default: _bce_logits,
}
