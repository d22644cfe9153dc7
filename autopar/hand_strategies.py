"""The standard hand-written strategies, costed by the same model as the solver's plan.

A hand strategy is a role per mesh axis (`autopar.passes.restrict`): a restriction of the
strategy table. Its figures are those of the cheapest plan within the restriction, found by
the same solver under the same cost model with no memory limit, so a figure always exists;
`fits` then says whether its peak memory is within the budget. What the solver's plan
gains over the best of them is what the search bought.

Next to them, `SINGLE_DEVICE` is the same training step planned on a mesh of one device: its
compute over the number of devices is the compute-only lower bound of the step time, the
reference of the scaling efficiency (`scaling_efficiency`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.fx as fx

from autopar.api import STAGE, plan_table
from autopar.errors import InfeasiblePlanError
from autopar.mesh import Mesh
from autopar.optimizer_state import ADAMW, OptimizerState
from autopar.passes.find_strategies import StrategyTable, find_strategies
from autopar.passes.restrict import RECOMPUTE, ROLES, restrict
from autopar.plan_types import HandStrategyRecord, Plan

SINGLE_DEVICE = "single device"


@dataclass(frozen=True)
class HandStrategy:
    """A named hand strategy: one role of `ROLES` per mesh axis, or no roles and a `note`
    saying why it does not apply to the mesh."""

    name: str
    description: str
    roles: tuple[str, ...] | None
    note: str = ""
    recompute: str = "none"

    def __post_init__(self) -> None:
        assert self.roles is not None or self.note, "a strategy that doesn't apply says why"
        assert self.roles is None or all(role in ROLES for role in self.roles), self.roles
        assert self.recompute in RECOMPUTE, self.recompute


def standard_hand_strategies(mesh: Mesh) -> tuple[HandStrategy, ...]:
    """Data parallel, ZeRO-3, Megatron over all devices, data x tensor parallel, FSDP with
    full recomputation, and Megatron with selective recomputation and a distributed
    optimizer over the first axis."""
    n = mesh.ndim
    axes = ", ".join(mesh.axis_names)
    strategies = [
        HandStrategy("data parallel", f"parameters replicated, batch split over {axes}",
                     ("dp",) * n),
        HandStrategy("fully sharded (ZeRO-3)",
                     f"parameters stored split over {axes}, gathered at use; batch split",
                     ("zero",) * n),
        HandStrategy("Megatron tensor parallel",
                     f"weight matrices split over {axes} (column/row), batch replicated",
                     ("tp",) * n),
    ]
    two_axes = f"needs a mesh of at least 2 axes; {mesh.describe()} has 1"
    rest = ", ".join(mesh.axis_names[1:])
    name = "data x tensor parallel"
    if n >= 2:
        strategies.append(HandStrategy(
            name, f"batch split over {mesh.axis_names[0]}, Megatron over {rest}",
            ("dp",) + ("tp",) * (n - 1)))
    else:
        strategies.append(HandStrategy(
            name, "batch split over the first axis, Megatron over the others", None,
            note=two_axes))
    strategies.append(HandStrategy(
        "FSDP + full recompute", f"ZeRO-3 over {axes}, every block recomputed in the backward",
        ("zero",) * n, recompute="full"))
    name = "Megatron TP + selective recompute + distributed optimizer"
    if n >= 2:
        strategies.append(HandStrategy(
            name, f"batch and optimizer states split over {mesh.axis_names[0]} (ZeRO-2), "
                  f"Megatron over {rest}, non-matmul activations recomputed",
            ("dopt",) + ("tp",) * (n - 1), recompute="selective"))
    else:
        strategies.append(HandStrategy(
            name, "distributed optimizer over the first axis, Megatron over the others",
            None, note=two_axes))
    return tuple(strategies)


def _record(strategy: HandStrategy, plan: Plan, budget: float, note: str) -> HandStrategyRecord:
    return HandStrategyRecord(
        name=strategy.name, description=strategy.description, step_time_s=plan.step_time_s,
        compute_s=plan.compute_s, comm_s=plan.comm_s, peak_memory_bytes=plan.peak_memory_bytes,
        comm_bytes=tuple((kind, axis, direction, float(nbytes))
                         for (kind, axis, direction), nbytes in plan.comm_bytes().items()),
        fits=plan.peak_memory_bytes <= budget, note=note, hidden_comm_s=plan.hidden_comm_s)


def _missing(strategy: HandStrategy, note: str) -> HandStrategyRecord:
    return HandStrategyRecord(strategy.name, strategy.description, None, None, None, None,
                              note=note)


def _relaxation_note(relaxed: tuple[str, ...]) -> str:
    if not relaxed:
        return ""
    shown = ", ".join(relaxed[:4]) + (", ..." if len(relaxed) > 4 else "")
    return (f"{len(relaxed)} node(s) allow no strategy of this kind and keep all their "
            f"candidates: {shown}")


def _solve_table(gm: fx.GraphModule, table: StrategyTable, mesh: Mesh, *, time_limit: float,
                 fold_layers: bool, seed: int, optimizer: OptimizerState,
                 microbatches: int) -> Plan | str:
    """The cheapest plan of `table` with no memory limit, or why there is none."""
    try:
        return plan_table(gm, table, mesh, model_name=type(gm).__name__, memory_budget=None,
                          time_limit=time_limit, fold_layers=fold_layers, seed=seed,
                          optimizer=optimizer, microbatches=microbatches)
    except InfeasiblePlanError as exc:
        return f"no plan within this restriction ({exc.got})"


def single_device_record(gm: fx.GraphModule, mesh: Mesh, *, budget: float,
                         time_limit: float = 10.0, seed: int = 0,
                         optimizer: OptimizerState = ADAMW,
                         microbatches: int = 1) -> HandStrategyRecord:
    """The step on one device of `mesh`'s hardware (every node replicated, nothing moved)."""
    one = Mesh((1,), (mesh.axis_names[0],), hardware=mesh.hardware)
    reference = HandStrategy(SINGLE_DEVICE, "the same step on one device (scaling reference)",
                             ("dp",))
    result = _solve_table(gm, find_strategies(gm, one), one, time_limit=time_limit,
                          fold_layers=True, seed=seed, optimizer=optimizer,
                          microbatches=microbatches)
    if isinstance(result, str):
        return _missing(reference, result)
    return _record(reference, result, budget, "")


