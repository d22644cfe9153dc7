"""`time_limit` bounds a whole planning call as a budget of solver seconds
(`autopar.planning.deadline`): each solve is capped by what is left and charged its
limit, optional work stops once the budget is spent, and the plan records the call's
time."""

from __future__ import annotations

import dataclasses

import pytest

import autopar
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.planning.deadline import LATE_SHARE, LEAST_SOLVE_S, Deadline
from autopar.planning.entry import plan_model
from autopar.planning.graph import STAGE
from examples import gpt, mlp


def test_a_solve_gets_a_share_of_the_budget_and_is_charged_its_limit():
    fresh = Deadline(10.0)
    assert fresh.solve_seconds(10.0) == 10.0  # all that is left
    assert fresh.solve_seconds(10.0, 0.5) == 5.0  # one of two rounds to come
    assert fresh.solve_seconds(1.0) == 1.0 and not fresh.passed()
    fresh.charge(4.0, optimal=False)
    fresh.charge(4.0, optimal=True)  # ended early: charged the least
    assert fresh.left() == 10.0 - 4.0 - LEAST_SOLVE_S
    late = Deadline(10.0, allotted=8.0)
    assert late.solve_seconds(10.0) == LATE_SHARE * 10.0  # more than the 2 s left
    assert late.solve_seconds(2.5) == 2.0  # what is left, more than half of 2.5 s
    gone = Deadline(10.0, allotted=12.0)
    assert gone.passed() and gone.left() == 0.0
    assert gone.solve_seconds(0.1) == LEAST_SOLVE_S


def test_the_plan_records_the_calls_time_and_the_summary_prints_it():
    model, inputs = mlp.build(batch=64, hidden=256, ffn=1024, device="meta")
    mesh = autopar.Mesh((4,), ("dp",), hardware="h100-sxm")
    plan = autopar.plan(model, mesh, inputs, time_limit=20)
    assert plan.solver.time_limit_s == 20.0
    assert 0.0 < plan.solver.planning_s < 20.0 and not plan.solver.cut_short
    summary = autopar.summary(plan)
    assert "planning time" in summary and "of a 20 s limit" in summary
    restored = autopar.Plan.from_dict(plan.to_dict())
    assert restored.solver.planning_s == plan.solver.planning_s


def _rounds(messages: list[str]) -> int:
    """Overlap rounds after the first: a problem built again right after a plan was
    extracted, without finding strategies for another graph in between."""
    stages = [m.split()[1] for m in messages if m.startswith(STAGE)]
    return sum(a == "extract_plan" and b == "build_problem" for a, b in zip(stages, stages[1:]))


def _long_sequence_gpt():
    """A GPT of 8 sequences of 8192 tokens on 4 H100s, captured, and the least memory its
    whole step needs without recomputation."""
    model, inputs = gpt.build(batch=8, seq=8192, hidden=256, heads=4, layers=2, vocab=512,
                              device="meta")
    mesh = autopar.Mesh((4,), ("dp",), hardware="h100-sxm")
    with pytest.raises(autopar.InfeasiblePlanError) as whole:
        autopar.plan(model, mesh, inputs, memory_budget=1, recompute=False, microbatches=1)
    return model, inputs, mesh, annotate(capture(model, inputs)), whole.value.min_bytes


def test_once_the_deadline_has_passed_no_optional_work_starts():
    # A long-sequence GPT that fits only in micro-batches: with the deadline passed, the
    # search still finds a plan that fits, but plans no further overlap round, tries no
    # more micro-batch counts than it takes to fit and does not plan the chosen one again
    # in full, as it does in time.
    model, inputs, mesh, gm, least = _long_sequence_gpt()
    budget = 0.7 * least
    runs = {}
    for name, deadline in (("in time", None), ("late", Deadline(1.0, allotted=1.0))):
        said: list[str] = []
        made = plan_model(model, gm, inputs, mesh, microbatches="auto", model_name="gpt",
                          memory_budget=budget, recompute=False, progress=said.append,
                          deadline=deadline)
        runs[name] = (made, said)
    late, said = runs["late"]
    assert late.microbatches > 1 and late.peak_memory_bytes <= budget
    assert _rounds(said) == 0
    counts = [m for m in said if "micro-batches of" in m]
    assert len(counts) == len(set(counts)) and len(counts) <= 2  # no re-plan in full
    in_time, said = runs["in time"]
    counts = [m for m in said if "micro-batches of" in m]
    assert len(counts) > len(set(counts))  # in time, the chosen count is planned in full
    assert in_time.step_time_s <= late.step_time_s
    assert late.solver.time_limit_s == 1.0 and late.solver.planning_s > 0.0


