"""`time_limit` bounds a whole planning call as a budget of solver seconds
(`autopar.planning.deadline`): each solve is capped by what is left and charged its
limit, optional work stops once the budget is spent, and the plan records the call's
time."""

from __future__ import annotations

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



def test_micro_batch_counts_are_screened_while_a_screening_solve_fits_in_what_is_left():
    # The whole step's first round takes half the limit unless it proves its plan optimal:
    # the counts screened after it must fit in the other half, or more time would screen
    # fewer of them.
    from autopar.planning.graph import SCREENING_TIME
    from autopar.planning.layout import _room_after_screening

    assert _room_after_screening(None, 30.0)
    assert _room_after_screening(Deadline(30.0, allotted=15.0), 30.0)
    assert _room_after_screening(Deadline(300.0, allotted=150.0), 300.0)
    assert not _room_after_screening(Deadline(30.0, allotted=30.0 * (1 - SCREENING_TIME)), 30.0)


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
