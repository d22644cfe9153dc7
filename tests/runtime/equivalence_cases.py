"""Training runs compared with the single-process model, shared by the parent and the ranks.

A case names an example model (from `examples/`, or any module with `build()`), the
keyword arguments of its `build`, and how the plan is made (a memory budget that forces
sharding, pinned placements, or a whole plan). Every rank compiles the model and trains it
for a few AdamW steps; rank 0 also trains the plain model, and reports per step the loss
of both and, per parameter, the largest gradient difference relative to the reference's
largest gradient entry. All ranks report the bytes their collectives moved.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass, field

import torch

import autopar
from autopar.runtime.collectives import Collective
from autopar.tools.training import gradient_errors

# AdamW at lr 5e-5 (the scale of transformer training). Its normalised update g/sqrt(v)
# amplifies the rounding differences of a reordered fp32 sum (about 1e-7 relative on the
# first step) roughly tenfold per step, in proportion to the learning rate: at 1e-4 the
# worst gradient after three steps was 6.5e-6, too close to the tolerance.
LEARNING_RATE = 5e-5
# Relative tolerance of losses and gradients (see test_equivalence for the reasoning).
TOLERANCE = 1e-5


@dataclass(frozen=True)
class Case:
    """One model trained under one plan. `plan` is a `Plan.to_dict()` (or None to plan with
    `memory_budget` and `constraints` on rank 0)."""

    example: str
    build: tuple[tuple[str, object], ...] = ()
    memory_budget: float | None = None
    constraints: tuple[tuple[str, str], ...] = ()
    plan: dict | None = field(default=None, compare=False)
    steps: int = 3

    def model(self):
        module = importlib.import_module(self.example)
        return module.build(**dict(self.build))


@dataclass(frozen=True)
class Outcome:
    """What one rank saw: per step (loss, reference loss, {param: relative grad error});
    the reference entries are None except on rank 0."""

    losses: tuple[float, ...]
    reference_losses: tuple[float, ...] | None
    grad_errors: tuple[dict[str, float], ...] | None
    measured: dict
    predicted: dict
    plan: dict
    code: str
    loss_type: str  # the class of the compiled model's loss (PendingSum while in flight)
    # Edges whose gradient reduce-scatter runs in the background (`Collective.kept_gathered`).
    kept_gathered: int = 0


def side_by_side(pm, optimizer, reference, reference_optimizer, inputs: tuple, steps: int):
    """Train `pm` and, on the rank that holds one, the plain `reference` on `inputs` for
    `steps` steps. Yields, each step, `pm`'s loss, its full gradients (collective: every
    rank must consume the generator) and the reference's loss (None without one), while
    both models hold that step's gradients; then both optimizers step."""
    for _ in range(steps):
        loss = pm(*inputs)
        loss.backward()
        grads = pm.full_grads()
        expected = None
        if reference is not None:
            expected = reference(*inputs)
            expected.backward()
        yield loss, grads, expected
        optimizer.step()
        optimizer.zero_grad()
        if reference is not None:
            reference_optimizer.step()
            reference_optimizer.zero_grad()


def train(rank: int, case: Case, mesh: autopar.Mesh) -> Outcome:
    """Run `case` on this rank (under `autopar.launch`); see the module docstring."""
    torch.manual_seed(0)
    model, inputs = case.model()
    reference = copy.deepcopy(model) if rank == 0 else None
    plan = autopar.Plan.from_dict(case.plan) if case.plan is not None else None
    # The step whole: micro-batched plans have their own cases (test_microbatch_equivalence).
    pm = autopar.compile(model, mesh, inputs, plan=plan, memory_budget=case.memory_budget,
                         constraints=dict(case.constraints) or None, time_limit=3.0,
                         microbatches=1)
    optimizer = torch.optim.AdamW(pm.parameters(), lr=LEARNING_RATE)
    losses, reference_losses, errors, loss_types = [], [], [], set()
    reference_optimizer = (torch.optim.AdamW(reference.parameters(), lr=LEARNING_RATE)
                           if reference is not None else None)
    for loss, grads, expected in side_by_side(pm, optimizer, reference, reference_optimizer,
                                              inputs, case.steps):
        loss_types.add(type(loss).__name__)
        losses.append(float(loss.detach()))
        if expected is not None:
            reference_losses.append(float(expected.detach()))
            errors.append(gradient_errors(grads, reference))
    return Outcome(tuple(losses), tuple(reference_losses) if reference else None,
                   tuple(errors) if reference else None,
                   dict(pm.counter.totals()), pm.plan.comm_bytes(), pm.plan.to_dict(),
                   pm.code, "/".join(sorted(loss_types)),
                   sum(isinstance(m, Collective) and m.kept_gathered for m in pm.modules()))


def train_all(rank: int, cases: tuple[Case, ...], shape: tuple[int, ...],
              names: tuple[str, ...], hardware: str | list = "cpu",
              shares: tuple | None = None) -> list[Outcome]:
    """Every case in one launch (starting processes costs seconds), on a mesh of
    `hardware` (a list: one kind per device) cut by `shares`."""
    mesh = autopar.Mesh(shape, names, hardware=hardware, shares=shares)
    return [train(rank, case, mesh) for case in cases]


def check_equivalence(cases: tuple[Case, ...], results: list[list[Outcome]]) -> None:
    """Rank 0's losses and gradients match the plain model's at every step within
    `TOLERANCE`, and every rank returned the same (global) losses."""
    for index, (case, outcome) in enumerate(zip(cases, results[0])):
        for step, (loss, expected) in enumerate(zip(outcome.losses,
                                                    outcome.reference_losses)):
            assert abs(loss - expected) <= TOLERANCE * abs(expected), (case, step)
        for step, errors in enumerate(outcome.grad_errors):
            worst = max(errors, key=errors.get)
            assert errors[worst] <= TOLERANCE, (case, step, worst, errors[worst])
        assert all(r[index].losses == outcome.losses for r in results), case


def check_sharded(cases: tuple[Case, ...], results: list[list[Outcome]]) -> None:
    """Every plan stores some parameter split and communicates: a replicated plan would
    make the equivalence trivial."""
    for case, outcome in zip(cases, results[0]):
        plan = autopar.Plan.from_dict(outcome.plan)
        assert [n for n in plan.nodes if n.role == "parameter" and "S(" in n.output], case
        assert plan.comm_bytes(), case


def check_bytes(cases: tuple[Case, ...], results: list[list[Outcome]], *,
                uneven: bool = False) -> None:
    """On every rank, the bytes moved per (kind, axis, direction) equal the plan's
    prediction times the steps, exactly. With `uneven` pieces, on rank 0, which holds the
    longest pieces (the plan's figures are its), and no more on the others."""
    for rank, per_rank in enumerate(results):
        for case, outcome in zip(cases, per_rank):
            predicted = {key: value * case.steps for key, value in outcome.predicted.items()}
            differ = {key: (outcome.measured.get(key, 0), predicted.get(key, 0))
                      for key in set(predicted) | set(outcome.measured)
                      if outcome.measured.get(key, 0) != predicted.get(key, 0)
                      and not (uneven and rank and 0 < outcome.measured.get(key, 0)
                               <= predicted.get(key, 0))}
            assert not differ, (case.example, rank, "(measured, predicted):", differ)


def replicated_peak(case: Case) -> float:
    """Peak memory per device of the plan that keeps `case`'s model whole (one device): a
    budget below it forces the solver to shard."""
    model, inputs = case.model()
    return autopar.plan(model, autopar.Mesh((1,), ("x",), hardware="cpu"),
                        inputs).peak_memory_bytes
