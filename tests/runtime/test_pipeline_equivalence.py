"""Pipelined plans train exactly like the single-process model, with the bytes the plan
predicts.

Each case is planned in the parent (`pipeline_workers.plan_case`) and trained `STEPS` AdamW
steps on gloo ranks next to the plain model: the loss and every gradient within
`Tolerance()` at every step, and every rank's measured bytes per (kind, axis, direction),
boundary sends, the tied embedding's gradient sum and the loss's broadcast over the
pipeline axis included, equal to the plan's for its pipeline rank times the steps. The
default cases cover three schedules, on pp=2 and on the two 2x2 layouts, stages split
over tp or over dp (under a budget that makes them shard); the whole matrix (every
example, schedule and layout, GPipe included) runs with --slow.

The MoE's routing (a capacity and a cumsum over the batch's tokens) and load-balancing loss
mix the samples of a batch: a forced pipeline trains it by gradient accumulation, each
micro-batch routed on its own, so its reference is the plain model accumulating the
gradients of the same micro-batches (each loss over their count), and its plan says so.
"""

from __future__ import annotations

import pipeline_workers as workers
import pytest
from pipeline_workers import Case

from autopar.runtime.launch import launch
from autopar.tools.training import Tolerance

# Fractions of the unconstrained pipelined plan's peak that make the stages shard: the
# MoE's smallest stage plans need 0.7 of it (its expert weights stored split by expert).
BUDGETS = {"gpt": 0.8, "llama": 0.8, "moe": 0.8}
SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble")
QUICK = {
    2: (Case("llama", (2,), ("pp",), "Interleaved1F1B"),),
    4: (Case("gpt", (2, 2), ("pp", "dp"), "InterleavedZeroBubble", budget=BUDGETS["gpt"]),
        Case("moe", (2, 2), ("pp", "tp"), "1F1B", budget=BUDGETS["moe"])),
}
SLOW = {
    2: tuple(Case(e, (2,), ("pp",), s) for e in BUDGETS for s in SCHEDULES),
    4: tuple(Case(e, (2, 2), ("pp", axis), s, budget=BUDGETS[e])
             for e in BUDGETS for axis in ("tp", "dp") for s in SCHEDULES),
}


def _run(cases):
    outcomes = {}
    for ranks, group in cases.items():
        plans = tuple(workers.plan_case(case) for case in group)
        trained = launch(workers.train_all, ranks, group, plans, timeout=900.0)
        outcomes.update({case: [per_rank[i] for per_rank in trained]
                         for i, case in enumerate(group)})
    return outcomes


@pytest.fixture(scope="module")
def outcomes(request):
    return _run(SLOW if request.config.getoption("--slow") else QUICK)


def test_loss_and_every_gradient_match_the_single_process_model(outcomes):
    for case, per_rank in outcomes.items():
        for run in per_rank:
            for (loss, expected), excess in zip(run.losses, run.grad_excess):
                assert Tolerance().excess(abs(loss - expected), abs(expected)) <= 1, case
                assert excess <= 1, (case, run.grad_excess)


def test_a_model_that_mixes_samples_is_planned_as_gradient_accumulation(outcomes):
    """The plan of a forced pipeline warns, naming the op, exactly where the step is not
    the whole batch's."""
    for case, per_rank in outcomes.items():
        warned = [w for w in per_rank[0].warnings if "mixes the samples" in w]
        assert bool(warned) == case.accumulates, (case, per_rank[0].warnings)
        if case.accumulates:
            assert "layers.0.moe" in warned[0] and "gradient accumulation" in warned[0]


def test_every_rank_returns_the_same_loss(outcomes):
    for case, per_rank in outcomes.items():
        assert len({run.losses for run in per_rank}) == 1, case


def test_measured_bytes_equal_the_plan_on_every_rank(outcomes):
    for case, per_rank in outcomes.items():
        for run in per_rank:
            predicted = {k: v * workers.STEPS for k, v in run.predicted.items()}
            assert run.measured == predicted, case
            assert any(kind == "send" for kind, _, _ in run.measured), case


def test_the_stages_shard_over_the_other_axis(outcomes):
    """The budget makes the stages of the 2x2 cases split over their second axis (tensor
    or data parallel): its collectives are in the measured bytes, so the cases check the
    stages' own collectives too."""
    for case, per_rank in outcomes.items():
        if case.budget is not None:
            other = case.axes[1]
            assert any(axis == other for run in per_rank for _, axis, _ in run.measured), case


def test_no_grad_runs_the_forwards_and_a_scaled_loss_scales_the_gradients(outcomes):
    """Under torch.no_grad() a call runs the schedule's forwards only and returns the same
    loss; (2 * loss).backward() leaves twice the gradients, as on the plain model."""
    for case, per_rank in outcomes.items():
        for run in per_rank:
            loss, expected = run.evaluated
            assert Tolerance().excess(abs(loss - expected), abs(expected)) <= 1, case
            assert run.scaled_excess <= 1, case
