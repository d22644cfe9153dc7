"""Pipelines without processes: the schedules' cost model, the stage cuts, planning, the
plan's JSON and every refusal of a pipeline that can't run."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, _ComputationType

import autopar
from autopar.costs.schedule import bubble, in_flight, step_time, timeline
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.passes.layout.split_stages import (
    balanced_cuts,
    crossing,
    dataflow,
    find_units,
    split_stages,
    unit_times,
)
from autopar.passes.strategies.find_strategies import MAX_BOUNDARY_STRATEGIES, find_strategies
from autopar.planning.graph import plan_graph
from autopar.planning.pipeline.counts import next_counts
from autopar.planning.pipeline.plan import (
    _Chosen,
    _least_step,
    _screen,
    _Stager,
    _started,
    sub_mesh,
)
from autopar.planning.pipeline.request import check_request, pipeline_request
from autopar.values.pipeline import SCHEDULES, Pipeline
from autopar.values.placement import Replicate
from examples import llama, moe
from examples.gpt import build

CPU = "cpu"


def test_balanced_stages_take_m_plus_p_minus_1_stage_times():
    """GPipe and 1F1B: the first micro-batch fills p stages, the rest follow one stage time
    apart: (m + p - 1) t; the bubble is (p - 1) / (m + p - 1)."""
    for name in ("GPipe", "1F1B"):
        assert step_time([2.0] * 4, 8, 4, SCHEDULES[name]) == pytest.approx((8 + 3) * 2.0)
        assert bubble([2.0] * 4, 8, 4, SCHEDULES[name]) == pytest.approx(3 / 11)


def test_the_slowest_stage_sets_the_steady_state():
    assert step_time([1.0, 3.0], 4, 2, SCHEDULES["1F1B"]) == pytest.approx(1 + 3 + 3 * 3)


def test_interleaving_divides_the_bubble_by_the_stages_per_rank():
    """v stages per rank of t / v each: m tau + (p - 1) tau / v."""
    times = [0.5] * 8  # 2 stages per rank on 4 ranks: tau = 1
    assert step_time(times, 8, 4, SCHEDULES["Interleaved1F1B"]) == pytest.approx(8 + 3 * 0.5)
    assert bubble(times, 8, 4, SCHEDULES["Interleaved1F1B"]) == pytest.approx(1.5 / 9.5)


def test_zero_bubble_fills_the_ramps_with_weight_gradients():
    """A split backward leaves of each ramp's (p - 1) slowest stage times only F + B - W =
    1/3 (forward, input and weight gradient a third each): m tau + (p - 1) t / 3."""
    times = [0.5] * 8
    zero_bubble = SCHEDULES["InterleavedZeroBubble"]
    assert step_time(times, 8, 4, zero_bubble) == pytest.approx(8 + 3 * 0.5 / 3)
    assert step_time(times, 8, 4, zero_bubble) < step_time(times, 8, 4,
                                                           SCHEDULES["Interleaved1F1B"])
    assert in_flight(zero_bubble, 8, 4, 0, 2) == in_flight(SCHEDULES["Interleaved1F1B"],
                                                           8, 4, 0, 2)


def test_a_forward_only_timeline_runs_each_stage_s_forward_in_turn():
    times = [1.0, 2.0, 0.5]
    slots = timeline(times, 1, 3, SCHEDULES["GPipe"], training=False)
    assert [(s.kind, s.stage, s.rank, s.start, s.end) for s in slots] == [
        ("F", 0, 0, 0.0, 1.0), ("F", 1, 1, 1.0, 3.0), ("F", 2, 2, 3.0, 3.5)]
    assert max(s.end for s in slots) == step_time(times, 1, 3, SCHEDULES["GPipe"])


@pytest.mark.parametrize("name", ["1F1B", "Interleaved1F1B", "InterleavedZeroBubble"])
def test_the_timeline_runs_every_piece_once_after_what_it_needs(name):
    """Each stage's forward, backward (and for a split backward, weight gradient) of every
    micro-batch, one at a time per rank, each after its inputs; the makespan about the
    modelled step."""
    schedule, ranks, m = SCHEDULES[name], 2, 4
    times = [1.0, 2.0] if schedule.virtual == 1 else [1.0, 2.0, 1.5, 1.0]
    slots = timeline(times, m, ranks, schedule)
    kinds = "FBW" if schedule.splits_backward else "FB"
    assert sorted((s.kind, s.stage, s.microbatch) for s in slots) == sorted(
        (kind, k, j) for kind in kinds for k in range(len(times)) for j in range(m))
    end = {(s.kind, s.stage, s.microbatch): s.end for s in slots}
    for s in slots:
        assert s.rank == s.stage % ranks
        if s.kind == "F" and s.stage:
            assert s.start >= end[("F", s.stage - 1, s.microbatch)]
        if s.kind == "B" and s.stage + 1 < len(times):
            assert s.start >= end[("B", s.stage + 1, s.microbatch)]
        if s.kind == "W":
            assert s.start >= end[("B", s.stage, s.microbatch)]
    for r in range(ranks):
        mine = sorted((s.start, s.end) for s in slots if s.rank == r)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(mine, mine[1:]))
    makespan = max(s.end for s in slots)
    assert makespan == pytest.approx(step_time(times, m, ranks, schedule), rel=0.15)


def test_micro_batches_in_flight_follow_the_schedule():
    """GPipe holds every micro-batch; 1F1B p - r on rank r; interleaved torch's warm-up."""
    assert in_flight(SCHEDULES["GPipe"], 8, 4, 0, 1) == 8
    assert [in_flight(SCHEDULES["1F1B"], 8, 4, r, 1) for r in range(4)] == [4, 3, 2, 1]
    assert in_flight(SCHEDULES["1F1B"], 2, 4, 0, 1) == 2
    # (v - 1) p + 2 (p - 1 - r) + 1 stage-forwards on rank 0, shared by its stages: 6 + 5.
    assert [in_flight(SCHEDULES["Interleaved1F1B"], 8, 4, 0, 2, c) for c in (0, 1)] == [6, 5]


