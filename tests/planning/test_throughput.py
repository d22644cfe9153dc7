"""objective="throughput": the batch of a decode program and its plan serving the most
tokens a second (`autopar.planning.throughput`)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import autopar
from autopar.errors import InfeasiblePlanError, PlanningError
from autopar.planning.deadline import Deadline
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
    # 100); then halving to the first that fits, and its double was already refused.
    assert log == [2, 64, 32, 16]
    assert dict(made.serving) == {2: pytest.approx(2 / (1 + 2 / 64)), 16: 16 / 1.25,
                                  32: 0.0, 64: 0.0}

    def finish(plan: _Made, batch: int) -> _Made:
        if batch == 16:
            raise InfeasiblePlanError("prefill too big", expected="", got="", fix="")
        return plan

    made = most_tokens(_planner(24, []), 2, Deadline(60.0), finish)
    assert made.peak_memory_bytes == 2 and dict(made.serving)[16] == 0.0


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
