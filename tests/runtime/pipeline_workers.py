"""Pipelined plans trained next to the single-process model (shared by the parent, which
plans, and the ranks, which train)."""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass

import torch

import autopar
from autopar.tools.training import Tolerance, worst_gradient

STEPS = 3
LEARNING_RATE = 5e-5  # see equivalence_cases: larger steps amplify rounding differences
CONFIG = {"batch": 8, "hidden": 64, "layers": 4}
# Per example, on top of CONFIG. The MoE's 4 experts split 2 per rank over a tp axis of 2;
# at capacity factor 1 some routing choices find their expert full in every micro-batch of
# 2 x 32 tokens (capacity 32), so each micro-batch's own capacity is what is checked.
BUILDS = {"moe": {"capacity_factor": 1.0}}
# Examples whose ops mix the samples of a batch (MoE routing with capacity, a loss over the
# batch's means): a forced pipeline trains them by gradient accumulation over its
# micro-batches, so that is the reference.
ACCUMULATED = frozenset({"moe"})


@dataclass(frozen=True)
class Case:
    example: str
    shape: tuple[int, ...]
    axes: tuple[str, ...]
    schedule: str
    microbatches: int = 4
    # Memory per device as a fraction of the unconstrained pipelined plan's peak (below 1
    # makes the stages shard over the other axes).
    budget: float | None = None

    @property
    def accumulates(self) -> bool:
        return self.example in ACCUMULATED


def build(case: Case):
    return importlib.import_module(f"examples.{case.example}").build(
        **CONFIG, **BUILDS.get(case.example, {}))


def reference_loss(reference: torch.nn.Module, inputs: tuple, case: Case,
                   scale: float = 1.0) -> torch.Tensor:
    """The single-process model's loss of one step, detached, its gradients times `scale`
    added to `.grad` when grad mode is on: the whole batch's, or for a model that mixes
    samples the gradient accumulation over the case's micro-batches (each micro-batch's loss
    over their count, backward, summed)."""
    if not case.accumulates:
        parts = [(reference(*inputs), 1.0)]
    else:
        count = case.microbatches
        parts = [(reference(*chunk), 1.0 / count)
                 for chunk in zip(*(t.chunk(count, 0) for t in inputs))]
    total = torch.zeros(())
    for loss, weight in parts:
        if torch.is_grad_enabled():
            (loss * (weight * scale)).backward()
        total = total + loss.detach() * weight
    return total


def plan_case(case: Case) -> dict:
    model, inputs = build(case)
    mesh = autopar.Mesh(case.shape, case.axes, hardware="cpu")
    pipeline = autopar.Pipeline(schedule=case.schedule, microbatches=case.microbatches)
    plan = autopar.plan(model, mesh, inputs, pipeline=pipeline, time_limit=5.0)
    if case.budget is not None:
        plan = autopar.plan(model, mesh, inputs, pipeline=pipeline, time_limit=5.0,
                            memory_budget=case.budget * plan.peak_memory_bytes)
    return plan.to_dict()


@dataclass(frozen=True)
class Trained:
    losses: tuple[tuple[float, float], ...]  # (compiled, plain) per step
    grad_excess: tuple[float, ...]  # the worst gradient over the tolerance, per step
    measured: dict
    predicted: dict
    evaluated: tuple[float, float]  # (compiled, plain) loss under torch.no_grad()
    scaled_excess: float  # worst gradient of (2 * loss).backward() over the tolerance
    warnings: tuple[str, ...]  # the plan's


def train(rank: int, case: Case, plan: dict) -> Trained:
    torch.manual_seed(0)
    model, inputs = build(case)
    reference = copy.deepcopy(model)
    mesh = autopar.Mesh(case.shape, case.axes, hardware="cpu")
    pm = autopar.compile(model, mesh, inputs, plan=autopar.Plan.from_dict(plan))
    optimizer = torch.optim.AdamW(pm.parameters(), lr=LEARNING_RATE)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=LEARNING_RATE)
    losses, excess = [], []
    for _ in range(STEPS):
        loss = pm(*inputs)
        loss.backward()
        grads = pm.full_grads()  # collective
        expected = reference_loss(reference, inputs, case)
        excess.append(worst_gradient(grads, reference, Tolerance())[3])
        losses.append((float(loss.detach()), float(expected.detach())))
        for opt in (optimizer, reference_optimizer):
            opt.step()
            opt.zero_grad()
    pipeline_rank = pm.coordinate[mesh.axis_index("pp")]
    measured, predicted = dict(pm.counter.totals()), pm.plan.comm_bytes(pipeline_rank)
    with torch.no_grad():  # the schedule's forwards only
        evaluated = (float(pm(*inputs)), float(reference_loss(reference, inputs, case)))
    (2 * pm(*inputs)).backward()  # the backward honours the gradient it receives
    grads = pm.full_grads()
    reference_loss(reference, inputs, case, scale=2.0)
    scaled = worst_gradient(grads, reference, Tolerance())[3]
    return Trained(tuple(losses), tuple(excess), measured, predicted, evaluated, scaled,
                   pm.plan.warnings)


def train_all(rank: int, cases: tuple[Case, ...], plans: tuple[dict, ...]) -> list[Trained]:
    return [train(rank, case, plan) for case, plan in zip(cases, plans)]