@pytest.mark.parametrize("m, p, v", [(4, 2, 2), (8, 4, 2), (3, 4, 2), (10, 4, 2), (12, 4, 3),
                                     (16, 4, 4), (6, 3, 2)])
def test_interleaved_stages_hold_what_torchs_own_order_holds(m, p, v):
    """The most micro-batches a rank's stages hold at once, walked through torch's own
    order of the rank's operations (its Interleaved1F1B's), shared by its stages."""
    order = ScheduleInterleaved1F1B.__new__(ScheduleInterleaved1F1B)
    order.pp_group_size, order.n_local_stages, order._n_microbatches = p, v, m
    order.number_of_rounds = max(1, m // p)
    order.microbatches_per_round = m // order.number_of_rounds
    for rank in range(p):
        held = most = 0
        for action in filter(None, order._calculate_single_rank_operations(rank)):
            held += 1 if action.computation_type == _ComputationType.FORWARD else -1
            most = max(most, held)
        shares = [in_flight(SCHEDULES["Interleaved1F1B"], m, p, rank, v, c) for c in range(v)]
        assert sum(shares) == most and max(shares) - min(shares) <= 1, (rank, most, shares)


@pytest.mark.parametrize("kwargs, message", [
    ({"schedule": "Bogus"}, "no pipeline schedule called 'Bogus'"),
    ({"schedule": "ZBVZeroBubble"}, "not run by autopar yet"),
    ({"schedule": "DualPipeV"}, "not run by autopar yet"),
    ({"stages": 0}, "positive count"),
    ({"microbatches": 2.5}, "positive count"),
    ({"cuts": (0,)}, "first block of each stage"),
    ({"cuts": (3, 2)}, "increasing"),
    ({"cuts": [2]}, "increasing"),
    ({"cuts": (2,), "stages": 3}, "one fewer than stages"),
])
def test_bad_pipeline_options_are_refused_with_the_fix(kwargs, message):
    with pytest.raises(autopar.PipelineError, match=message) as error:
        Pipeline(**kwargs)
    assert "fix:" in str(error.value)


def test_schedule_names_are_torchs_in_any_case():
    assert Pipeline(schedule="interleaved1f1b").schedule == "Interleaved1F1B"
    assert Pipeline(schedule="Schedule1F1B").schedule == "1F1B"


@pytest.mark.parametrize("pipeline, blocks, batch, message", [
    (Pipeline(), 1, 8, "need at least 2 blocks"),
    (Pipeline(microbatches=3), 4, 8, "don't divide the batch of 8"),
    (Pipeline(schedule="1F1B", microbatches=2), 8, 8, "at least as many micro-batches"),
    (Pipeline(stages=3), 8, 8, "can't run on 2 pipeline ranks"),
    (Pipeline(cuts=(8,)), 8, 8, "a cut at block 8 of a model of 8 blocks"),
])
def test_requests_that_cant_run_are_refused_before_any_solve(pipeline, blocks, batch,
                                                             message):
    ranks = 4 if pipeline.schedule == "1F1B" else 2
    with pytest.raises(autopar.PipelineError, match=message) as error:
        check_request(pipeline, ranks, blocks, batch)
    assert "fix:" in str(error.value)


def test_given_cuts_fix_the_stages_blocks():
    model, inputs = build(batch=8, hidden=64, layers=4)
    mesh = autopar.Mesh((2,), ("pp",), hardware="cpu")
    plan = autopar.plan(model, mesh, inputs, pipeline=Pipeline(cuts=(1,)), time_limit=5.0)
    assert Pipeline(cuts=(1,)).stages == 2
    assert [stage.units for stage in plan.pipeline.stages] == [(0, 0), (1, 3)]


def test_a_pipeline_over_an_h100_and_an_a100_node_gives_the_h100_more_layers():
    model, inputs = llama.build(vocab=4096, seq=512, hidden=512, heads=8, kv_heads=4, ffn=1408,
                                layers=6, batch=8, device="meta", dtype=torch.bfloat16)
    mesh = autopar.Mesh((2, 2), ("pp", "tp"), hardware=["h100-sxm", "a100-sxm"])
    steps, layers = {}, {}
    for name, cuts in (("sized", None), ("even", (3,))):
        plan = autopar.plan(model, mesh, inputs, time_limit=2.0,
                            pipeline=Pipeline(schedule="1F1B", cuts=cuts))
        steps[name] = plan.step_time_s
        layers[name] = [last - first + 1 for first, last in
                        (stage.units for stage in plan.pipeline.stages)]
    assert layers["even"] == [3, 3] and layers["sized"][0] > layers["sized"][1]
    assert steps["sized"] < steps["even"]
    table = autopar.summary(plan).split("Pipeline over pp")[1]
    assert "devices" in table and "h100-sxm" in table and "a100-sxm" in table


def test_a_missing_pipeline_axis_is_named():
    model, inputs = build(batch=8, hidden=64, layers=2)
    with pytest.raises(autopar.PipelineError, match="no axis 'pp'"):
        autopar.plan(model, autopar.Mesh((2,), ("dp",), hardware=CPU), inputs,
                     pipeline=Pipeline(), time_limit=2)


def test_auto_pipelines_only_over_an_axis_named_pp():
    assert pipeline_request(autopar.Mesh((2, 2), ("dp", "tp"), hardware=CPU), "auto") is None
    assert pipeline_request(autopar.Mesh((2, 2), ("pp", "tp"), hardware=CPU), "auto") == \
        Pipeline()
    with pytest.raises(autopar.PipelineError):
        pipeline_request(autopar.Mesh((2,), ("pp",), hardware=CPU), "yes")


def test_cuts_fall_between_blocks_and_move_only_the_hidden_state():
    """GPT's blocks read the residual stream only; the tied embedding is held by the first
    and last stages."""
    model, inputs = build(batch=8, hidden=64, layers=4)
    gm = annotate(capture(model, inputs))
    units = find_units(gm)
    assert units.names == ("layers.0", "layers.1", "layers.2", "layers.3")
    flow = dataflow(gm)
    assert all(len(crossing(gm, units, cut, flow)) == 1 for cut in (1, 2, 3))
    stages = split_stages(gm, units, (2,))
    assert [(s.first, s.last) for s in stages] == [(0, 1), (2, 3)]
    assert stages[0].sends == stages[1].receives and len(stages[1].receives) == 1
    assert stages[0].shared == stages[1].shared == ("wte.weight",)
    ops = sum(1 for s in stages for n in s.module.graph.nodes if n.op == "call_function")
    assert ops == sum(1 for n in gm.graph.nodes if n.op == "call_function")


def _four_stage_candidate(planned: list, schedule: str = "1F1B", ranks: int = 4):
    """A 4-layer GPT's candidate of 4 stages under `schedule` on a (ranks)x2 (pp, dp) mesh
    (1F1B on 4 ranks: a stage per rank), for `_screen`, and the `_Stager` its stages are
    screened with: each stage plan appended to `planned`."""
    model, inputs = build(batch=8, hidden=64, layers=4)
    gm = annotate(capture(model, inputs))
    units = find_units(gm)
    mesh = autopar.Mesh((ranks, 2), ("pp", "dp"), hardware="h100-sxm")

    def plan_stage(graph, stage_mesh, **options):
        planned.append(graph)
        return plan_graph(graph, stage_mesh, model_name="gpt", time_limit=1.0, **options)

    stager = _Stager(mesh, 0, (sub_mesh(mesh, 0),) * ranks, None, plan_stage, {}, {}, {})
    times = (unit_times(gm, units, mesh.hardware),) * ranks
    bound = _least_step(times, balanced_cuts(times[0], 4), 2, 4, ranks, SCHEDULES[schedule])
    return (bound, 4, SCHEDULES[schedule], 4, lambda: (gm, units, times)), stager


def test_a_screening_bound_rises_with_its_stages_and_bounds_the_step():
    """Each stage's least time bounds its screened time, so the bound only rises as stages
    are screened, from the candidate's `_least_step` to at most its step."""
    planned: list = []
    candidate, stager = _four_stage_candidate(planned)
    chosen, screening = _started(candidate, (1.0,) * 4, stager, [], lambda message: None)
    bounds = [screening.bound()]
    while not screening.done:
        screening.advance()
        bounds.append(screening.bound())
    assert bounds[0] == pytest.approx(candidate[0]) and len(planned) == 4
    assert bounds == sorted(bounds) and bounds[-1] > bounds[0]
    assert bounds[-1] <= stager.costed(chosen, screening.plans).step_time_s


def test_a_candidate_whose_first_stages_already_lose_is_not_planned_further():
    """Its step is monotone in every stage's time: once its bound (the stages screened, the
    others at their least) reaches the best step found, the rest are not planned."""
    planned: list = []
    candidate, stager = _four_stage_candidate(planned)
    best, _ = _screen([candidate], None, stager, 8, [], lambda message: None)
    assert best is not None and len(planned) == 4
    _, screening = _started(candidate, (1.0,) * 4, stager, [], lambda message: None)
    before = screening.bound()
    screening.advance()
    after = screening.bound()  # the first stage screened: above what the best steps
    planned.clear()
    stager.cache.clear()
    beaten = SimpleNamespace(step_time_s=(before + after) / 2)  # all `_screen` reads of it
    found, _ = _screen([candidate], dataclasses.replace(best, plan=beaten), stager, 8, [],
                       lambda message: None)
    assert before < after and found.plan is beaten and len(planned) == 1


def test_an_interleaved_candidate_screens_a_rank_s_later_stages_ahead_of_order():
    """Each rank of an interleaved candidate holds a stage of each round: after stage 0, the
    stage its rank holds next round (2 of 4 on 2 ranks) is screened ahead, as receiving
    what stage 0 sends. Its time raises the bound at once, so a candidate whose ranks lose
    is left after those two; where the guess holds, the screening in order reuses it (no
    more solves than stages)."""
    planned: list = []
    candidate, stager = _four_stage_candidate(planned, "Interleaved1F1B", ranks=2)
    chosen, screening = _started(candidate, (1.0,) * 4, stager, [], lambda message: None)
    screening.advance()
    first = screening.bound()
    screening.advance()  # ahead of order: stage 2, which rank 0 holds too
    assert len(screening.plans) == 1 and len(planned) == 2
    assert planned[1] is chosen.stages[2].module and screening.bound() > first
    while not screening.done:
        screening.advance()
    assert len(planned) == 4  # stages 1 and 3 in order; stage 2's probe was its plan
    plan = stager.costed(chosen, screening.plans)
    planned.clear()
    stager.cache.clear()
    beaten = SimpleNamespace(step_time_s=(first + screening.bound()) / 2)
    best = _Chosen(chosen.stages, chosen.names, chosen.schedule, 4, plan=beaten)
    found, _ = _screen([candidate], best, stager, 8, [], lambda message: None)
    assert found.plan is beaten and len(planned) == 2
    assert plan.step_time_s >= screening.bound() - 1e-12


def test_micro_batch_counts_go_up_while_memory_binds_and_down_from_the_most_where_none_fit():
    """The first round is p to 4p (8, 16, 32 on 8 ranks); a fit holding most of the budget
    doubles while it improves; no fit jumps to the most (256), which descends while it
    improves, and where the most does not fit either, the counts double from the first
    round's."""
    allowed, first = [8, 16, 32, 64, 128, 256], (8, 16, 32)
    binding, loose = _fitting(0.9), _fitting(0.5)

    def after(tried, best, improved=True, descending=False):
        return next_counts(allowed, first, list(tried), best, 1.0, improved=improved,
                            descending=descending)

    assert after(first, binding) == [64] and after(first, loose) == []
    assert after([*first, 64], binding, improved=False) == []
    assert after(first, None) == [256]
    assert after([*first, 256], binding, descending=True) == [128]
    assert after([*first, 256, 128], binding, improved=False, descending=True) == []
    assert after([*first, 256], None) == [64] and after([*first, 256, 64], None) == [128]
    assert next_counts(allowed, first, list(first), binding, None, improved=True,
                       descending=False) == []  # no memory limit: nothing to relieve


def _fitting(share: float) -> SimpleNamespace:
    """A best plan holding `share` of a budget of 1 byte."""
    return SimpleNamespace(peak_memory_bytes=share)


def test_balanced_cuts_minimise_the_slowest_stage():
    assert balanced_cuts([1, 1, 1, 1], 2) == (2,)
    assert balanced_cuts([3, 1, 1, 1], 2) == (1,)
    assert balanced_cuts([1, 1, 1, 1, 1, 1], 3) == (2, 4)
    # A stage on devices twice as fast takes twice the units.
    assert balanced_cuts([[0.5] * 6, [1.0] * 6], 2) == (4,)


def test_a_pipelined_plan_records_its_stages_and_survives_json(tmp_path):
    model, inputs = build(batch=8, hidden=64, layers=4)
    mesh = autopar.Mesh((2, 2), ("pp", "tp"), hardware=CPU)
    plan = autopar.plan(model, mesh, inputs, time_limit=2,
                        pipeline=Pipeline(schedule="1F1B", microbatches=4))
    record = plan.pipeline
    assert (record.schedule, record.microbatches, record.virtual) == ("1F1B", 4, 1)
    assert [s.rank for s in record.stages] == [0, 1]
    assert [s.in_flight for s in record.stages] == [2, 1]
    times = [s.time_s for s in record.stages]
    assert plan.step_time_s >= sum(times) + 3 * max(times)
    assert {n.output.split(",")[0] for n in plan.nodes} == {"R"}  # stages are not split on pp
    assert plan.stage_plan(1).mesh.axis_names == ("tp",)
    plan.save(tmp_path / "plan.json")
    assert autopar.Plan.load(tmp_path / "plan.json") == plan


def test_a_forced_pipeline_accumulates_over_a_model_that_mixes_samples_and_says_so():
    """MoE routing has a capacity over the batch's tokens: asked for, the pipeline routes
    each micro-batch on its own and the plan warns, naming the op, that the step is gradient
    accumulation, not the whole batch's gradient."""
    model, inputs = moe.build(batch=4, layers=2)
    plan = autopar.plan(model, autopar.Mesh((2,), ("pp",), hardware=CPU), inputs, time_limit=2,
                        pipeline=Pipeline(schedule="GPipe", microbatches=2))
    assert plan.pipeline is not None and plan.pipeline.microbatches == 2
    warning = next(w for w in plan.warnings if "mixes the samples" in w)
    assert "layers.0.moe" in warning and "gradient accumulation over 2 micro-batches" in warning


def test_auto_does_not_pipeline_a_model_that_mixes_samples():
    """"auto" never changes what a step computes: the MoE is planned without a pipeline
    (no pipeline candidate is even planned), and the plain plan's micro-batch count still
    refuses it with the op named."""
    model, inputs = moe.build(batch=4, layers=2)
    mesh = autopar.Mesh((2, 2), ("pp", "tp"), hardware=CPU)
    said: list[str] = []
    plan = autopar.plan(model, mesh, inputs, time_limit=2, progress=said.append)
    assert plan.pipeline is None and plan.microbatches == 1
    assert not any("pipeline:" in message for message in said)
    assert not any("mixes the samples" in w for w in plan.warnings)
    with pytest.raises(autopar.MicrobatchError, match="mixes the samples"):
        autopar.plan(model, mesh, inputs, time_limit=2, pipeline=False, microbatches=2)


def test_pins_apply_in_the_stage_that_holds_the_tensor():
    """A pin on the whole mesh, replicated on the pipeline axis, is the stage's pin on the
    other axes; the pinned weight of the second stage is stored as asked."""
    model, inputs = build(batch=8, hidden=64, layers=4)
    mesh = autopar.Mesh((2, 2), ("pp", "tp"), hardware=CPU)
    pinned = {"layers.3.mlp.fc.weight": "R,S(1)", "layers.0.mlp.fc.weight": "R,R"}
    plan = autopar.plan(model, mesh, inputs, time_limit=2, constraints=pinned,
                        pipeline=Pipeline(schedule="1F1B", microbatches=4))
    assert _stored(plan, 3) == ("R,S(1)", 1) and _stored(plan, 0) == ("R,R", 0)
    free = autopar.plan(model, mesh, inputs, time_limit=2,
                        pipeline=Pipeline(schedule="1F1B", microbatches=4))
    assert _stored(free, 3) != ("R,S(1)", 1) or _stored(free, 0) != ("R,R", 0), \
        "the pins must change the plan"


def _stored(plan: autopar.Plan, layer: int) -> tuple[str, int | None]:
    """(placements, stage) of block `layer`'s MLP input weight."""
    node = next(n for n in plan.nodes if n.role == "parameter"
                and n.name.endswith(f"layers_{layer}_mlp_fc_weight"))
    return node.output, node.stage


@pytest.mark.parametrize("pins,message", [
    ({"layers.3.mlp.fc.weight": "S(0),R"}, "splits over the pipeline axis 'pp'"),
    ({"no.such.weight": "R,R"}, "no such tensor"),
    ({"layers.3.mlp.fc.weight": "R"}, "one per mesh axis"),
])
def test_pins_a_pipeline_cant_honour_are_refused_with_the_fix(pins, message):
    model, inputs = build(batch=8, hidden=64, layers=4)
    mesh = autopar.Mesh((2, 2), ("pp", "tp"), hardware=CPU)
    with pytest.raises(autopar.ShardingError, match=message) as error:
        autopar.plan(model, mesh, inputs, time_limit=2, constraints=pins,
                     pipeline=Pipeline(schedule="1F1B", microbatches=4))
    assert error.value.fix


def test_auto_plans_without_a_pipeline_when_a_pin_splits_over_pp():
    model, inputs = build(batch=8, hidden=64, layers=4)
    mesh = autopar.Mesh((2, 2), ("pp", "tp"), hardware=CPU)
    plan = autopar.plan(model, mesh, inputs, time_limit=2,
                        constraints={"layers.3.mlp.fc.weight": "S(0),R"})
    assert plan.pipeline is None
    assert _stored(plan, 3)[0] == "S(0),R"


def test_a_data_parallel_stage_sends_each_rank_its_piece():
    """Across pp x dp, the hidden state a stage sends is split by sample over dp as the
    stage made it: each rank sends its half to its counterpart, and the next stage receives
    it in that placement (the plan's send bytes are a piece's, not the whole tensor's)."""
    model, inputs = llama.build(batch=8, layers=4)
    mesh = autopar.Mesh((2, 2), ("pp", "dp"), hardware=CPU)
    plan = autopar.plan(model, mesh, inputs, time_limit=2,
                        pipeline=Pipeline(schedule="1F1B", microbatches=2))
    first, second = plan.stage_plan(0), plan.stage_plan(1)
    output = next(n for n in first.nodes if n.role == "output")
    sent = dict(zip(plan.pipeline.stages[0].sends, output.inputs))
    assert "S(0)" in sent.values(), sent
    micro = annotate(capture(model, tuple(x[:4] for x in inputs)))  # one micro-batch
    specs = {n.name: n.meta["autopar_tensor"] for n in micro.graph.nodes}
    for send in (t for t in output.transfers if t.kind == "send"):
        placement = sent[send.tensor]
        assert second.node(send.tensor).output == placement
        pieces = 2 if placement == "S(0)" else 1
        assert send.nbytes == 2 * specs[send.tensor].nbytes / pieces  # 2 micro-batches


def test_a_stage_sends_its_largest_tensors_split_where_all_choices_would_be_too_many():
    """Llama's first stage sends its hidden state and two rotary tables: on a 4x2 sub-mesh
    their placements multiply past `MAX_BOUNDARY_STRATEGIES`, so the hidden state (the
    largest) and then one table keep their choices, and the last table is sent
    replicated."""
    model, inputs = llama.build()
    gm = annotate(capture(model, inputs))
    first = split_stages(gm, find_units(gm), (1,))[0]
    mesh = autopar.Mesh((4, 2), ("dp", "tp"), hardware="h100-sxm")
    table = find_strategies(first.module, mesh)
    output = next(n.name for n in first.module.graph.nodes if n.op == "output")
    strategies, sent = table.strategies[output], table.inputs[output]
    choices = [len({s.inputs[k] for s in strategies}) for k in range(len(sent))]
    largest = max(range(len(sent)), key=lambda k: sent[k][1].nbytes)
    assert len(sent) == 3 and 1 < len(strategies) <= MAX_BOUNDARY_STRATEGIES
    assert choices[largest] == max(choices) > 1
    assert sorted(choices)[0] == 1  # a rotary table, sent replicated
    whole = tuple(Replicate() for _ in mesh.shape)
    assert strategies[0].inputs == (whole,) * 3  # the all-replicated one first
