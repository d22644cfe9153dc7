"""Every strategy the solver might choose is proven by running it, not only today's choice.

On mesh (2,), every distinct (op, strategy) of the MLP, GPT and Llama examples and of the
probe models (gathers, scatters, reductions, joins, factories, more losses) is forced on
one node, the rest planned around it, and the program run on gloo: its loss and every
gradient must equal the plain model's (relative 1e-5: one step, so only the reordering of
fp32 sums separates them, about 1e-7), and its collectives must move exactly the bytes the
plan predicts. On (2, 2), strategies that split on both axes are forced the same way: 25
per example, spread evenly over the graph (all of them would take minutes). Together they
cover every rule family and every row of the collective table of docs/DESIGN.md.
"""

from __future__ import annotations

import pytest
from forced_cases import forced_plans, pinned_plan, run_forced

import autopar
from autopar import rules
from autopar.runtime.launch import launch
from autopar.values.placement import Replicate

TOLERANCE = 1e-5
EXAMPLES = ("examples.mlp", "examples.gpt", "examples.llama")
PROBES = ("probe_models:indexing", "probe_models:reductions")
TABLE_ROWS = {"P->R", "S->R", "R->S", "P->S", "S->S", "R used split"}
FAMILIES = ("pointwise", "matmul", "views", "slicing", "indexing", "reductions", "norms",
            "attention", "embedding", "losses", "factories")


def _split_on_every_axis(strategy) -> bool:
    return all(any(not isinstance(p[axis], Replicate) for p in (*strategy.inputs,
                                                                strategy.output))
               for axis in range(len(strategy.output)))


@pytest.fixture(scope="module")
def one_axis():
    mesh = autopar.Mesh((2,), ("x",), hardware="cpu")
    plans = tuple(p for model in (*EXAMPLES, *PROBES) for p in forced_plans(model, mesh))
    # A batch-split output read split by columns: the all-to-all row. With one node pinned
    # its neighbours stay replicated, so no edge goes from one split to another.
    plans += (pinned_plan("examples.mlp", mesh, {"linear": "S(0)", "gelu": "S(1)"}),)
    return launch(run_forced, 2, plans, (2,), ("x",), timeout=600.0)


@pytest.fixture(scope="module")
def two_axes():
    mesh = autopar.Mesh((2, 2), ("dp", "tp"), hardware="cpu")
    plans = tuple(p for model in EXAMPLES
                  for p in forced_plans(model, mesh, keep=_split_on_every_axis, limit=25))
    return launch(run_forced, 4, plans, (2, 2), ("dp", "tp"), timeout=600.0)


def _check(results_by_rank) -> None:
    wrong = [(r.forced, r.loss_error, r.grad_error) for r in results_by_rank[0]
             if r.loss_error > TOLERANCE or r.grad_error > TOLERANCE]
    assert not wrong, wrong[:5]
    for per_rank in results_by_rank:
        mismatched = [r.forced for r in per_rank if not r.bytes_match]
        assert not mismatched, mismatched[:5]


def test_every_strategy_on_one_axis_trains_exactly(one_axis):
    _check(one_axis)
    assert len(one_axis[0]) > 100


@pytest.mark.slow
def test_strategies_split_over_both_axes_train_exactly(two_axes):
    _check(two_axes)
    assert len(two_axes[0]) > 50


def _family(target: str) -> str | None:
    for name in FAMILIES:
        for key in getattr(rules, name).RULES:
            if target == str(key) or target.startswith(f"{key}."):
                return name
    return None


def test_every_rule_family_is_covered(one_axis):
    # A family counts when one of its split (not replicated) strategies ran.
    covered = {_family(r.forced.target) for r in one_axis[0]
               if "S(" in r.forced.strategy or "P" in r.forced.strategy}
    assert set(FAMILIES) <= covered, set(FAMILIES) - covered


def test_every_row_of_the_collective_table_runs(one_axis, two_axes):
    rows = set().union(*(r.rows for r in (*one_axis[0], *two_axes[0])))
    assert TABLE_ROWS <= rows, TABLE_ROWS - rows
