"""The micro-batch pass: which steps may run as micro-batches, and how their losses combine.

Each split is checked where it matters, on one process: the compiled model of a mesh of one
device, run as micro-batches, returns the batch's loss and leaves the batch's gradients,
for the loss kinds the pass tells apart (a mean with ignored targets, a mean over a fixed
count, a sum, a sum over a fixed scale). A step that mixes samples is refused, or, asked
to accumulate (what a forced pipeline does), split as the mean of its micro-batches.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import autopar
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.passes.layout.split_microbatches import (
    ACCUMULATE,
    ACCUMULATED,
    COUNTED,
    SCALED,
    SUMMED,
    loss_weights,
    split_microbatches,
)
from examples import gpt, mlp, moe


def _graph(model, inputs):
    return annotate(capture(model, inputs))


class _Regression(nn.Module):
    """A linear layer under a loss given as `reduce(squared error)`."""

    def __init__(self, reduce) -> None:
        super().__init__()
        self.reduce, self.linear = reduce, nn.Linear(6, 3)

    def forward(self, x, y):
        return self.reduce((self.linear(x) - y) ** 2)


def _regression(reduce):
    torch.manual_seed(0)
    return _Regression(reduce), (torch.randn(8, 6), torch.randn(8, 3))


def test_a_mean_cross_entropy_is_weighted_by_its_targets_and_a_mse_by_a_constant():
    split = split_microbatches(_graph(*gpt.build(batch=4)), 2)
    assert (split.weighting, split.split) == (COUNTED, (True, True))
    assert split_microbatches(_graph(*mlp.build()), 4).weighting == SCALED


@pytest.mark.parametrize("reduce, weighting", [
    (torch.sum, SUMMED), (lambda e: e.sum() / 10.0, SCALED), (torch.mean, SCALED)])
def test_sums_and_means_over_constants(reduce, weighting):
    assert split_microbatches(_graph(*_regression(reduce)), 4).weighting == weighting


@pytest.mark.parametrize("reduce", [torch.sum, lambda e: e.sum() / 10.0, torch.mean])
def test_micro_batches_give_the_batch_loss_and_gradients(reduce):
    """A fixed scale (sum / 10) must not be mistaken for a mean: the weights come from the
    divisor at the micro-batch's shapes against the batch's."""
    model, inputs = _regression(reduce)
    reference = copy.deepcopy(model)
    pm = autopar.compile(model, autopar.Mesh((1,), ("x",)), inputs, microbatches=4)
    assert pm.plan.microbatches == 4
    loss = pm(*inputs)
    loss.backward()
    expected = reference(*inputs)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for name, grad in pm.full_grads().items():
        torch.testing.assert_close(grad, dict(reference.named_parameters())[name].grad)


def test_ignored_targets_weight_each_micro_batch_by_the_targets_it_keeps():
    """The batch's mean cross-entropy divides by the targets not ignored in the whole
    batch: micro-batches with more ignored targets weigh less (one with all ignored is
    skipped), and the loss's backward honours the gradient it receives."""
    torch.manual_seed(0)
    model, (tokens, targets) = gpt.build(batch=4, seq=8, hidden=32, heads=2, layers=1,
                                         vocab=64)
    targets = targets.clone()
    targets[0, :] = -100  # micro-batch 0 ignores everything
    targets[2, :5] = -100
    reference = copy.deepcopy(model)
    pm = autopar.compile(model, autopar.Mesh((1,), ("x",)), (tokens, targets), microbatches=4)
    (3.0 * pm(tokens, targets)).backward()
    (3.0 * reference(tokens, targets)).backward()
    grads = pm.full_grads()
    for name, param in reference.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=1e-5, atol=1e-7)


def test_gradients_accumulate_over_calls_as_on_the_plain_model():
    model, inputs = _regression(torch.mean)
    reference = copy.deepcopy(model)
    pm = autopar.compile(model, autopar.Mesh((1,), ("x",)), inputs, microbatches=2)
    for _ in range(2):
        pm(*inputs).backward()
        reference(*inputs).backward()
    for name, grad in pm.full_grads().items():
        torch.testing.assert_close(grad, dict(reference.named_parameters())[name].grad)
    with torch.no_grad():
        torch.testing.assert_close(pm(*inputs), reference(*inputs))


class _BatchNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear, self.norm = nn.Linear(4, 4), nn.BatchNorm1d(4)

    def forward(self, x):
        return self.norm(self.linear(x)).square().mean()


def test_steps_that_mix_samples_are_refused_with_the_reason():
    with pytest.raises(autopar.MicrobatchError, match="mixes the samples"):
        split_microbatches(_graph(*moe.build()), 2)
    net = _BatchNormNet()
    with pytest.raises(autopar.MicrobatchError, match="updates buffers"):
        split_microbatches(_graph(net, (torch.randn(8, 4),)), 2)


def test_asked_to_accumulate_a_step_that_mixes_samples_is_the_mean_of_its_micro_batches():
    """MoE routing (capacity, cumsum over the tokens) mixes the samples: each micro-batch
    is then the model's batch, every input with the batch's dim 0 is cut, the losses weigh
    1 / M each, and the split names the op for the caller's warning."""
    gm = _graph(*moe.build(batch=4))
    split = split_microbatches(gm, 4, mixing=ACCUMULATE)
    assert (split.weighting, split.split, split.microbatches) == (ACCUMULATED, (True, True), 4)
    assert split.mixes.startswith("aten.") and "layers.0.moe" in split.mixes
    assert loss_weights(split, gm)([[]] * 4) == [0.25] * 4
    squared_mean = split_microbatches(_graph(*_regression(lambda e: e.mean() ** 2)), 2,
                               mixing=ACCUMULATE)
    assert squared_mean.weighting == ACCUMULATED and "pow" in squared_mean.mixes


def test_accumulating_still_refuses_buffer_updates_and_keeps_exact_weightings():
    with pytest.raises(autopar.MicrobatchError, match="updates buffers"):
        split_microbatches(_graph(_BatchNormNet(), (torch.randn(8, 4),)), 2, mixing=ACCUMULATE)
    gm = _graph(*gpt.build(batch=4))
    assert split_microbatches(gm, 2, mixing=ACCUMULATE) == split_microbatches(gm, 2)
    assert split_microbatches(gm, 2).weighting == COUNTED
    with pytest.raises(autopar.MicrobatchError, match="'refuse' or 'accumulate'"):
        split_microbatches(gm, 2, mixing="sometimes")


def test_counts_that_do_not_divide_the_batch_are_refused_before_planning():
    model, inputs = mlp.build(batch=8)
    with pytest.raises(autopar.MicrobatchError, match="divide the batch") as error:
        autopar.plan(model, autopar.Mesh((2,), ("x",)), inputs, microbatches=3)
    assert "3 for a batch of 8" in str(error.value)
    with pytest.raises(autopar.MicrobatchError, match="a count or 'auto'"):
        autopar.plan(model, autopar.Mesh((2,), ("x",)), inputs, microbatches="many")
