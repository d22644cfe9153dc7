"""trace_kernels: the kernels each op runs on a CPU, forward and backward, from fake tensors."""

import pytest
import torch
from torch import fx, nn

from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.passes.capturing.trace_kernels import (
    ensure_traced,
    priced_kernels,
    reference_bytes,
    trace_kernels,
)
from autopar.values.specs import BYTES, KERNELS, Kernels

F32 = 4


class Block(nn.Module):
    """An RMS norm, a linear layer, a slice of its output, a broadcast and a mask."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(16)
        self.proj = nn.Linear(16, 32, bias=False)
        self.scale = nn.Parameter(torch.ones(1, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(self.norm(x * self.scale))[:, :16]
        mask = (x > 0).float()
        return (y * self.scale.expand(8, 16) * mask).sum()


def _nodes(gm: fx.GraphModule, name: str) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and name in str(n.target)]


def _traced() -> fx.GraphModule:
    gm = annotate(capture(Block(), (torch.randn(8, 16),)))
    ensure_traced(gm)
    return gm


def test_a_composite_op_is_priced_by_the_kernels_it_decomposes_into():
    gm = _traced()
    (norm,) = _nodes(gm, "rms_norm")
    kernels = norm.meta[KERNELS]
    # pow, mean, add, rsqrt, two products forward; the backward of each of them.
    assert kernels.forward == 6
    assert kernels.backward > kernels.forward
    assert kernels.backward_bytes > kernels.forward_bytes > 1
    (linear,) = _nodes(gm, "linear")
    # Forward one matmul of 8x16 by 16x32: it reads both and writes 8x32, as the rule does.
    # Forward one matmul, which reads and writes what the rule counts; backward two.
    assert linear.meta[KERNELS] == Kernels(1, 2, 1.0, 2.0)


def test_a_view_is_free_forward_and_its_backward_pays_what_it_runs():
    gm = _traced()
    (slice_,) = _nodes(gm, "slice")
    (expand,) = _nodes(gm, "expand")
    assert slice_.meta[BYTES] == 0 and reference_bytes(slice_) == F32 * 8 * 16
    # A slice's backward fills a zero gradient and copies into it; an expand's sums.
    assert slice_.meta[KERNELS].forward == 0 and slice_.meta[KERNELS].backward >= 1
    assert expand.meta[KERNELS].forward == 0 and expand.meta[KERNELS].backward == 1


def test_an_op_off_the_gradient_path_has_no_backward():
    gm = _traced()
    (compare,) = _nodes(gm, "gt")
    assert compare.meta[KERNELS].backward == 0 and compare.meta[KERNELS].forward == 1


def test_traces_price_cpu_profiles_only():
    gm = _traced()
    (slice_,) = _nodes(gm, "slice")
    assert priced_kernels(slice_, "cpu") == (slice_.meta[KERNELS], F32 * 8 * 16)
    assert priced_kernels(slice_, "cuda") == (None, 0)


def _data_dependent(x: torch.Tensor) -> torch.Tensor:
    return x * x.sum().item()  # a value read back from the device: no fake tensor has one


def test_an_op_that_fake_tensors_cannot_run_keeps_no_trace():
    gm = _traced()
    (compare,) = _nodes(gm, "gt")
    compare.target = _data_dependent
    for node in gm.graph.nodes:
        node.meta.pop(KERNELS, None)
    trace_kernels(gm, {})
    assert KERNELS not in compare.meta
    assert all(KERNELS in n.meta for n in _nodes(gm, "rms_norm"))


def test_an_output_read_twice_pays_the_sum_of_its_gradients():
    class Square(nn.Module):
        def __init__(self, twice: bool) -> None:
            super().__init__()
            self.weight, self.twice = nn.Parameter(torch.ones(16)), twice

        def forward(self, x):
            h = torch.tanh(x * self.weight)
            return ((h * h) if self.twice else (h * x)).sum()

    def tanh(twice: bool) -> Kernels:
        gm = annotate(capture(Square(twice), (torch.randn(4, 16),)))
        ensure_traced(gm)
        return _nodes(gm, "tanh")[0].meta[KERNELS]

    once, twice = tanh(False), tanh(True)
    assert twice.backward == once.backward + 1
    # The add reads two gradients and writes one, each of the output's size (its
    # reference: a tanh reads and writes one).
    assert twice.backward_bytes == pytest.approx(once.backward_bytes + 1.5)
