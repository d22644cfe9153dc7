"""Training interrupted by a checkpoint and resumed under another plan (shared by the
parent, which plans, and the ranks, which train)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

import autopar
from autopar.tools import checkpoint

STEPS = 3  # before the save, and again after it
LEARNING_RATE = 5e-5  # as the equivalence tests: larger steps amplify rounding
# AdamW divides each gradient by its running magnitude: a gradient that is zero but for
# rounding (a key projection's bias: softmax ignores it) would step by lr on noise, whose
# sign depends on the order of a sum. An eps above that noise keeps such steps at noise.
EPS = 1e-6
CONFIG = {"batch": 8, "hidden": 64, "layers": 2}


@dataclass(frozen=True)
class Layout:
    """A mesh and the memory budget, a fraction of the unconstrained plan's peak (below 1
    makes the plan shard its state), or a forced pipeline."""

    shape: tuple[int, ...]
    axes: tuple[str, ...]
    budget: float | None = None
    pipeline: autopar.Pipeline | bool = False

    @property
    def ranks(self) -> int:
        return int(torch.Size(self.shape).numel())


def build(example: str, seed: int):
    torch.manual_seed(seed)
    return importlib.import_module(f"examples.{example}").build(**CONFIG)


def plan_for(example: str, layout: Layout, **options) -> dict:
    model, inputs = build(example, 0)
    mesh = autopar.Mesh(layout.shape, layout.axes, hardware="cpu")
    # 15 solver seconds for the whole call: the plans these cases were written for (moe's
    # plan at 5 s, with attention projections stored S(1) on dp, resumes 1e-7 apart from
    # the run it was saved from: docs/DESIGN.md, "Not yet built").
    plan = autopar.plan(model, mesh, inputs, time_limit=15.0, pipeline=layout.pipeline,
                        **options)
    if layout.budget is not None:
        plan = autopar.plan(model, mesh, inputs, time_limit=15.0, pipeline=layout.pipeline,
                            memory_budget=layout.budget * plan.peak_memory_bytes, **options)
    return plan.to_dict()


def _train(pm, optimizer, inputs, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        loss = pm(*inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def _compiled(example: str, layout: Layout, plan: dict, seed: int):
    model, inputs = build(example, seed)
    mesh = autopar.Mesh(layout.shape, layout.axes, hardware="cpu")
    pm = autopar.compile(model, mesh, inputs, plan=autopar.Plan.from_dict(plan))
    return pm, torch.optim.AdamW(pm.parameters(), lr=LEARNING_RATE, eps=EPS), inputs


def run_and_save(rank: int, example: str, layout: Layout, plan: dict, path: str,
                 async_save: bool = False) -> tuple[list[float], dict]:
    """STEPS steps, a save, STEPS more: the losses of all, and the final full state."""
    pm, optimizer, inputs = _compiled(example, layout, plan, 0)
    losses = _train(pm, optimizer, inputs, STEPS)
    pending = checkpoint.save(path, pm, optimizer, step=STEPS, extra={"example": example},
                              async_save=async_save)
    losses += _train(pm, optimizer, inputs, STEPS)
    pending.wait()
    return losses, {k: v.clone() for k, v in pm.full_state_dict().items()}


def uneven_round_trip(rank: int, path: str, shares: tuple | None = None,
                      async_save: bool = False) -> tuple[list[float], list[float], dict, dict,
                                                         dict]:
    """An MLP of 66 and 130 features on 4 ranks, its weights pinned split unevenly (130 rows
    in 4: 33, 33, 33, 31; or by `shares`): STEPS steps, a save, STEPS more; then a model
    initialised otherwise loads the checkpoint and trains STEPS steps. The losses after the
    save, the final full states of both, and the full state saved."""
    mesh = autopar.Mesh((4,), ("tp",), hardware="cpu", shares=shares)
    pins = {"fc1.weight": "S(0)", "fc2.weight": "S(1)", "fc1.bias": "S(0)"}

    def compiled(seed: int):  # weights drawn from `seed`, the data always from 0
        build_mlp = importlib.import_module("examples.mlp").build
        model, _ = build_mlp(hidden=66, ffn=130, seed=seed)
        _, inputs = build_mlp(hidden=66, ffn=130, seed=0)
        pm = autopar.compile(model, mesh, inputs, constraints=pins, time_limit=5.0)
        return pm, torch.optim.AdamW(pm.parameters(), lr=LEARNING_RATE, eps=EPS), inputs

    pm, optimizer, inputs = compiled(0)
    _train(pm, optimizer, inputs, STEPS)
    pending = checkpoint.save(path, pm, optimizer, step=STEPS, async_save=async_save)
    saved = {k: v.clone() for k, v in pm.full_state_dict().items()}
    after = _train(pm, optimizer, inputs, STEPS)
    pending.wait()
    state = {k: v.clone() for k, v in pm.full_state_dict().items()}
    pm, optimizer, inputs = compiled(1)
    checkpoint.load(path, pm, optimizer)
    resumed = _train(pm, optimizer, inputs, STEPS)
    return (after, resumed, state, {k: v.clone() for k, v in pm.full_state_dict().items()},
            saved)


def load_and_run(rank: int, example: str, layout: Layout, plan: dict, path: str
                 ) -> tuple[list[float], dict, int]:
    """A model initialised otherwise, the checkpoint loaded, STEPS steps: their losses,
    the final full state and the step the checkpoint says."""
    pm, optimizer, inputs = _compiled(example, layout, plan, 1)
    saved = checkpoint.load(path, pm, optimizer)
    losses = _train(pm, optimizer, inputs, STEPS)
    return losses, {k: v.clone() for k, v in pm.full_state_dict().items()}, saved.step
