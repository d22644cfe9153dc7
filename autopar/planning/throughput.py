"""A serving plan's objective: the latency of one step, or the tokens a second it serves.

A decode program of a `CachedLM` at batch B gives every one of its B sequences a token
per step, so a plan whose step takes t(B) serves

    throughput(B) = B / t(B)  tokens a second.

t grows slower than B: every step reads each weight once, whatever B, and only the cache's
reads and the compute grow with it. So throughput rises with B until the KV cache fills
the memory budget, or the step turns compute-bound and B / t(B) levels off: what a serving
engine does with the memory left after the weights (vLLM: as many cache tokens as fit).

`objective="throughput"` plans the model's decode program at power-of-two multiples of
B0 (the example inputs' batch, up to `MAX_DOUBLINGS` doublings), each batch planned for its
own step, hence free to place the weights and the cache its own way (more sequences
favour a cache split over more devices). After B0, the largest batch its plan's memory
suggests fits (everything but the weights growing per sequence); above a batch that fits,
its double; between one that fits and one that does not, the middle in doublings, until
they are one doubling apart. The plan kept is the batch serving the most tokens a second,
with every batch tried and its figure (`Plan.serving`).

The batches share the call's time limit: each gets its part of what is left, as if
`EXPECTED_BATCHES` were to be planned. Once it is spent, a search upwards stops, but a
bisection runs its last few steps (at most four, over twelve doublings): stopping there
would keep a batch far below what fits.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from torch import nn

from autopar.errors import InfeasiblePlanError, PlanningError
from autopar.planning.deadline import Deadline
from autopar.planning.prefill import decode_shape
from autopar.values.plan import Plan

OBJECTIVES = ("latency", "throughput")
MAX_DOUBLINGS = 12
EXPECTED_BATCHES = 4


def check_objective(objective: object, training: bool, model: nn.Module,
                    example_inputs: tuple) -> str:
    """`objective` itself; `PlanningError`, before any planning, unless it is "latency",
    or "throughput" for a forward-only plan of a decode program that can be `resized` to
    another batch (`autopar.CachedLM`) on the meta device (each batch tried is a cache of
    its own: on the meta device it takes no memory)."""
    if objective not in OBJECTIVES:
        raise PlanningError("objective must be 'latency' or 'throughput'",
                            expected=" or ".join(map(repr, OBJECTIVES)), got=repr(objective),
                            fix="leave the default 'latency', or pass objective='throughput' "
                                "to a serving plan")
    if objective == "latency":
        return objective
    weights = next(iter(model.parameters()), None)
    if training or not callable(getattr(model, "resized", None)) or weights is None \
            or weights.device != torch.device("meta"):
        raise PlanningError(
            "objective='throughput' chooses how many sequences a decode program serves at "
            "once, so it plans an autopar.CachedLM on the meta device with training=False",
            expected="training=False, an autopar.CachedLM whose weights are on the meta device",
            got=f"training={training!r}, a {type(model).__name__} on "
                f"{'no device' if weights is None else weights.device}",
            fix="build the model under torch.device('meta'), wrap it in autopar.CachedLM and "
                "pass training=False; then compile a CachedLM of the batch the plan chose")
    decode_shape(example_inputs)
    return objective


def most_tokens(plan_batch: Callable[[int, Deadline], Plan], batch: int,
                deadline: Deadline,
                finish: Callable[[Plan, int], Plan] = lambda made, batch: made) -> Plan:
    """The plan serving the most tokens a second of those `plan_batch(b, deadline)` makes
    for the batches `_next_batch` picks (module docstring), completed by `finish(plan, b)`
    (the prefill), marked with the objective and the batches tried. A batch whose plan or
    `finish` raises `InfeasiblePlanError` does not fit (and the search goes on below it);
    the given `batch` not fitting raises as a latency plan would: nothing to serve."""
    served: dict[int, float] = {}
    plans: dict[int, Plan] = {}
    size: int | None = batch
    while True:
        while size is not None:
            part = Deadline(deadline.left() / max(1, EXPECTED_BATCHES - len(served)))
            try:
                plans[size] = plan_batch(size, part)
                served[size] = size / plans[size].step_time_s
            except InfeasiblePlanError:
                if size == batch:
                    raise
                served[size] = 0.0
            finally:
                deadline.charge(part.allotted, optimal=False)
            size = _next_batch(batch, plans, served, late=deadline.passed())
        best = max(plans, key=served.__getitem__)
        try:
            kept = finish(plans[best], best)
        except InfeasiblePlanError:
            if best == batch:
                raise
            served[best] = 0.0
            del plans[best]
            size = _next_batch(batch, plans, served, late=deadline.passed())
            continue
        return dataclasses.replace(kept, objective="throughput",
                                   serving=tuple(sorted(served.items())))


def _next_batch(batch: int, plans: dict[int, Plan], served: dict[int, float], *,
                late: bool) -> int | None:
    """The next batch to plan (None: done), a power-of-two multiple of `batch`, at most
    `MAX_DOUBLINGS` doublings of it: after the given batch alone, the largest that its
    plan's memory suggests holds (`_fitting`); then, once one has not fitted, the middle
    (in doublings) between it and the largest that did, until they are one doubling apart;
    else twice the largest that fitted, unless the call is `late` (its time spent: a
    bisection still runs its few steps, a search upwards stops)."""
    top = batch << MAX_DOUBLINGS
    if len(served) == 1:
        guess = batch << max(0, int(math.log2(max(_fitting(plans[batch], batch), batch)
                                              / batch)))
        return min(guess, top) if guess > batch else None if late else batch * 2
    fitted = max(plans)
    failed = min((size for size, tokens in served.items() if not tokens), default=None)
    if failed is None:
        return fitted * 2 if fitted < top and not late else None
    apart = int(math.log2(failed // fitted))
    return fitted << (apart // 2) if apart > 1 else None


def _fitting(made: Plan, batch: int) -> float:
    """The batch that would fill the memory budget if everything but the weights grew
    with the sequences as it does from none to `batch` in `made` (the cache does; one
    forward's activations mostly do), or, where the weights are not all on one device (a
    pipeline's stages), the cache alone. An overestimate only where a larger batch's plan
    splits more of them, which the search's halving then corrects."""
    weights = sum(node.memory_bytes for node in made.nodes if node.role == "parameter")
    if made.pipeline is not None or not 0 <= weights < made.peak_memory_bytes:
        weights = made.peak_memory_bytes - made.kv_cache_bytes
    per_sequence = (made.peak_memory_bytes - weights) / batch
    if per_sequence <= 0:
        return float(batch)
    return (made.memory_limit_bytes - weights) / per_sequence
