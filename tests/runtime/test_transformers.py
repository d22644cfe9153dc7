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

import dataclasses

import hf_models
import pytest
from equivalence_cases import (
    Case,
    check_bytes,
    check_equivalence,
    check_sharded,
    replicated_peak,
    train_all,
)

from autopar.runtime.launch import launch

NAMES = tuple(hf_models.MODELS)
SHAPE, AXES = (2, 2), ("dp", "tp")
# Memory per device, as a fraction of the replicated plan's peak: below 1 forces sharding.
BUDGET = 0.35
# Far above the ~1e-7 relative rounding noise of a split computation (see routing_margin).
LEAST_ROUTING_MARGIN = 1e-4


def cases() -> tuple[Case, ...]:
    whole = [Case("hf_models", build=(("name", name),)) for name in NAMES]
    return tuple(dataclasses.replace(case, memory_budget=BUDGET * replicated_peak(case))
                 for case in whole)


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
    check_equivalence(*outcomes)


def test_the_plans_shard_and_communicate(outcomes):
    check_sharded(*outcomes)


def test_measured_bytes_equal_the_plan_exactly(outcomes):
    check_bytes(*outcomes)
