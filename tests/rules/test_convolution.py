"""The convolution and group_norm rules beyond the checks every rule gets (each strategy
exact on 2 and 4 simulated ranks, forward and backward, and in pairs over a 2x2 mesh:
`test_rule_strategies` runs the cases of `rule_cases_conv`): the set offered is the intended
one, convolution FLOPs are counted, every op of the ResNet example has a rule."""

from __future__ import annotations

import torch
from rule_cases import Case
from rule_cases_conv import CASES
from simulate import build
from torch import nn

from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.rules import AxisStrategy, lookup
from autopar.rules.common import P, R, S
from autopar.values.specs import FLOPS
from examples import resnet

aten = torch.ops.aten



def _strategies(case: Case) -> list[AxisStrategy]:
    op, _ = build(case.target, case.args, case.kwargs)
    return lookup(case.target)(op)


def _offered(case_name: str) -> list[AxisStrategy]:
    return _strategies(next(c for c in CASES if c.name == case_name))


def test_conv_offers_batch_output_and_input_channel_splits() -> None:
    assert _offered("conv2d_bias") == [
        AxisStrategy((S(0), R, R), S(0)),    # batch: data parallel
        AxisStrategy((R, S(0), S(0)), S(1)),  # output channels
        AxisStrategy((S(1), S(1), P), P),    # input channels: the bias is a summand
        AxisStrategy((P, R, P), P),          # partial input
    ]
    assert _offered("conv2d") == [
        AxisStrategy((S(0), R), S(0)), AxisStrategy((R, S(0)), S(1)),
        AxisStrategy((S(1), S(1)), P), AxisStrategy((P, R), P)]


def test_conv_channel_splits_follow_the_layout() -> None:
    # Unbatched: channels at dim 0, no batch split. Transposed: the weight is [C_in, C_out].
    assert {s.output for s in _offered("conv2d_unbatched")} == {S(0), P}
    assert AxisStrategy((R, S(1), S(0)), S(1)) in _offered("conv_transposed")
    assert AxisStrategy((S(1), S(0), P), P) in _offered("conv_transposed")


def test_grouped_conv_splits_only_the_batch() -> None:
    assert _offered("conv2d_grouped") == [AxisStrategy((S(0), R, R), S(0)),
                                          AxisStrategy((P, R, P), P)]


def test_group_norm_splits_only_the_batch() -> None:
    assert _offered("group_norm") == [AxisStrategy((S(0), R, R), S(0))]
    assert _offered("group_norm_plain") == [AxisStrategy((S(0),), S(0))]


def test_conv_flops_are_counted() -> None:
    model = _Conv()
    gm = annotate(capture(model, (torch.randn(2, 4, 8, 8), torch.randn(3, 10))))
    flops = {n.name: n.meta[FLOPS] for n in gm.graph.nodes if n.op == "call_function"}
    # 2 per multiply-add: batch x C_out x C_in x kernel x output positions.
    assert flops["conv2d"] == 2 * 2 * 8 * 4 * 9 * 4 * 4
    assert flops["conv1d"] == 2 * 1 * 6 * 3 * 3 * 8  # unbatched: one sample


class _Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv2d = nn.Conv2d(4, 8, 3, stride=2, padding=1)
        self.conv1d = nn.Conv1d(3, 6, 3, bias=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conv2d(x), self.conv1d(y)



def test_every_op_of_the_resnet_example_has_a_rule() -> None:
    model, inputs = resnet.build(widths=(8, 16))
    gm = capture(model, inputs)
    missing = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"
               and isinstance(n.target, torch._ops.OpOverload) and lookup(n.target) is None}
    assert not missing, sorted(missing)