@pytest.mark.parametrize("limit", [0, -5.0, "10", float("inf"), True])
def test_a_time_limit_that_is_not_a_positive_number_is_refused_before_planning(limit):
    model, inputs = mlp.build(batch=8, hidden=16, ffn=32, device="meta")
    mesh = autopar.Mesh((2,), ("dp",), hardware="h100-sxm")
    with pytest.raises(autopar.ProblemFormatError) as info:
        autopar.plan(model, mesh, inputs, time_limit=limit)
    assert "time_limit" in str(info.value) and "fix:" in str(info.value)



def test_more_micro_batches_are_screened_only_where_memory_may_cost_the_step():
    # Micro-batches trade time for memory: where the memory-free objective is known, they
    # are screened while memory costs the plan more than the tolerance, deadline or not;
    # where it is not, while a screening solve fits in what is left (the whole step's
    # first round takes half the limit unless it proves its plan optimal).
    from autopar.planning.graph import SCREENING_TIME
    from autopar.planning.layout import MEMORY_COSTS, _may_gain

    model, inputs = mlp.build(batch=8, hidden=16, ffn=32)
    plan = autopar.plan(model, autopar.Mesh((2,), ("dp",)), inputs, time_limit=5.0)

    def costing(share: float | None) -> autopar.Plan:
        free = None if share is None else plan.solver.objective / (1 + share)
        return dataclasses.replace(plan, solver=dataclasses.replace(plan.solver,
                                                                    memory_free=free))

    roomy, spent = Deadline(300.0, allotted=150.0), Deadline(30.0, allotted=30.0)
    for deadline, limit in ((None, 30.0), (roomy, 300.0), (spent, 30.0)):
        assert _may_gain(costing(2 * MEMORY_COSTS), deadline, limit)
        assert not _may_gain(costing(MEMORY_COSTS / 2), deadline, limit)
    assert _may_gain(costing(None), None, 30.0)
    assert _may_gain(None, Deadline(30.0, allotted=15.0), 30.0)  # none fits yet
    assert _may_gain(costing(None), roomy, 300.0)
    assert not _may_gain(costing(None), Deadline(30.0, allotted=30.0 * (1 - SCREENING_TIME)),
                         30.0)


def test_past_the_deadline_more_micro_batches_are_screened_where_memory_costs_the_step():
    # The long-sequence GPT at 70% of the least memory its whole step needs without
    # recomputation: recomputing, its whole step fits, at a cost the memory-free answer
    # shows (`SolverReport.memory_free`). With the deadline passed, the search still
    # screens two micro-batches, which step faster; with room to spare it does not.
    from autopar.planning.layout import MEMORY_COSTS

    model, inputs, mesh, gm, least = _long_sequence_gpt()
    for share, costly in ((0.7, True), (1.2, False)):
        budget = share * least
        step = autopar.plan(model, mesh, inputs, memory_budget=budget, microbatches=1)
        assert step.solver.memory_free is not None
        costs = step.solver.objective > (1 + MEMORY_COSTS) * step.solver.memory_free
        assert costs == costly
        assert f"objective {step.solver.memory_free:.4g}" in autopar.summary(step)
        late = plan_model(model, gm, inputs, mesh, microbatches="auto", model_name="gpt",
                          memory_budget=budget, deadline=Deadline(1.0, allotted=1.0))
        assert (late.microbatches > 1) == costly and late.peak_memory_bytes <= budget
        if costly:
            assert late.step_time_s < step.step_time_s


def test_a_settled_screening_within_its_gap_is_the_plan_and_one_beyond_it_is_solved_again():
    # A GPT whose compute hides its gradients' reductions (the first round's charges are
    # what its plan leaves exposed) under budgets that bind: at 90% of what it holds
    # unlimited, its screening plan is within `SCREENED_GAP` of the memory-free bound and
    # is the plan, one solve; at 70% it is not, and the same problem is solved in full.
    from autopar.planning.graph import SCREENED_GAP

    model, inputs = gpt.build(vocab=8192, seq=1024, hidden=1024, heads=16, layers=4,
                              batch=32, device="meta")
    mesh = autopar.Mesh((4, 2), ("dp", "tp"), hardware="h100-sxm")
    free = autopar.plan(model, mesh, inputs, time_limit=6.0, microbatches=1)
    solves = {}
    for share in (0.9, 0.7):
        said: list[str] = []
        plan = autopar.plan(model, mesh, inputs, memory_budget=share * free.peak_memory_bytes,
                            time_limit=6.0, microbatches=1, progress=said.append)
        solves[share] = [m for m in said if m.startswith(f"{STAGE} solve")]
        assert _rounds(said) == 0  # one problem: the charges were settled
        assert plan.solver.objective >= free.step_time_s
        gap = plan.solver.objective / plan.solver.memory_free - 1
        assert (gap <= SCREENED_GAP) == (share == 0.9)
    assert len(solves[0.9]) == 1 and len(solves[0.7]) == 2
