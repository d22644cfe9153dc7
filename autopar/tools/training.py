"""Training a model file on a mesh of ranks, optionally checked against the plain model.

A `TrainingRun` is the whole configuration (picklable, so `autopar.launch` can send it).
Each rank calls `train_rank(rank, run)`: it builds the model from the file's `build()`,
compiles it for the mesh, runs `run.steps` AdamW steps on the example batch and returns a
`RankReport`: per step the loss, plus the bytes its collectives moved and what the plan
predicted. With `run.verify`, rank 0 also trains the single-process model from the same
weights and records per step the relative loss difference and the worst relative gradient
difference (`pm.full_grads()` is collective, so every rank gathers the gradients).

The rest are pure functions over those values: `communication_report` (measured against
predicted bytes), `format_step` (one line per step) and `verification_failures`.

    run = TrainingRun("examples/mlp.py", mesh=(2,), axis_names=("dp",), verify=True)
    reports = autopar.launch(train_rank, 2, run)
    print(communication_report(reports[0]))
    assert not verification_failures(reports[0].steps)
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from autopar.compiler import check_plan
from autopar.compiler import compile as compile_model
from autopar.errors import TrainingRunError
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.planning.entry import plan as make_plan
from autopar.runtime.counter import Key
from autopar.runtime.master_weights import master_weights
from autopar.tools import checkpoint
from autopar.tools.model_file import load_model_file
from autopar.tools.rounded_reference import (
    compressed_slots,
    rounded_weights,
    take_compressed,
    take_gathered,
)
from autopar.values.mesh import Mesh
from autopar.values.plan import Plan

# AdamW's normalised update amplifies the rounding differences of reordered fp32 sums
# (about 1e-7 relative on the first step) roughly tenfold per step, in proportion to the
# learning rate: at 5e-5 a correct plan stays a few 1e-6 after several steps, below
# `TOLERANCE`, while a wrong collective shows up at 1e-2 or more.
VERIFY_LEARNING_RATE = 5e-5
TOLERANCE = 1e-5
# A difference this small (absolute) always passes: a gradient whose true value is zero
# (a key bias under softmax, which is shift-invariant) is rounding noise of some 1e-9 on
# both sides, and relative to its own size that noise differs by 100%.
ABSOLUTE_TOLERANCE = 1e-6
LEARNING_RATE = 1e-3
# Under "bf16-master" every op rounds to bf16 (relative spacing 2^-8 = 3.9e-3) and a plan
# reorders the sums, so gradients differ by some 1e-2 of their largest entry after a few
# steps (tests/runtime/test_mixed_precision.py measures and argues it); a wrong collective
# still differs by about 1.
BF16_TOLERANCE = 0.1
# How the model trains: "fp32" as built, or "bf16-master": converted to bfloat16 (floating
# inputs too) and stepped by `autopar.master_weights` (fp32 masters and AdamW states),
# planned with `master_weights=torch.float32`.
PRECISIONS = ("fp32", "bf16-master")


@dataclass(frozen=True)
class Tolerance:
    """When a value of the compiled model matches the plain model's: a difference within
    `relative` of the reference tensor's largest entry, or within `absolute`.

        |got - expected|_max <= max(relative * |expected|_max, absolute)
    """

    relative: float = TOLERANCE
    absolute: float = ABSOLUTE_TOLERANCE

    def excess(self, difference: float, scale: float) -> float:
        """`difference` over what is allowed at `scale` (|expected|_max): above 1 fails;
        NaN counts as infinitely far."""
        allowed = max(self.relative * scale, self.absolute)
        ratio = difference / allowed if allowed > 0 else (0.0 if difference == 0 else
                                                          float("inf"))
        return ratio if ratio == ratio else float("inf")

    def describe(self) -> str:
        return f"{self.relative:g} relative or {self.absolute:g} absolute"


@dataclass(frozen=True)
class TrainingRun:
    """Everything a rank needs to train. `config` holds the `build()` keyword arguments;
    `tolerance` is what `verify` accepts (default: `Tolerance()`, or `BF16_TOLERANCE`
    relative under "bf16-master");
    `seed` seeds torch before the build (so builds drawing from torch's global generator
    give every rank the same weights) and the solver. `checkpoint_dir`,
    `checkpoint_every`, `resume`: see `train_rank`. `plan` is a `Plan.to_dict()`, or None
    to let rank 0 plan under `memory_budget` within `time_limit` seconds, with
    `microbatches`, `pipeline` and `compression` (`autopar.plan`'s; verifying a compressed
    plan applies the same rounding: `autopar.tools.rounded_reference`)."""

    model_file: str
    mesh: tuple[int, ...]
    axis_names: tuple[str, ...]
    config: tuple[tuple[str, object], ...] = ()
    hardware: str = "cpu"
    steps: int = 5
    lr: float = LEARNING_RATE
    seed: int = 0
    time_limit: float = 10.0
    memory_budget: float | None = None
    plan: dict | None = field(default=None, compare=False, repr=False)
    verify: bool = False
    precision: str = "fp32"
    microbatches: int | str = "auto"
    pipeline: object = "auto"
    tolerance: Tolerance | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    compression: object = None

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise TrainingRunError("unknown precision", expected=" or ".join(PRECISIONS),
                                   got=repr(self.precision), fix="e.g. --precision bf16-master")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise TrainingRunError("invalid number of training steps", expected="an int >= 1",
                                   got=repr(self.steps), fix="e.g. --steps 5")
        if not self.lr > 0:
            raise TrainingRunError("invalid learning rate", expected="a positive number",
                                   got=repr(self.lr), fix="e.g. --lr 5e-5")
        if self.checkpoint_dir is None and (self.checkpoint_every or self.resume):
            raise TrainingRunError("checkpoints asked for without a directory",
                                   expected="--checkpoint-dir DIR with --checkpoint-every or "
                                   "--resume", got="no --checkpoint-dir",
                                   fix="add --checkpoint-dir DIR")
        if self.checkpoint_dir is not None and self.precision == "bf16-master":
            raise TrainingRunError("checkpoints of bf16-master runs are not supported",
                                   expected="--precision fp32 with --checkpoint-dir",
                                   got="bf16-master (its fp32 master copies live in the "
                                   "optimizer wrapper)", fix="drop --checkpoint-dir")

    @property
    def accepted(self) -> Tolerance:
        """The tolerance verification applies."""
        if self.tolerance is not None:
            return self.tolerance
        if self.precision == "bf16-master":
            return Tolerance(relative=BF16_TOLERANCE)
        return Tolerance()

    def build_mesh(self) -> Mesh:
        return Mesh(self.mesh, self.axis_names, hardware=self.hardware)

    @property
    def master_weights(self) -> torch.dtype | None:
        """The dtype of the master copy the precision keeps (what the plan counts)."""
        return torch.float32 if self.precision == "bf16-master" else None

    def optimizer(self, module: nn.Module):
        """The AdamW that trains `module` (compiled or plain) under this precision."""
        if self.precision == "bf16-master":
            return master_weights(module, torch.optim.AdamW, dtype=torch.float32, lr=self.lr)
        return torch.optim.AdamW(module.parameters(), lr=self.lr)


@dataclass(frozen=True)
class StepRecord:
    """One training step as rank 0 saw it. The reference fields are None unless the run
    verifies: the plain model's loss, and the gradient farthest from the plain model's
    under the run's `Tolerance` (`worst_param`), with its largest difference relative to
    the reference gradient's largest entry (`grad_error`) and absolute (`grad_abs_error`),
    and how far that is past the tolerance (`grad_excess`, above 1 fails)."""

    step: int
    loss: float
    reference_loss: float | None = None
    grad_error: float | None = None
    worst_param: str | None = None
    grad_abs_error: float | None = None
    grad_excess: float | None = None

    @property
    def loss_error(self) -> float | None:
        """|loss - reference| relative to |reference|; None when not verifying."""
        if self.reference_loss is None:
            return None
        return _relative(abs(self.loss - self.reference_loss), abs(self.reference_loss))


@dataclass(frozen=True)
class RankReport:
    """What one rank returns: its steps, the bytes its collectives moved per key over the
    whole run, the plan's bytes per key for one step, and the plan's modelled step time."""

    rank: int
    steps: tuple[StepRecord, ...]
    measured: dict[Key, int]
    predicted_per_step: dict[Key, float]
    step_time_s: float


def _relative(diff: float, scale: float) -> float:
    return diff / scale if scale > 0 else diff


def build(run: TrainingRun) -> tuple[nn.Module, tuple]:
    """The model and example inputs of `run.model_file`, the same on every rank."""
    torch.manual_seed(run.seed)
    model, inputs = load_model_file(run.model_file, **dict(run.config))
    if run.precision == "bf16-master":
        # Token ids and other integer inputs stay as they are; float inputs meet bf16 weights.
        model = model.to(torch.bfloat16)
        inputs = tuple(x.to(torch.bfloat16) if isinstance(x, torch.Tensor)
                       and x.is_floating_point() else x for x in inputs)
    return model, inputs


def plan_run(run: TrainingRun, progress: Callable[[str], None] | None = None) -> Plan:
    """The plan the ranks will run: `run.plan` if given (checked against the model, its
    inputs and the mesh), else one made here (no process group needed), so that planning
    errors and a plan of another model surface before any rank starts."""
    model, inputs = build(run)
    if run.plan is not None:
        plan = Plan.from_dict(run.plan)
        check_plan(plan, annotate(capture(model, inputs)), inputs, run.build_mesh())
        return plan
    return make_plan(model, run.build_mesh(), inputs, memory_budget=run.memory_budget,
                     time_limit=run.time_limit, seed=run.seed,
                     master_weights=run.master_weights, microbatches=run.microbatches,
                     pipeline=run.pipeline, compression=run.compression, progress=progress)


def _differences(full: dict, reference: nn.Module):
    """Per parameter of `reference` (after its backward): (name, largest difference of
    `full[name]` from its gradient, that gradient's largest entry). The difference is inf
    where only one of the two has a gradient, 0 where neither has."""
    for name, param in reference.named_parameters():
        got = full[name]
        if param.grad is None or got is None:
            yield name, 0.0 if param.grad is None and got is None else float("inf"), 0.0
        else:
            yield (name, float((got - param.grad).abs().max()),
                   float(param.grad.abs().max()))


def gradient_errors(full: dict, reference: nn.Module) -> dict[str, float]:
    """Per parameter of `reference` (after its backward), the largest difference of
    `full[name]` (the compiled model's full gradient, or None) from its gradient, relative
    to that gradient's largest entry; inf where only one of the two has a gradient."""
    return {name: _relative(difference, scale)
            for name, difference, scale in _differences(full, reference)}


def worst_gradient(full: dict, reference: nn.Module, tolerance: Tolerance,
                   ) -> tuple[float, str | None, float, float]:
    """(relative difference, parameter, absolute difference, excess over `tolerance`) of
    the gradient farthest from the plain model's."""
    worst = (0.0, None, 0.0, 0.0)
    for name, difference, scale in _differences(full, reference):
        excess = tolerance.excess(difference, scale)
        if worst[1] is None or excess > worst[3]:
            worst = (_relative(difference, scale), name, difference, excess)
    return worst


def train_rank(rank: int, run: TrainingRun, *,
               on_step: Callable[[StepRecord], None] | None = None,
               on_compiled: Callable[[Plan], None] | None = None) -> RankReport:
    """Train `run` on this rank; collective (every rank of the mesh calls it, under
    `autopar.launch` or torchrun, or alone on a mesh of one device). `on_compiled` gets the
    plan once compiled, `on_step` each step's record as it completes. With
    `checkpoint_dir`, every `checkpoint_every` steps and after the last the run saves
    (`autopar.checkpoint`, asynchronously but for the last; the next save waits for the
    one before), and with `resume` it starts after the latest committed checkpoint there,
    whatever plan or mesh saved it."""
    model, inputs = build(run)
    # Copied before compiling: the compiled model takes over the parameters.
    reference = copy.deepcopy(model) if run.verify and rank == 0 else None
    plan = Plan.from_dict(run.plan) if run.plan is not None else None
    pm = compile_model(model, run.build_mesh(), inputs, plan=plan,
                       memory_budget=run.memory_budget, time_limit=run.time_limit,
                       seed=run.seed, master_weights=run.master_weights,
                       microbatches=run.microbatches, pipeline=run.pipeline,
                       compression=run.compression)
    if on_compiled is not None:
        on_compiled(pm.plan)
    optimizer = run.optimizer(pm)
    reference_optimizer = run.optimizer(reference) if reference is not None else None
    first = _first_step(run, pm, optimizer, reference, reference_optimizer)
    pending = None
    records = []
    for step in range(first, run.steps + 1):
        loss = training_loss(pm(*inputs))
        loss.backward()
        record = StepRecord(step, float(loss.detach()))
        grads = pm.full_grads() if run.verify else None  # collective: every rank calls it
        optimizer.step()
        optimizer.zero_grad()
        if reference is not None:
            record = _verified(record, reference, reference_optimizer, inputs, grads,
                               run.accepted, pm)
        records.append(record)
        if on_step is not None:
            on_step(record)
        pending = _checkpointed(run, step, pm, optimizer, pending)
    if pending is not None:
        pending.wait()
    return RankReport(rank, tuple(records), dict(pm.counter.totals()),
                      pm.plan.rank_comm_bytes(pm.coordinate),
                      pm.plan.step_time_s)


def _first_step(run: TrainingRun, pm, optimizer, reference: nn.Module | None,
                reference_optimizer) -> int:
    """The step to train first: 1, or with `run.resume` the one after the latest committed
    checkpoint, which is loaded into `pm` and `optimizer` (and the plain `reference` and its
    optimizer, when verifying)."""
    first = 1
    resumed = checkpoint.latest(run.checkpoint_dir) if run.resume else None
    if resumed is not None:
        first = checkpoint.load(resumed, pm, optimizer).step + 1
        if reference is not None:
            checkpoint.load_full(resumed, reference, reference_optimizer)
    return first


def _verified(record: StepRecord, reference: nn.Module, reference_optimizer, inputs: tuple,
              grads: dict, accepted: Tolerance, pm) -> StepRecord:
    """`record` with the plain model's side of its step: `reference` trains the same step
    on `inputs`, and its loss and gradients are compared with the compiled model's `pm`
    (its full gradients `grads`) under `accepted`, the parameters the plan compresses as
    `rounded_reference` says."""
    compressed = compressed_slots(pm.slots)
    mesh_shape = pm.plan.mesh.shape
    with rounded_weights(reference, compressed, mesh_shape):
        expected = training_loss(reference(*inputs))
        expected.backward()
    reduced, name = take_compressed(reference, grads, compressed, pm.plan.mesh.size)
    relative, worst, absolute, excess = worst_gradient(grads, reference, accepted)
    take_gathered(reference, grads, compressed)
    if reduced > excess:
        worst, excess = name, reduced
    record = StepRecord(record.step, record.loss, float(expected.detach()), relative,
                        worst, absolute, excess)
    reference_optimizer.step()
    reference_optimizer.zero_grad()
    return record


def _checkpointed(run: TrainingRun, step: int, pm, optimizer, pending):
    """Save `step` when it is due (`train_rank`'s docstring), once the save still `pending`
    (or None) is done; the save now pending."""
    if run.checkpoint_dir is not None and (
            step == run.steps or run.checkpoint_every and step % run.checkpoint_every == 0):
        if pending is not None:
            pending.wait()
        pending = checkpoint.save(checkpoint.step_path(run.checkpoint_dir, step), pm,
                                  optimizer, step=step, async_save=step < run.steps)
    return pending


def training_loss(output: object) -> torch.Tensor:
    """The loss in a forward's output: the output itself, first in a tuple, or under "loss"
    in a dict or ModelOutput (where `autopar.passes.capturing.capture` looks for it)."""
    if isinstance(output, Mapping):
        return output["loss"]
    if isinstance(output, (tuple, list)):
        return output[0]
    return output


def format_step(record: StepRecord, steps: int) -> str:
    """`step   2/5  loss 0.912345` (+ the differences from the plain model when verifying)."""
    width = len(str(steps))
    line = f"step {record.step:>{width + 2}}/{steps}  loss {record.loss:.6f}"
    if record.reference_loss is not None:
        line += (f"  reference {record.reference_loss:.6f}  loss diff {record.loss_error:.1e}"
                 f"  grad diff {record.grad_error:.1e} relative, "
                 f"{record.grad_abs_error:.1e} absolute ({record.worst_param})")
    return line


def communication_report(report: RankReport) -> str:
    """A table of the bytes `report`'s rank moved per (collective, axis, direction) next to
    the plan's prediction for the same number of steps, with a match column."""
    steps = len(report.steps)
    predicted = {key: value * steps for key, value in report.predicted_per_step.items()}
    lines = [f"communication over {steps} steps, bytes per rank (cost model convention)",
             f"{'collective':<16}{'axis':<8}{'direction':<11}{'measured':>14}"
             f"{'predicted':>14}  match"]
    for key in sorted(set(report.measured) | set(predicted)):
        kind, axis, direction = key
        got, want = report.measured.get(key, 0), predicted.get(key, 0)
        lines.append(f"{kind:<16}{axis:<8}{direction:<11}{got:>14,}{int(want):>14,}  "
                     + ("yes" if got == want else "no"))
    if len(lines) == 2:
        lines.append("(none: the plan needs no collective)")
    return "\n".join(lines)


def verification_failures(steps: tuple[StepRecord, ...],
                          tolerance: Tolerance = Tolerance()) -> tuple[str, ...]:
    """One message per step whose loss or worst gradient differs from the plain model's by
    more than `tolerance` allows; empty when all agree. Records of an unverified run (no
    reference) are an error of the caller."""
    failures = []
    for record in steps:
        assert record.reference_loss is not None, "verification_failures needs verify=True"
        difference = abs(record.loss - record.reference_loss)
        if tolerance.excess(difference, abs(record.reference_loss)) > 1:
            failures.append(f"step {record.step}: loss {record.loss:.8g}, single-process "
                            f"{record.reference_loss:.8g}: differs by {difference:.2e} "
                            f"absolute, {record.loss_error:.2e} relative")
        if not record.grad_excess <= 1:  # `not <=` also catches NaN
            failures.append(f"step {record.step}: gradient of {record.worst_param} differs by "
                            f"{record.grad_abs_error:.2e} absolute, {record.grad_error:.2e} "
                            "relative to its largest entry")
    return tuple(failures)
