"""Training the corpus (`corpus_models`) on a mesh next to the single-process model.

Shared by the parent and the ranks. The parent plans each model on the mesh under a budget
of `BUDGET` times its replicated plan's peak (so the solver must shard), in one process,
and hands the plans to the ranks; each rank compiles its model with that plan and trains
`STEPS` AdamW steps. Rank 0 also trains the plain model and records, per step, both losses
and the gradient farthest from the plain model's under `autopar.tools.training.Tolerance`. All
ranks report the bytes their collectives moved and a digest of their replicated parameters
(which must agree across ranks: the check of random ops with DTensor semantics).

A model torch.export can't capture gets a `Failure` with autopar's error, not a crash.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass

import corpus_models
import torch

import autopar
from autopar.tools.training import Tolerance, training_loss, worst_gradient

SHAPE, AXES = (2, 2), ("dp", "tp")
# Memory per device, as a fraction of the replicated plan's peak: below 1 forces sharding.
BUDGET = 0.5
STEPS = 3
LEARNING_RATE = 5e-5  # see tests/runtime/equivalence_cases.py
TOLERANCE = Tolerance()
# Models planning must refuse with a CaptureError: those torch.export can't trace, and a
# size that depends on the data (boolean-mask indexing), which sharding needs static.
CAPTURE_FAILS = frozenset({*corpus_models.EXPORT_FAILS, "masked_token_loss"})


@dataclass(frozen=True)
class Planned:
    """What the parent learned planning one model: its plan, or the error autopar gave."""

    name: str
    plan: dict | None
    error: str | None = None


@dataclass(frozen=True)
class Step:
    loss: float
    reference_loss: float | None
    worst_param: str | None
    grad_abs_error: float | None
    grad_rel_error: float | None
    grad_excess: float | None


@dataclass(frozen=True)
class Trained:
    """One rank's run of one model."""

    name: str
    steps: tuple[Step, ...]
    measured: dict
    predicted: dict
    replicated_digest: str
    buffer_excess: float | None = None  # rank 0: the farthest buffer after the first step


def replicated_peak(name: str) -> float:
    model, inputs = corpus_models.build(name)
    return autopar.plan(model, autopar.Mesh((1,), ("x",), hardware="cpu"), inputs,
                        microbatches=1).peak_memory_bytes


def plan_model(name: str) -> Planned:
    """The model's plan on `SHAPE` under `BUDGET` of its replicated peak, or autopar's error
    (capture failures and the like: what a user would see)."""
    try:
        budget = BUDGET * replicated_peak(name)
        model, inputs = corpus_models.build(name)
        plan = autopar.plan(model, autopar.Mesh(SHAPE, AXES, hardware="cpu"), inputs,
                            memory_budget=budget, time_limit=15.0, microbatches=1)
    except autopar.AutoparError as error:
        return Planned(name, None, f"{type(error).__name__}: {error}")
    return Planned(name, plan.to_dict())


def _replicated_digest(pm) -> str:
    """A digest of the parameters this rank holds whole (placement R on every axis)."""
    digest = hashlib.sha256()
    for slot in pm.slots:
        if slot.role == "parameter" and all(p.is_replicate() for p in slot.placements):
            digest.update(slot.names[0].encode())
            digest.update(pm.value(slot).detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _buffer_excess(state: dict, reference: torch.nn.Module) -> float:
    """How far the compiled model's buffers (running statistics, counters) are from the
    plain model's, over `TOLERANCE` (above 1 fails). Taken after the first forward, while the
    parameters are still equal: later, AdamW moves a parameter whose true gradient is zero
    (a convolution's bias before batch norm) by +-lr on the sign of rounding noise, and the
    statistics of the next batch follow."""
    worst = 0.0
    buffers = dict(reference.named_buffers())
    for name in reference.state_dict():  # the persistent buffers, as full_state_dict has
        if name not in buffers:
            continue
        expected, got = buffers[name], state[name].to(buffers[name].dtype)
        difference = float((got - expected).abs().max()) if expected.numel() else 0.0
        scale = float(expected.abs().max()) if expected.numel() else 0.0
        worst = max(worst, TOLERANCE.excess(difference, scale))
    return worst


def train(rank: int, planned: Planned) -> Trained:
    torch.manual_seed(0)
    model, inputs = corpus_models.build(planned.name)
    reference = copy.deepcopy(model) if rank == 0 else None
    mesh = autopar.Mesh(SHAPE, AXES, hardware="cpu")
    pm = autopar.compile(model, mesh, inputs, plan=autopar.Plan.from_dict(planned.plan))
    optimizer = torch.optim.AdamW(pm.parameters(), lr=LEARNING_RATE)
    if reference is not None:
        reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=LEARNING_RATE)
    steps, buffer_excess = [], None
    torch.manual_seed(1)  # every rank alike: random ops draw the same global numbers
    for _ in range(STEPS):
        before = torch.get_rng_state()
        loss = training_loss(pm(*inputs))
        loss.backward()
        grads = pm.full_grads()  # collective
        step = Step(float(loss.detach()), None, None, None, None, None)
        if reference is not None:
            # The plain model from the same generator state, which is then put back where
            # the other ranks' is.
            after = torch.get_rng_state()
            torch.set_rng_state(before)
            expected = training_loss(reference(*inputs))
            torch.set_rng_state(after)
            expected.backward()
            relative, worst, absolute, excess = worst_gradient(grads, reference, TOLERANCE)
            step = Step(step.loss, float(expected.detach()), worst, absolute, relative,
                        excess)
            reference_optimizer.step()
            reference_optimizer.zero_grad()
        if not steps:
            state = pm.full_state_dict()  # collective
            buffer_excess = None if reference is None else _buffer_excess(state, reference)
        optimizer.step()
        optimizer.zero_grad()
        steps.append(step)
    return Trained(planned.name, tuple(steps), dict(pm.counter.totals()),
                   pm.plan.comm_bytes(), _replicated_digest(pm), buffer_excess)


def train_all(rank: int, planned: tuple[Planned, ...]) -> list[Trained]:
    """Every planned model in one launch (starting processes costs seconds)."""
    return [train(rank, p) for p in planned if p.plan is not None]
