"""Losses: cross_entropy_loss, nll_loss (and _nd, 2d, _forward), and the elementwise losses
(mse, l1, smooth_l1, huber, binary cross-entropy).

A loss is a per-sample term followed by a reduction (0 none, 1 mean, 2 sum). Splitting the
samples (batch, or the extra spatial dims of [N, C, d1, ...] inputs) gives each rank the
terms of its samples:

- reduction none: the output is split like the samples;
- reduction sum: each rank's sum is a summand of the total, `P`;
- reduction mean: each rank's mean is over its own samples (and, with `ignore_index` or class
  weights, divided by its own weight total), not a summand. Not offered, by the contract that
  a rank's output is the op on its local inputs unscaled. A batch-split mean loss is exact
  once the graph is rewritten as `loss(reduction=sum) / count` (`decompositions.py`), with
  `count` the number of elements, or for cross-entropy/nll the number of targets not
  ignored: a sum over the batch (`P` when split), made `R` before the division.

The class dim is never split: the log-softmax over it needs a max and a sum over all classes
(vocab-parallel cross-entropy needs collectives inside the op). nll_loss is linear in its
input (its mean divides by a total that depends on the target only), so `P` input with `R`
target and weight gives `P` for every reduction; cross-entropy is not linear.
"""

from __future__ import annotations

import torch

from autopar.rules.base import AxisStrategy, OpSpec, Rule
from autopar.rules.common import P, S, argument, by_name, finish, follow, is_float, tensor_slots

aten = torch.ops.aten

NONE, MEAN, SUM = 0, 1, 2


def _sample_dims(op: OpSpec) -> list[tuple[int, int, int]]:
    """(input dim, target dim, unreduced output dim) of each sample dim of a class loss."""
    slots = dict(tensor_slots(op))
    src, target = slots["self"], slots["target"]
    if src.ndim < 2:
        return []
    probs = target.ndim == src.ndim  # class probabilities rather than class indices
    dims = []
    for j in range(src.ndim):
        if j == 1 or src.shape[j] <= 1:
            continue
        out = j if j == 0 else j - 1
        dims.append((j, j if probs else out, out))
    return dims


def class_loss(linear: bool = False, two_outputs: bool = False) -> Rule:
    """cross_entropy_loss / nll_loss family over [N, C, d1, ...] inputs."""

    def rule(op: OpSpec) -> list[AxisStrategy]:
        reduction = argument(op, "reduction", MEAN)
        strategies = []
        for j, t, o in _sample_dims(op):
            placed = {"self": S(j), "target": S(t)}
            if reduction == NONE and not two_outputs:
                strategies.append(by_name(op, placed, S(o)))
            elif reduction == SUM:
                # nll_loss_forward's total_weight is a sum over the samples too.
                strategies.append(by_name(op, placed, P))
        if linear and not two_outputs and is_float(op.inputs[0]):
            strategies.append(by_name(op, {"self": P}, P))
        return finish(strategies)

    return rule


def _elementwise(op: OpSpec) -> list[AxisStrategy]:
    """mse/l1/smooth_l1/huber/bce: per-element terms over the broadcast of the inputs."""
    reduction = argument(op, "reduction", MEAN)
    if reduction == MEAN:
        return []
    slots = tensor_slots(op)
    shape = tuple(torch.broadcast_shapes(*(s.shape for _, s in slots)))
    strategies = []
    for d, size in enumerate(shape):
        if size <= 1:
            continue
        ins = tuple(follow(shape, s, S(d)) for _, s in slots)
        strategies.append(AxisStrategy(ins, S(d) if reduction == NONE else P))
    return finish(strategies)


RULES: dict[object, Rule] = {
    aten.cross_entropy_loss.default: class_loss(),
    aten.nll_loss.default: class_loss(linear=True),
    aten.nll_loss_nd.default: class_loss(linear=True),
    aten.nll_loss2d.default: class_loss(linear=True),
    aten.nll_loss_forward.default: class_loss(two_outputs=True),
    aten.mse_loss.default: _elementwise,
    aten.l1_loss.default: _elementwise,
    aten.smooth_l1_loss.default: _elementwise,
    aten.huber_loss.default: _elementwise,
    aten.soft_margin_loss.default: _elementwise,
    aten.binary_cross_entropy.default: _elementwise,
    aten.binary_cross_entropy_with_logits.default: _elementwise,
}
