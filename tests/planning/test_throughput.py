"""Serving plans weighed as they serve: objective="throughput", the batch of a decode
program serving the most tokens a second (`autopar.planning.throughput`), and the weights
placed for whichever program makes a request shorter (`autopar.planning.prefill`)."""

from __future__ import annotations

import dataclasses
import json
import types

import pytest
import torch

import autopar
from autopar.errors import InfeasiblePlanError, PlanningError
from autopar.planning.deadline import Deadline
from autopar.planning.prefill import pinned_state, request_s, with_prefill
from autopar.planning.throughput import MAX_DOUBLINGS, most_tokens

MESH = autopar.Mesh((2, 2), ("dp", "tp"), hardware="h100-sxm")
BUDGET = 40e6


def _served(device: str = "meta") -> tuple[autopar.CachedLM, tuple[torch.Tensor, ...]]:
    """A small Llama in bfloat16 with a 256-position cache for 4 sequences."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, attn_implementation="sdpa")
    with torch.device(device):
        lm = LlamaForCausalLM(config).to(torch.bfloat16).eval()
        served = autopar.CachedLM(lm, batch=4, max_len=256)
        return served, (torch.zeros(4, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long))


@pytest.fixture(scope="module")
def planned() -> tuple[autopar.CachedLM, autopar.Plan]:
    served, inputs = _served()
    return served, autopar.plan(served, MESH, inputs, training=False, objective="throughput",
                                memory_budget=BUDGET, time_limit=10.0)


def test_throughput_plans_the_batch_serving_the_most_tokens_within_memory(planned):
    served, plan = planned
    batches = dict(plan.serving)
    kept = max(batches, key=batches.get)
    assert plan.objective == "throughput" and kept > 4
    assert plan.inputs[0] == f"int64[{kept}, 1]"
    assert batches[kept] == pytest.approx(kept / plan.step_time_s)
    assert plan.peak_memory_bytes <= BUDGET
    # The search went past the batch it kept: the next one up did not fit.
    assert batches.get(2 * kept) == 0.0 or kept == 4 << MAX_DOUBLINGS
    # The user's model keeps its own cache.
    assert tuple(served.holders[0].kv_cache_keys.shape)[0] == 4
    assert "objective: throughput" in autopar.summary(plan)


def test_the_throughput_plan_serves_more_than_the_latency_plan_of_the_given_batch(planned):
    _, plan = planned
    served, inputs = _served()
    latency = autopar.plan(served, MESH, inputs, training=False, memory_budget=BUDGET,
                           time_limit=5.0)
    assert latency.objective == "latency" and not latency.serving
    assert dict(plan.serving)[4] == pytest.approx(4 / latency.step_time_s, rel=0.05)
    assert max(dict(plan.serving).values()) > 4 * 4 / latency.step_time_s


def test_a_throughput_plan_survives_its_json(planned):
    _, plan = planned
    assert autopar.Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


@dataclasses.dataclass(frozen=True)
class _Made:
    """What the search reads of a plan: step time, memory, nodes (no weights here)."""

    step_time_s: float
    peak_memory_bytes: float
    memory_limit_bytes: float = 100.0
    nodes: tuple = ()
    kv_cache_bytes: float = 0.0
    pipeline: None = None
    objective: str = "latency"
    serving: tuple = ()


def _planner(fits_up_to: int, log: list[int]):
    def plan_batch(batch: int, deadline: Deadline) -> _Made:
        log.append(batch)
        if batch > fits_up_to:
            raise InfeasiblePlanError("too big", expected="", got="", fix="")
        return _Made(step_time_s=1.0 + batch / 64, peak_memory_bytes=batch,
                     kv_cache_bytes=batch)
    return plan_batch


def test_the_search_bisects_down_from_its_memory_guess_and_falls_back_on_finish():
    log: list[int] = []
    made = most_tokens(_planner(24, log), 2, Deadline(60.0))
    # 2 fills 2 of 100 bytes: the guess is 64 (the largest power-of-two multiple under
    # 100), then the middle in doublings between what fitted and what did not: 8 (between
    # 2 and 64), 16 (8 and 64), 32 (16 and 64), until one doubling apart.
    assert log == [2, 64, 8, 16, 32]
    assert dict(made.serving) == {2: pytest.approx(2 / (1 + 2 / 64)), 8: 8 / 1.125,
                                  16: 16 / 1.25, 32: 0.0, 64: 0.0}

    def finish(plan: _Made, batch: int) -> _Made:
        if batch == 16:
            raise InfeasiblePlanError("prefill too big", expected="", got="", fix="")
        return plan

    log.clear()
    made = most_tokens(_planner(24, log), 2, Deadline(60.0), finish)
    # 16's prefill does not fit: 8, one doubling below it, is kept.
    assert log == [2, 64, 8, 16, 32]
    assert made.peak_memory_bytes == 8 and dict(made.serving)[16] == 0.0


def test_a_late_search_stops_going_up_but_ends_its_bisection():
    log: list[int] = []
    made = most_tokens(_planner(24, log), 2, Deadline(1.0, allotted=1.0))
    assert log == [2, 64, 8, 16, 32] and made.peak_memory_bytes == 16
    log.clear()
    most_tokens(_planner(10_000, log), 2, Deadline(1.0, allotted=1.0))
    assert log == [2, 64]  # it fitted: no doubling past the time limit


def test_the_given_batch_not_fitting_is_an_error():
    with pytest.raises(InfeasiblePlanError):
        most_tokens(_planner(1, []), 2, Deadline(60.0))


@pytest.mark.parametrize("options, match", [
    (dict(training=False, objective="fast"), "objective must be"),
    (dict(objective="throughput"), "training=False"),
])
def test_bad_objectives_are_refused_before_planning(options, match):
    served, inputs = _served()
    with pytest.raises(PlanningError, match=match):
        autopar.plan(served, MESH, inputs, **options)


def test_throughput_needs_a_cached_lm_on_the_meta_device():
    served, inputs = _served("cpu")
    with pytest.raises(PlanningError, match="meta device"):
        autopar.plan(served, MESH, inputs, training=False, objective="throughput")
    with pytest.raises(PlanningError, match="CachedLM"):
        autopar.plan(served.lm, MESH, (inputs[0],), training=False, objective="throughput")


@dataclasses.dataclass(frozen=True)
class _Program:
    """What `with_prefill` reads of a plan."""

    step_time_s: float
    kv_cache_tokens: int = 4 * 256
    peak_memory_bytes: float = 1.0
    nodes: tuple = (types.SimpleNamespace(name="w", role="parameter", output="S(0)"),)
    mesh: autopar.Mesh = autopar.Mesh((2,), ("tp",))
    pipeline: None = None
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    prefill_peak_bytes: float = 0.0
    placed_for: str = "decode"


def _programs(times: dict[tuple[bool, bool], float | None], calls: list):
    """A `plan_forward` whose plans take `times[(prefill?, pinned?)]` (None: does not fit)."""
    def plan_forward(inputs, pins, layout, share):
        key = (inputs[0].shape[1] > 1, bool(pins))
        calls.append(key)
        if times[key] is None:
            raise InfeasiblePlanError("no fit", expected="", got="", fix="")
        return _Program(step_time_s=times[key])
    return plan_forward


@pytest.mark.parametrize("times, prompt, placed_for, calls", [
    # Short prompts: the prefill is under 1% of a request; its placements can't pay.
    ({(True, True): 1.0, (True, False): 0.1, (False, True): 1.0}, 16, "decode", 1),
    # A long prompt, 6 tokens out: the prefill's placements save 9 s, the decode pays 6.
    ({(True, True): 10.0, (True, False): 1.0, (False, True): 2.0}, 250, "prefill", 3),
    # ... but not when decoding on them costs more than that.
    ({(True, True): 10.0, (True, False): 1.0, (False, True): 3.0}, 250, "decode", 3),
    # ... nor when the decode program does not fit on them.
    ({(True, True): 10.0, (True, False): 1.0, (False, True): None}, 250, "decode", 3),
])
def test_the_weights_are_placed_for_the_program_that_shortens_a_request(times, prompt,
                                                                          placed_for, calls):
    log: list = []
    decode = _Program(step_time_s=1.0)
    made = with_prefill(decode, prompt, (torch.zeros(4, 1, dtype=torch.long),
                                         torch.zeros(1, dtype=torch.long)),
                        _programs(times, log))
    assert made.placed_for == placed_for and len(log) == calls
    prefill = times[(True, placed_for == "decode")]
    assert made.prefill_s == prefill and made.prefill_tokens == prompt
    decoded = 1.0 if placed_for == "decode" else times[(False, True)]
    assert request_s(made, 256 - prompt) == prefill + (256 - prompt) * decoded


def test_a_decode_plan_with_a_long_prompt_weighs_both_programs():
    served, inputs = _served()
    made = autopar.plan(served, MESH, inputs, training=False, prefill=250, time_limit=5.0)
    decode_first = autopar.plan(served, MESH, inputs, training=False, time_limit=5.0)
    assert made.placed_for in ("decode", "prefill") and made.prefill_tokens == 250
    # Never a longer request than the decode program's own placements give.
    pinned = autopar.plan(served, MESH, (torch.zeros(4, 250, dtype=torch.long, device="meta"),
                                         torch.arange(250, device="meta")),
                          training=False, constraints=pinned_state(decode_first),
                          time_limit=5.0)
    assert request_s(made, 6) <= pinned.step_time_s + 6 * decode_first.step_time_s + 1e-12


def test_a_decode_program_and_its_prefill_planned_as_one_problem_share_their_state():
    from autopar.passes.capturing.annotate import annotate
    from autopar.passes.capturing.capture import capture
    from autopar.passes.problem.edge_costs import Background
    from autopar.planning.joint import plan_both

    served, inputs = _served()
    prompt = (torch.zeros(4, 250, dtype=torch.long, device="meta"),
              torch.arange(250, device="meta"))
    gms = [annotate(capture(served, x, training=False)) for x in (inputs, prompt)]
    decode, prefill = plan_both(*gms, MESH, steps=6, memory_budget=BUDGET,
                                charges=Background(), time_limit=10.0, seed=0,
                                model_name="served")
    state = {n.name: n.output for n in decode.nodes if n.role in ("parameter", "buffer")}
    assert state and state == {n.name: n.output for n in prefill.nodes
                               if n.role in ("parameter", "buffer")}
    assert max(decode.peak_memory_bytes, prefill.peak_memory_bytes) <= BUDGET
    # No request is shorter with either program's own placements.
    alone = autopar.plan(served, MESH, inputs, training=False, memory_budget=BUDGET,
                         time_limit=5.0)
    pinned = autopar.plan(served, MESH, prompt, training=False, memory_budget=BUDGET,
                          constraints=pinned_state(alone), time_limit=5.0)
    together = prefill.step_time_s + 6 * decode.step_time_s
    assert together <= (pinned.step_time_s + 6 * alone.step_time_s) * (1 + 1e-6)


@pytest.mark.parametrize("joint, placed_for", [(0.5, "both"), (2.5, "prefill"), (None, "prefill")])
def test_the_programs_planned_as_one_are_kept_where_their_request_is_shortest(joint,
                                                                              placed_for):
    times = {(True, True): 10.0, (True, False): 1.0, (False, True): 2.0}

    def plan_both(inputs, steps, share):
        assert inputs[0].shape == (4, 250) and steps == 6 and share == pytest.approx(1 / 3)
        return None if joint is None else _Program(step_time_s=joint, prefill_s=1.0,
                                                   placed_for="both")

    made = with_prefill(_Program(step_time_s=1.0), 250,
                        (torch.zeros(4, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long)),
                        _programs(times, []), plan_both)
    assert made.placed_for == placed_for
