"""Every strategy every rule returns, on every representative call, is exact on 2 and 4
simulated ranks (forward and backward), and obeys the contract's shape invariants."""

from __future__ import annotations

import itertools

import pytest
import rule_cases
import rule_cases_conv
import rule_cases_layers
import rule_cases_nn
from rule_cases import Case
from simulate import Uneven, build, simulate
from simulate_mesh import simulate_mesh

from autopar.rules import AxisStrategy, lookup
from autopar.rules.attention import context_axis
from autopar.values.placement import Partial, Replicate, Shard, format_placement

CASES = (rule_cases.CASES + rule_cases_nn.CASES + rule_cases_conv.CASES
         + rule_cases_layers.CASES)


def _label(s: AxisStrategy) -> str:
    return ",".join(map(format_placement, s.inputs)) + "->" + format_placement(s.output)


def _strategies(case: Case) -> list[AxisStrategy]:
    op, _ = build(case.target, case.args, case.kwargs)
    rule = lookup(case.target)
    assert rule is not None, case.target
    return rule(op)


def _runs_ring(case: Case, strategy: AxisStrategy) -> bool:
    """A context-parallel attention needs ranks that talk (obligation 5 of
    `autopar.rules`): it is proven on gloo ranks (tests/runtime/test_ring_attention.py,
    test_forced_strategies.py, test_context_parallel.py), not simulated here."""
    op, _ = build(case.target, case.args, case.kwargs)
    return context_axis(op, tuple((p,) for p in strategy.inputs)) is not None


PARAMS = [pytest.param(case, s, id=f"{case.name}:{_label(s)}")
          for case in CASES for s in _strategies(case) if not _runs_ring(case, s)]


@pytest.mark.parametrize("case,strategy", PARAMS)
def test_strategy_is_exact(case: Case, strategy: AxisStrategy) -> None:
    ran = 0
    for n in (2, 3, 4):  # 3 cuts most cases' dims unevenly
        try:
            simulate(case.target, case.args, case.kwargs, strategy, n, backward=case.backward,
                     frozen=case.frozen)
            ran += 1
        except Uneven:
            continue
    assert ran, "the case never divides evenly: pick sizes that exercise the strategy"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_contract_invariants(case: Case) -> None:
    op, _ = build(case.target, case.args, case.kwargs)
    strategies = _strategies(case)
    assert len(set(strategies)) == len(strategies), "duplicate strategies"
    for s in strategies:
        assert len(s.inputs) == len(op.inputs)
        assert not all(isinstance(p, Replicate) for p in (*s.inputs, s.output)), "all-R"
        for p, spec in zip(s.inputs, op.inputs):
            if isinstance(p, Shard):
                assert 0 <= p.dim < spec.ndim and spec.shape[p.dim] > 1, (s, spec)
            if isinstance(p, Partial):
                assert spec.dtype.is_floating_point, (s, spec)
        if isinstance(s.output, Shard):
            for out in op.outputs:
                assert 0 <= s.output.dim < out.ndim and out.shape[s.output.dim] > 1, (s, out)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_strategies_combine_over_a_2x2_mesh(case: Case) -> None:
    """Every ordered pair of the case's strategies (or replicated) over mesh axes (2, 2)."""
    op, _ = build(case.target, case.args, case.kwargs)
    replicated = AxisStrategy((Replicate(),) * len(op.inputs), Replicate())
    choices = [replicated, *(s for s in _strategies(case) if not _runs_ring(case, s))]
    for first, second in itertools.product(choices, repeat=2):
        if first == second == replicated:
            continue
        try:
            simulate_mesh(case.target, case.args, case.kwargs, (first, second), (2, 2))
        except Uneven:
            continue
