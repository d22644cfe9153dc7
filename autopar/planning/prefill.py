"""A decode plan's prefill: the program that runs whole prompts into the KV cache, planned
with every weight and cache buffer pinned where the decode plan stores them, and cut into
the same pipeline stages where it is pipelined (`prefill_layout`), as
`autopar.compile_prefill` compiles it, so that the two programs hold one copy of both.
Its latency is the predicted time to first token, and its peak is held to the same budget
as the decode program's: a decode plan whose prefill does not fit is refused
(`InfeasiblePlanError`, from the prefill's own planning).

Where the weights and the cache go is chosen for both programs (`with_prefill`), by the
time of a request: its prefill, then a token per step until its cache is full,

    request = prefill + (positions - prompt) x decode step.

The decode program runs that many times, so its own best placements usually win; but
with long prompts and short outputs, the prefill's may. So when the prefill (planned on the
decode plan's placements) is more than `PREFILL_SHARE` of the request, the prefill is
also planned freely, the decode program pinned to its placements, and, unless the decode
program is pipelined, both are planned as one problem (`autopar.planning.joint`); the pair
with the shortest request is kept (`Plan.placed_for` says whose placements they are:
"decode", "prefill" or "both"). Below that share, no placement of the prefill could
shorten the request by more than it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import torch

from autopar.errors import InfeasiblePlanError, PlanningError
from autopar.values.pipeline import Pipeline
from autopar.values.plan import Plan

PREFILL_SHARE = 0.01
# The plans past the first (a free prefill, the decode program on its placements, both
# as one problem) share one time limit: the prefill's.
EXTRA_PLANS = 3


def check_prefill(prefill: object, example_inputs: tuple, training: bool) -> int | None:
    """The prompt length to plan a prefill for (None: none); `PlanningError`, before any
    planning, unless `prefill` is None or a positive int and the plan is a forward-only
    one of a decode program (`decode_shape`)."""
    if prefill is None:
        return None
    if isinstance(prefill, bool) or not isinstance(prefill, int) or prefill < 1 or training:
        raise PlanningError("prefill is the prompt length of a forward-only decode plan",
                            expected="a positive int, with training=False",
                            got=f"prefill={prefill!r}, training={training!r}",
                            fix="plan the decode program with training=False, prefill=<prompt "
                                "tokens per sequence>")
    decode_shape(example_inputs)
    return prefill


def decode_shape(example_inputs: tuple) -> int:
    """The batch of a decode program's inputs `(ids (B, 1), position (1,))`, a
    `CachedLM`'s; `PlanningError` for other inputs."""
    ids, position = (tuple(example_inputs) + (None, None))[:2]
    if len(example_inputs) != 2 or not all(isinstance(t, torch.Tensor) for t in (ids, position)) \
            or ids.ndim != 2 or ids.shape[1] != 1 or tuple(position.shape) != (1,):
        raise PlanningError("a prefill is planned for a decode program",
                            expected="example inputs (ids of shape (B, 1), position of shape "
                                     "(1,)) of an autopar.CachedLM",
                            got=f"{len(example_inputs)} inputs",
                            fix="wrap the model in autopar.CachedLM and plan one token per "
                                "sequence, or leave prefill out")
    return int(ids.shape[0])


def prefill_layout(decode: Plan) -> Pipeline | bool:
    """How the prefill of `decode` runs: without a pipeline (False), or cut where the
    decode plan's stages are cut, under its schedule (each stage's weights and cache stay
    on the pipeline ranks that hold them)."""
    record = decode.pipeline
    if record is None:
        return False
    return Pipeline(axis=record.axis, schedule=record.schedule,
                    cuts=tuple(stage.units[0] for stage in record.stages[1:]))


def pinned_state(decode: Plan) -> dict[str, str]:
    """Where `decode` stores each weight and buffer, by graph node (both captures name a
    weight's or buffer's placeholder alike), one placement per mesh axis: the prefill's
    constraints. (A pipeline over a mesh of one axis plans its stages on a sub-mesh of one
    device of its own, whose placement its nodes carry after the pipeline axis'.)"""
    axes = decode.mesh.ndim
    return {node.name: ",".join(node.output.split(",")[:axes]) for node in decode.nodes
            if node.role in ("parameter", "buffer")}


def with_prefill(decode: Plan, prompt_length: int, example_inputs: tuple,
                 plan_forward: Callable[[tuple, Mapping[str, str], Pipeline | bool, float],
                                        Plan],
                 plan_both: Callable[[tuple, int, float], Plan | None] | None = None
                 ) -> Plan:
    """`decode` with its prefill of `prompt_length` tokens per sequence, or the decode
    program replanned where that makes a request shorter (module docstring):
    `plan_forward(inputs, constraints, pipeline, share)` plans the same model forward-only
    at `inputs` with `constraints` pinned, pipelined as `pipeline` says, within `share` of
    the prefill's time limit (the plans past the first share one limit, `EXTRA_PLANS`
    ways); `plan_both(inputs, steps, share)`, where given, plans an unpipelined decode
    program and its prefill at `inputs` as one problem (`autopar.planning.joint`): the
    decode plan with its prefill, or None."""
    ids, _ = example_inputs
    positions = decode.kv_cache_tokens // ids.shape[0]
    if not 1 <= prompt_length <= positions:
        raise PlanningError("the prompt must fit the KV cache",
                            expected=f"a prefill of at most the cache's {positions} positions",
                            got=f"prefill={prompt_length}",
                            fix="a shorter prompt, or a CachedLM with a larger max_len")
    inputs = (torch.zeros(ids.shape[0], prompt_length, dtype=ids.dtype, device=ids.device),
              torch.arange(prompt_length, device=ids.device))
    layout = prefill_layout(decode)
    steps = positions - prompt_length
    prefill = plan_forward(inputs, pinned_state(decode), layout, 1.0)
    kept = _prefilled(decode, prefill, prompt_length)
    if prefill.step_time_s <= PREFILL_SHARE * request_s(kept, steps):
        return kept
    candidates = [kept]
    try:
        free = plan_forward(inputs, {}, layout, 1 / EXTRA_PLANS)
        other = _prefilled(plan_forward(example_inputs, pinned_state(free), layout,
                                        1 / EXTRA_PLANS), free, prompt_length)
        candidates.append(dataclasses.replace(other, placed_for="prefill"))
    except InfeasiblePlanError:
        pass
    if plan_both is not None and decode.pipeline is None:
        both = plan_both(inputs, steps, 1 / EXTRA_PLANS)
        candidates += [both] if both is not None else []
    return min(candidates, key=lambda plan: request_s(plan, steps))


def request_s(plan: Plan, steps: int) -> float:
    """Predicted seconds of a request on a decode `plan` with its prefill: the prompt,
    then `steps` tokens."""
    return plan.prefill_s + steps * plan.step_time_s


def _prefilled(decode: Plan, prefill: Plan, prompt_length: int) -> Plan:
    return dataclasses.replace(decode, prefill_tokens=prompt_length,
                               prefill_s=prefill.step_time_s,
                               prefill_peak_bytes=prefill.peak_memory_bytes)
