"""The convolution and group_norm rules: every strategy is exact on 2 and 4 simulated ranks
(forward and backward) and in pairs over a 2x2 mesh; the set offered is the intended one;
convolution FLOPs are counted."""

from __future__ import annotations

import itertools

import pytest
import torch
from rule_cases import Case, call, f
from simulate import Uneven, build, simulate
from simulate_mesh import simulate_mesh
from torch import nn

from autopar.placement import Replicate, format_placement
from autopar.rules import AxisStrategy, lookup
from autopar.rules.common import P, R, S
from autopar.specs import FLOPS
from examples import resnet
from passes.annotate import annotate
from passes.capture import capture

aten = torch.ops.aten

CASES = [
    call("conv2d_bias", aten.conv2d.default, f(4, 8, 6, 6), f(12, 8, 3, 3), f(12), [2, 2],
         [1, 1]),
    call("conv2d", aten.conv2d.default, f(4, 8, 6, 6), f(4, 8, 1, 1), None, [2, 2]),
    call("conv2d_same", aten.conv2d.padding, f(4, 4, 5, 5), f(8, 4, 3, 3), f(8), [1, 1],
         "same"),
    call("conv2d_unbatched", aten.conv2d.default, f(8, 6, 6), f(4, 8, 3, 3), f(4)),
    call("conv2d_dilated", aten.conv2d.default, f(4, 4, 9, 9), f(8, 4, 3, 3), None, [1, 1],
         [2, 2], [2, 2]),
    call("conv2d_grouped", aten.conv2d.default, f(4, 8, 6, 6), f(8, 4, 3, 3), f(8), [1, 1],
         [1, 1], [1, 1], 2),
    call("conv1d", aten.conv1d.default, f(4, 8, 10), f(4, 8, 3), f(4)),
    call("conv3d", aten.conv3d.default, f(2, 4, 4, 4, 4), f(4, 4, 2, 2, 2)),
    call("convolution", aten.convolution.default, f(4, 8, 6, 6), f(4, 8, 3, 3), f(4), [1, 1],
         [1, 1], [1, 1], False, [0, 0], 1),
    call("conv_transposed", aten.convolution.default, f(4, 8, 5, 5), f(8, 4, 3, 3), f(4),
         [2, 2], [1, 1], [1, 1], True, [1, 1], 1),
    call("group_norm", aten.group_norm.default, f(4, 8, 3, 3), 4, f(8), f(8), 1e-5),
    call("group_norm_plain", aten.group_norm.default, f(4, 8, 5), 2),
]


def _label(s: AxisStrategy) -> str:
    return ",".join(map(format_placement, s.inputs)) + "->" + format_placement(s.output)


def _strategies(case: Case) -> list[AxisStrategy]:
    op, _ = build(case.target, case.args, case.kwargs)
    rule = lookup(case.target)
    assert rule is not None, case.target
    return rule(op)


PARAMS = [pytest.param(case, s, id=f"{case.name}:{_label(s)}")
          for case in CASES for s in _strategies(case)]


@pytest.mark.parametrize("case,strategy", PARAMS)
def test_strategy_is_exact(case: Case, strategy: AxisStrategy) -> None:
    ran = 0
    for n in (2, 4):
        try:
            simulate(case.target, case.args, case.kwargs, strategy, n, backward=case.backward,
                     frozen=case.frozen)
            ran += 1
        except Uneven:
            continue
    assert ran, "the case never divides evenly: pick sizes that exercise the strategy"


# One case per layout the rule distinguishes (fp64 conv1d/conv3d kernels are slow on CPU).
MESH_CASES = [c for c in CASES if c.name in (
    "conv2d_bias", "conv2d", "conv2d_unbatched", "conv_transposed", "group_norm")]


@pytest.mark.parametrize("case", MESH_CASES, ids=[c.name for c in MESH_CASES])
def test_strategies_combine_over_a_2x2_mesh(case: Case) -> None:
    op, _ = build(case.target, case.args, case.kwargs)
    replicated = AxisStrategy((Replicate(),) * len(op.inputs), Replicate())
    choices = [replicated, *_strategies(case)]
    for first, second in itertools.product(choices, repeat=2):
        if first == second == replicated:
            continue
        try:
            simulate_mesh(case.target, case.args, case.kwargs, (first, second), (2, 2))
        except Uneven:
            continue


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
