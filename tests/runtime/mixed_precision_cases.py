"""Rank bodies of test_mixed_precision (module level, so spawned processes import them).

A `PrecisionCase` is an example model trained in reduced precision one of two ways:
- "master": the model converted to bfloat16, trained by `autopar.master_weights` (fp32
  master weights and AdamW states), planned with `master_weights=torch.float32`;
- "autocast": the float32 model run under `torch.autocast("cpu", torch.bfloat16)` (the
  casts and bf16 matmuls are in the captured graph), trained by plain AdamW.

Every rank compiles and trains it; rank 0 also trains the single-process model under the
same recipe (the same wrapper around the plain model) and records per step the loss of
both and, per parameter, two gradient errors: the largest entry difference over the
reference's largest entry (`max_errors`, as test_equivalence) and the norm of the
difference over the reference's norm (`norm_errors`). It also records what a wrong
collective would show under the same metrics (`wrong_errors`, see `_missing_half`).
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass

import torch
from equivalence_cases import side_by_side
from torch import nn

import autopar
from autopar.tools.training import gradient_errors

# A transformer learning rate at which master weights matter: an AdamW update (about lr per
# element) is below bf16's spacing for most weights (0.02 x 2^-8 ~ 8e-5 for init std 0.02
# is about lr; 1 x 2^-7 for norm weights), so a bf16 optimizer would lose much of it.
LEARNING_RATE = 1e-4


class Autocast(nn.Module):
    """`model` run under CPU autocast to bfloat16: its parameters stay float32, torch.export
    records the casts (`_to_copy`) and runs the matmuls in bf16."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.model(*args)


@dataclass(frozen=True)
class PrecisionCase:
    """One example (`build` its keyword arguments) trained by `recipe` ("master" or
    "autocast") for `steps` steps under `memory_budget` bytes per device."""

    example: str
    recipe: str
    build: tuple[tuple[str, object], ...] = ()
    memory_budget: float | None = None
    steps: int = 3

    def model(self) -> tuple[nn.Module, tuple]:
        module = importlib.import_module(self.example)
        if self.recipe == "master":
            return module.build(dtype=torch.bfloat16, **dict(self.build))
        assert self.recipe == "autocast", self.recipe
        model, inputs = module.build(**dict(self.build))
        return Autocast(model), inputs

    def plan_options(self) -> dict:
        """What the plan's memory counts: fp32 masters and states under "master"."""
        if self.recipe == "master":
            return {"optimizer": torch.optim.AdamW, "master_weights": torch.float32}
        return {}

    def optimizer(self, module: nn.Module):
        if self.recipe == "master":
            return autopar.master_weights(module, torch.optim.AdamW, dtype=torch.float32,
                                          lr=LEARNING_RATE)
        return torch.optim.AdamW(module.parameters(), lr=LEARNING_RATE)


@dataclass(frozen=True)
class PrecisionOutcome:
    """What one rank saw; the reference fields are None except on rank 0."""

    losses: tuple[float, ...]
    reference_losses: tuple[float, ...] | None
    max_errors: tuple[dict[str, float], ...] | None
    norm_errors: tuple[dict[str, float], ...] | None
    wrong_errors: tuple[float, float] | None  # (max, norm) metric of a wrong gradient
    measured: dict
    predicted: dict
    plan: dict
    code: str
    param_dtypes: tuple[str, ...]
    master_dtypes: tuple[str, ...]


def norm_errors(full: dict, reference: nn.Module) -> dict[str, float]:
    """Per parameter: |full grad - reference grad| / |reference grad| (Frobenius norms, in
    float32); inf where only one of them has a gradient."""
    errors = {}
    for name, param in reference.named_parameters():
        if param.grad is None or full[name] is None:
            errors[name] = 0.0 if param.grad is None and full[name] is None else float("inf")
            continue
        expected = param.grad.float()
        scale = float(expected.norm())
        diff = float((full[name].float() - expected).norm())
        errors[name] = diff / scale if scale > 0 else diff
    return errors


def _missing_half(reference: nn.Module, inputs: tuple) -> tuple[float, float]:
    """The worst (max-entry, norm) error over parameters of the gradient a rank holds
    before a data-parallel all-reduce that never ran (its half of the batch's summand of
    the mean loss), against the whole batch's gradient: what dropping one collective shows
    under these metrics. Leaves `reference`'s gradients as they were."""
    full = {name: None if p.grad is None else p.grad.clone()
            for name, p in reference.named_parameters()}
    half = copy.deepcopy(reference)
    half.zero_grad()
    rows = inputs[0].shape[0] // 2
    # The mean over half the rows, halved: that half's share of the mean over all rows.
    (half(*(x[:rows] for x in inputs)) / 2).backward()
    wrong = {name: p.grad for name, p in half.named_parameters()}
    for name, p in reference.named_parameters():
        p.grad = full[name]
    biggest = max(gradient_errors(wrong, reference).values())
    return biggest, max(norm_errors(wrong, reference).values())


def train(rank: int, case: PrecisionCase, mesh: autopar.Mesh) -> PrecisionOutcome:
    """Run `case` on this rank (under `autopar.launch`); see the module docstring."""
    torch.manual_seed(0)
    model, inputs = case.model()
    reference = copy.deepcopy(model) if rank == 0 else None
    pm = autopar.compile(model, mesh, inputs, memory_budget=case.memory_budget,
                         time_limit=3.0, microbatches=1, **case.plan_options())
    optimizer = case.optimizer(pm)
    reference_optimizer = case.optimizer(reference) if reference is not None else None
    losses, reference_losses, biggest, norms, wrong = [], [], [], [], None
    for loss, grads, expected in side_by_side(pm, optimizer, reference, reference_optimizer,
                                              inputs, case.steps):
        losses.append(float(loss.detach()))
        if expected is not None:
            reference_losses.append(float(expected.detach()))
            biggest.append(gradient_errors(grads, reference))
            norms.append(norm_errors(grads, reference))
            if wrong is None:
                wrong = _missing_half(reference, inputs)
    masters = getattr(optimizer, "masters", ())
    return PrecisionOutcome(
        tuple(losses), tuple(reference_losses) if reference is not None else None,
        tuple(biggest) if reference is not None else None,
        tuple(norms) if reference is not None else None, wrong,
        dict(pm.counter.totals()), pm.plan.comm_bytes(), pm.plan.to_dict(), pm.code,
        tuple(sorted({str(p.dtype) for p in pm.parameters()})),
        tuple(sorted({str(m.dtype) for m in masters})))


def train_all(rank: int, cases: tuple[PrecisionCase, ...], shape: tuple[int, ...],
              names: tuple[str, ...]) -> list[PrecisionOutcome]:
    """Every case in one launch (starting processes costs seconds)."""
    mesh = autopar.Mesh(shape, names, hardware="cpu")
    return [train(rank, case, mesh) for case in cases]


def replicated_peak(case: PrecisionCase) -> float:
    """Peak memory per device of `case`'s plan on one device (the recipe's optimizer state
    counted): a budget below it forces the solver to shard."""
    model, inputs = case.model()
    return autopar.plan(model, autopar.Mesh((1,), ("x",), hardware="cpu"), inputs,
                        **case.plan_options()).peak_memory_bytes