def evaluate_hand_strategies(gm: fx.GraphModule, mesh: Mesh, *, memory_budget: float,
                             time_limit: float = 30.0, fold_layers: bool = True, seed: int = 0,
                             table: StrategyTable | None = None,
                             strategies: tuple[HandStrategy, ...] | None = None,
                             optimizer: OptimizerState = ADAMW, microbatches: int = 1,
                             progress: Callable[[str], None] | None = None,
                             ) -> HandStrategyResults:
    """One record per hand strategy (default `standard_hand_strategies(mesh)`), then the
    `SINGLE_DEVICE` reference, for an annotated graph, and the fastest of their plans that
    fits in `memory_budget`.

    `table` is the graph's unconstrained strategy table when the caller has it (else it is
    found again); each strategy is solved with `time_limit`, `fold_layers`, `seed` and
    `microbatches` (`gm` is then one micro-batch's graph) as the solver's plan was.
    Records of strategies that don't apply, or whose restriction admits
    no plan, have `step_time_s` None and a note saying why.
    """
    say = progress or (lambda message: None)
    table = table if table is not None else find_strategies(gm, mesh)
    records = []
    fastest: Plan | None = None
    for strategy in strategies if strategies is not None else standard_hand_strategies(mesh):
        if strategy.roles is None:
            records.append(_missing(strategy, strategy.note))
            continue
        say(f"{STAGE} hand strategy: {strategy.name} ({','.join(strategy.roles)})")
        restricted = restrict(gm, table, mesh, strategy.roles, strategy.recompute)
        result = _solve_table(gm, restricted.table, mesh, time_limit=time_limit,
                              fold_layers=fold_layers, seed=seed, optimizer=optimizer,
                              microbatches=microbatches)
        note = _relaxation_note(restricted.relaxed)
        if isinstance(result, str):
            records.append(_missing(strategy, "; ".join(filter(None, (result, note)))))
        else:
            records.append(_record(strategy, result, memory_budget, note))
            if records[-1].fits and (fastest is None
                                     or result.step_time_s < fastest.step_time_s):
                fastest = result
    say(f"{STAGE} hand strategy: {SINGLE_DEVICE}")
    records.append(single_device_record(gm, mesh, budget=memory_budget, time_limit=time_limit,
                                        seed=seed, optimizer=optimizer,
                                        microbatches=microbatches))
    return HandStrategyResults(tuple(records), fastest)


@dataclass(frozen=True)
class HandStrategyResults:
    """The records of `evaluate_hand_strategies` and the fastest fitting plan among them
    (None when none fits): a plan of the same search space, restricted."""

    records: tuple[HandStrategyRecord, ...]
    fastest_fitting: Plan | None


def compute_lower_bound(plan: Plan) -> float | None:
    """Single-device compute time over the number of devices (from the `SINGLE_DEVICE`
    record), seconds; None when the plan carries no such record."""
    for record in plan.hand_strategies:
        if record.name == SINGLE_DEVICE and record.compute_s is not None:
            return record.compute_s / plan.mesh.size
    return None


def scaling_efficiency(plan: Plan, step_time_s: float | None) -> float | None:
    """`compute_lower_bound(plan) / step_time_s`: 1.0 is perfect scaling with no
    communication; None when either is unknown."""
    bound = compute_lower_bound(plan)
    if bound is None or not step_time_s:
        return None
    return bound / step_time_s
