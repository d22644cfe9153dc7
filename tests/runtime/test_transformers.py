"""Hugging Face `transformers` models train exactly like the single-process model.

The equivalence check of `test_equivalence` on models that autopar's authors did not write:
small causal LMs that `transformers` builds from configs (`hf_models`: GPT-2, a dense
decoder, and Mixtral, a mixture of experts), all in one launch. On a (2, 2) mesh ("dp",
"tp") over gloo, under a memory budget well below the replicated plan's peak (so the solver
must shard), each rank compiles the model and trains 3 AdamW steps; the loss at every step
and every parameter's gradient match the plain model within `TOLERANCE` (the metric of
`test_equivalence`), and the bytes the collectives moved equal the plan's prediction times
the steps. Ops without a sharding rule (transformers' mask and label-shift helpers) stay
replicated; that is allowed, wrong numbers are not.
"""

from __future__ import annotations

import hf_models
import pytest
from equivalence_cases import TOLERANCE, Case, train_all

import autopar
from autopar.runtime.launch import launch

NAMES = tuple(hf_models.MODELS)
SHAPE, AXES = (2, 2), ("dp", "tp")
# Memory per device, as a fraction of the replicated plan's peak: below 1 forces sharding.
BUDGET = 0.3
# Far above the ~1e-7 relative rounding noise of a split computation (see routing_margin).
LEAST_ROUTING_MARGIN = 1e-4


def replicated_peak(name: str) -> float:
    """Peak memory per device of the plan that replicates everything (one device)."""
    model, inputs = hf_models.build(name)
    return autopar.plan(model, autopar.Mesh((1,), ("x",), hardware="cpu"),
                        inputs).peak_memory_bytes


def cases() -> tuple[Case, ...]:
    return tuple(Case("hf_models", build=(("name", name),),
                      memory_budget=BUDGET * replicated_peak(name)) for name in NAMES)


@pytest.fixture(scope="module")
def outcomes():
    chosen = cases()
    results = launch(train_all, SHAPE[0] * SHAPE[1], chosen, SHAPE, AXES, timeout=600.0)
    return chosen, results


def test_routing_picks_experts_by_a_clear_margin():
    # Otherwise a rounding difference could route a token elsewhere on some rank.
    for name in NAMES:
        assert hf_models.routing_margin(*hf_models.build(name)) > LEAST_ROUTING_MARGIN, name


def test_loss_and_every_gradient_match_the_single_process_model(outcomes):
    chosen, results = outcomes
    for case, outcome in zip(chosen, results[0]):
        label = dict(case.build)["name"]
        for step, (loss, expected) in enumerate(zip(outcome.losses,
                                                    outcome.reference_losses)):
            assert abs(loss - expected) <= TOLERANCE * abs(expected), (label, step)
        for step, errors in enumerate(outcome.grad_errors):
            worst = max(errors, key=errors.get)
            assert errors[worst] <= TOLERANCE, (label, step, worst, errors[worst])
        assert all(r[chosen.index(case)].losses == outcome.losses for r in results), label


def test_the_plans_shard_and_communicate(outcomes):
    chosen, results = outcomes
    for case, outcome in zip(chosen, results[0]):
        plan = autopar.Plan.from_dict(outcome.plan)
        sharded = [n for n in plan.nodes if n.role == "parameter" and "S(" in n.output]
        assert sharded, case
        assert plan.comm_bytes(), case


def test_measured_bytes_equal_the_plan_exactly(outcomes):
    chosen, results = outcomes
    for rank, per_rank in enumerate(results):
        for case, outcome in zip(chosen, per_rank):
            predicted = {key: value * case.steps for key, value in outcome.predicted.items()}
            assert outcome.measured == predicted, (case.build, rank)
