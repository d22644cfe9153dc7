"""Kernel workspaces: the formula, against what torch's CPU convolution allocates, and on
a plan's timeline."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.profiler import profile

import autopar
from autopar.costs import workspace
from autopar.costs.workspace import Workspace, kernel_workspace
from autopar.tools.measure import allocation_peak


def test_a_convolution_reorders_its_larger_activation_and_its_weight():
    assert kernel_workspace("convolution", (100.0, 30.0), 400.0) == Workspace(430.0, 800.0)
    assert kernel_workspace("convolution", (100.0, 300.0, 4.0), 50.0) == Workspace(400.0, 300.0)


@pytest.mark.parametrize("family", ["matmul", "attention", "other", "transcendental"])
def test_other_families_have_none(family):
    assert kernel_workspace(family, (100.0, 30.0), 400.0) == Workspace()


def _allocated(shape) -> tuple[Workspace, Workspace]:
    """(measured, formula) for a 2-D convolution of `shape` (batch, in channels, side,
    kernel, out channels, stride): what the allocator held beyond the outputs."""
    n, c, side, k, o, stride = shape
    x = torch.randn(n, c, side, side, requires_grad=True)
    conv = nn.Conv2d(c, o, k, stride=stride, padding=k // 2, bias=False)
    conv(x).sum().backward()  # the kernels' first call may allocate caches of their own
    x.grad = conv.weight.grad = None
    with profile(profile_memory=True) as forward:
        y = conv(x)
    grad = torch.randn_like(y)
    with profile(profile_memory=True) as backward:
        y.backward(grad)
    made = x.grad.untyped_storage().nbytes() + conv.weight.grad.untyped_storage().nbytes()
    measured = Workspace(allocation_peak(forward) - y.untyped_storage().nbytes(),
                         allocation_peak(backward) - made)
    sizes = (x.numel() * 4, conv.weight.numel() * 4)
    return measured, kernel_workspace("convolution", sizes, y.numel() * 4)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN")
@pytest.mark.parametrize("shape", [(8, 16, 32, 3, 16, 1), (8, 16, 32, 3, 32, 2),
                                   (8, 32, 16, 3, 32, 1), (4, 64, 8, 3, 64, 1),
                                   (8, 64, 16, 3, 128, 2)])
def test_the_formula_bounds_what_a_cpu_convolution_allocates(shape):
    """Within 10% in the forward; in the backward at most a third above, never below by
    more than 10% (the formula's two activation-sized buffers are one and a half where the
    weight is large and the output small)."""
    measured, formula = _allocated(shape)
    assert abs(measured.forward - formula.forward) <= 0.1 * measured.forward, (measured, formula)
    assert 0.9 * measured.backward <= formula.backward <= 1.34 * measured.backward, (
        measured, formula)


class _Convolution(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1, bias=False)

    def forward(self, x):
        return self.conv(x).square().mean()


def test_a_plan_charges_the_workspace_at_the_convolutions_backward(monkeypatch):
    """One convolution alone: the step's peak is at its backward, where its input (saved),
    its output's gradient and the formula's workspace (two activations) are held beside
    the weight, its gradient and AdamW's two states; without the workspace the peak is
    lower, elsewhere."""
    torch.manual_seed(0)
    inputs = (torch.randn(8, 16, 16, 16),)
    activation, weight = inputs[0].numel() * 4, 16 * 16 * 3 * 3 * 4
    mesh = autopar.Mesh((1,), ("dp",), hardware="cpu")
    charged = autopar.plan(_Convolution(), mesh, inputs, microbatches=1).peak_memory_bytes
    assert charged == 4 * weight + 2 * activation + 2 * activation
    monkeypatch.setattr(workspace, "FAMILIES", frozenset())
    without = autopar.plan(_Convolution(), mesh, inputs, microbatches=1).peak_memory_bytes
    assert without < charged
