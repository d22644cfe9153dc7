"""The standard hand-written strategies, costed by the same model as the solver's plan.

A hand strategy is a role per mesh axis (`autopar.passes.strategies.restrict`): a restriction of the
strategy table. Its figures are those of the cheapest plan within the restriction, found by
the same solver under the same cost model with no memory limit, so a figure always exists;
`fits` then says whether its peak memory is within the budget. What the solver's plan
gains over the best of them is what the search bought. Data parallelism also fixes the
activations (`pure_data_parallel`): it moves only all-reduces, and its note says why where
it can't (an op that no strategy splits along the batch, a batch the mesh doesn't divide).

Next to them, `SINGLE_DEVICE` is the same training step planned on a mesh of one device: its
compute over the number of devices is the compute-only lower bound of the step time, the
reference of the scaling efficiency (`autopar.values.plan.scaling_efficiency`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch.fx as fx

from autopar.costs.optimizer_state import ADAMW, OptimizerState, optimizer_state
from autopar.errors import InfeasiblePlanError
from autopar.passes.capturing.capture import is_training
from autopar.passes.capturing.write_back import written_buffers
from autopar.passes.strategies.find_strategies import StrategyTable, find_strategies
from autopar.passes.strategies.restrict import RECOMPUTE, ROLES, Restriction, restrict
from autopar.planning.deadline import Deadline
from autopar.planning.graph import STAGE, default_budget, plan_graph, plan_table, strategy_tables
from autopar.values.mesh import Mesh
from autopar.values.placement import Partial, Placements, Replicate, Shard
from autopar.values.plan import SINGLE_DEVICE, HandStrategyRecord, Plan
from autopar.values.specs import MODULE, ROLE, TENSOR, TensorSpec

# The pipelined hand strategy (`autopar.planning.pipeline.megatron_3d`), planned by the layout.
MEGATRON_3D = "Megatron 3D"
# Collectives pure data parallelism never runs: it only all-reduces (gradients, the loss).
_NOT_DATA_PARALLEL = ("all_gather", "all_to_all", "reduce_scatter")


@dataclass(frozen=True)
class HandStrategy:
    """A named hand strategy: one role of `ROLES` per mesh axis, or no roles and a `note`
    saying why it does not apply to the mesh. A strategy whose roles are all "dp" is pure
    data parallelism (`pure_data_parallel`): activations too follow the batch."""

    name: str
    description: str
    roles: tuple[str, ...] | None
    note: str = ""
    recompute: str = "none"

    def __post_init__(self) -> None:
        assert self.roles is not None or self.note, "a strategy that doesn't apply says why"
        assert self.roles is None or all(role in ROLES for role in self.roles), self.roles
        assert self.recompute in RECOMPUTE, self.recompute

    @property
    def data_parallel(self) -> bool:
        return self.roles is not None and all(role == "dp" for role in self.roles)


def _moves_nothing(produced: Placements, read: Placements) -> bool:
    """Whether a tensor `produced` so is read so with no collective but an all-reduce:
    the same placement, a replicated tensor read split (a local slice) or a partial sum
    read replicated (the loss's all-reduce)."""
    return all(have == want
               or (isinstance(have, Replicate) and not isinstance(want, Partial))
               or (isinstance(have, Partial) and isinstance(want, Replicate))
               for have, want in zip(produced, read, strict=True))


def pure_data_parallel(gm: fx.GraphModule, restricted: Restriction) -> Restriction:
    """`restricted` (the "dp" role on every axis) cut down to pure data parallelism.

    The "dp" role fixes the parameters (replicated) and how the user inputs are read (split
    on the batch), and leaves the activations to the solver, which may then gather one
    where that is cheaper under the cost model: a plan that is no longer data parallel.
    Here every op that depends on a user input reads each such input as its producer can
    give it with no collective but an all-reduce (`_moves_nothing`), so the batch split
    flows from the inputs to the loss; a buffer the forward writes in place (a KV cache:
    each sequence's state) is split on the batch as they are; every other op (it computes
    from parameters and constants only), and every other buffer and constant, is
    replicated, as the parameters are.
    An op left with no such strategy (no rule splits it along the batch) keeps its
    candidates and is listed in `relaxed`, by `op (module)`, in place of `restricted`'s."""
    table = restricted.table
    by_name = {node.name: node for node in gm.graph.nodes}
    produced: dict[str, frozenset] = {}  # the outputs each decision may have
    batched: set[str] = set()  # decisions that depend on a user input
    strategies = dict(table.strategies)
    relaxed: list[str] = []
    cache: dict[tuple, tuple | None] = {}
    written = {node.name for node in written_buffers(gm)}
    for name, candidates in table.strategies.items():
        node = by_name[name]
        if node.op == "output":
            continue
        sources = table.inputs.get(name, ())
        role = node.meta.get(ROLE)
        is_batched = role == "input" or name in written or any(p in batched for p, _ in sources)
        if is_batched:
            batched.add(name)
        if name in written:
            kept: tuple | None = _split_on_the_batch(candidates)
        elif node.op == "placeholder" and role in ("parameter", "input"):
            kept = candidates  # restrict fixed them
        else:
            reads = tuple(tuple(sorted(map(repr, produced[p]))) for p, _ in sources)
            key = (id(candidates), is_batched, reads)
            if key not in cache:
                if is_batched:
                    allowed = [produced[p] for p, _ in sources]
                    choice = tuple(s for s in candidates if all(
                        any(_moves_nothing(have, want) for have in options)
                        for options, want in zip(allowed, s.inputs, strict=True)))
                else:
                    choice = tuple(s for s in candidates if s.gathered is None and all(
                        isinstance(p, Replicate) for p in s.output))
                cache[key] = choice or None
            kept = cache[key]
            if kept is None:
                kept = candidates
                if node.op != "placeholder":
                    relaxed.append(f"{str(node.target).removeprefix('aten.')} "
                                   f"({_module(node)})")
        strategies[name] = kept
        produced[name] = frozenset(s.output for s in kept)
    return Restriction(dataclasses.replace(table, strategies=strategies), tuple(relaxed))


def _split_on_the_batch(candidates: tuple) -> tuple:
    """The `candidates` whose output splits dim 0 (the batch) on every axis, or all of them
    where none does."""
    return tuple(s for s in candidates if all(
        isinstance(p, Shard) and p.dim == 0 for p in s.output)) or candidates


def _module(node: fx.Node) -> str:
    return node.meta.get(MODULE) or "top"


# The hand strategies that differ from others only in the backward and the optimizer.
TRAINING_ONLY = ("FSDP + full recompute",
                 "Megatron TP + selective recompute + distributed optimizer")


def standard_hand_strategies(mesh: Mesh) -> tuple[HandStrategy, ...]:
    """Data parallel, ZeRO-3, Megatron over all devices, data x tensor parallel, FSDP with
    full recomputation, Megatron with selective recomputation and a distributed optimizer
    over the first axis, and context x tensor parallel with FSDP (torchtitan's long-context
    recipe: the sequence split over the axis before the last, attention on a ring there,
    parameters sharded over it and the axes before it, Megatron over the last)."""
    n = mesh.ndim
    axes = ", ".join(mesh.axis_names)
    strategies = [
        HandStrategy("data parallel", f"parameters replicated, batch split over {axes} through "
                                      "every activation, gradients all-reduced", ("dp",) * n),
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
    name = "CP x TP x FSDP"
    if n >= 2:
        cp, tp = mesh.axis_names[-2], mesh.axis_names[-1]
        strategies.append(HandStrategy(
            name, f"sequence split over {cp} (ring attention), parameters sharded over "
                  f"{', '.join(mesh.axis_names[:-1])}, Megatron over {tp}",
            ("zero",) * (n - 2) + ("cp", "tp")))
    else:
        strategies.append(HandStrategy(
            name, "sequence split over one axis with ring attention, Megatron over the last",
            None, note=two_axes))
    return tuple(strategies)


def asked_hand_strategies(asked: bool | tuple[str, ...], mesh: Mesh, *,
                          training: bool = True) -> tuple[HandStrategy, ...]:
    """The standard hand strategies of `mesh` the `hand_strategies` option asks for; for a
    forward-only graph (not `training`), all of them but the training recipes (what they
    add, recomputation in the backward and a distributed optimizer, a forward has not)."""
    every = standard_hand_strategies(mesh)
    if asked is True:
        return every if training else tuple(s for s in every if s.name not in TRAINING_ONLY)
    return tuple(s for s in every if s.name in (asked or ()))


def plan_record(strategy: HandStrategy, plan: Plan, budget: float,
                note: str) -> HandStrategyRecord:
    """`strategy`'s record from its cheapest `plan`: its figures, and whether it fits in
    `budget` bytes per device."""
    return HandStrategyRecord(
        name=strategy.name, description=strategy.description, step_time_s=plan.step_time_s,
        compute_s=plan.compute_s, comm_s=plan.comm_s, peak_memory_bytes=plan.peak_memory_bytes,
        comm_bytes=tuple((kind, axis, direction, float(nbytes))
                         for (kind, axis, direction), nbytes in plan.comm_bytes().items()),
        fits=plan.peak_memory_bytes <= budget, note=note, hidden_comm_s=plan.hidden_comm_s,
        optimizer_s=plan.optimizer_s)


def missing_record(strategy: HandStrategy, note: str) -> HandStrategyRecord:
    """The record of a strategy with no plan, `note` saying why."""
    return HandStrategyRecord(strategy.name, strategy.description, None, None, None, None,
                              note=note)


def _relaxation_note(relaxed: tuple[str, ...]) -> str:
    if not relaxed:
        return ""
    shown = ", ".join(relaxed[:4]) + (", ..." if len(relaxed) > 4 else "")
    return (f"{len(relaxed)} node(s) allow no strategy of this kind and keep all their "
            f"candidates: {shown}")


def _unsplit_axes_note(gm: fx.GraphModule, mesh: Mesh) -> str:
    """The axes a data-parallel plan can't split the batch over (it does not divide):
    replicated there, as `restrict` reads the inputs."""
    specs = [node.meta.get(TENSOR) for node in gm.graph.nodes
             if node.op == "placeholder" and node.meta.get(ROLE) == "input"]
    batches = [spec.shape[0] for spec in specs if isinstance(spec, TensorSpec) and spec.ndim]
    if not batches or not all(isinstance(b, int) for b in batches):
        return ""
    pieces, whole = 1, []
    for name, size in zip(mesh.axis_names, mesh.shape):
        if size > 1 and all(b % (pieces * size) == 0 for b in batches):
            pieces *= size
        elif size > 1:
            whole.append(name)
    if not whole:
        return ""
    return (f"the batch ({batches[0]}) does not split further over {', '.join(whole)}: "
            f"replicated there")


def _gathers_note(plan: Plan, unsplit: tuple[str, ...]) -> str:
    """Why a data-parallel plan moves more than all-reduces: the ops `pure_data_parallel`
    found no batch-split strategy for (`unsplit`), and the collectives that are not
    all-reduces, by tensor and the op reading it; "" when there are none."""
    moves = list(dict.fromkeys(
        f"{t.kind.replace('_', '-')} of {t.tensor} for {n.op.removeprefix('aten.')} "
        f"({n.module or 'top'})"
        for n in plan.nodes for t in n.transfers if t.kind in _NOT_DATA_PARALLEL))
    if not moves:
        return ""
    ops = list(dict.fromkeys(unsplit))
    why = (f"{', '.join(ops[:4])}{', ...' if len(ops) > 4 else ''} can't keep the batch "
           f"split (no strategy of theirs does), so it moves " if ops else "it moves ")
    return (f"not purely data parallel: {why}{'; '.join(moves[:3])}"
            f"{'; ...' if len(moves) > 3 else ''}")


def _solve_table(gm: fx.GraphModule, table: StrategyTable, mesh: Mesh, *, time_limit: float,
                 fold_layers: bool, seed: int, optimizer: OptimizerState,
                 microbatches: int, deadline: Deadline | None, in_flight: int = 1
                 ) -> Plan | str:
    """The cheapest plan of `table` with no memory limit, or why there is none."""
    try:
        return plan_table(gm, table, mesh, model_name=type(gm).__name__, memory_budget=None,
                          time_limit=time_limit, fold_layers=fold_layers, seed=seed,
                          optimizer=optimizer, microbatches=microbatches,
                          in_flight=in_flight, deadline=deadline)
    except InfeasiblePlanError as exc:
        return f"no plan within this restriction ({exc.got})"


def single_device_record(gm: fx.GraphModule, mesh: Mesh, *, budget: float,
                         time_limit: float = 10.0, seed: int = 0,
                         optimizer: OptimizerState = ADAMW, microbatches: int = 1,
                         deadline: Deadline | None = None) -> HandStrategyRecord:
    """The step on one device of `mesh`'s hardware (every node replicated, nothing moved)."""
    one = Mesh((1,), (mesh.axis_names[0],), hardware=mesh.hardware)
    reference = HandStrategy(SINGLE_DEVICE, "the same step on one device (scaling reference)",
                             ("dp",))
    result = _solve_table(gm, find_strategies(gm, one), one, time_limit=time_limit,
                          fold_layers=True, seed=seed, optimizer=optimizer,
                          microbatches=microbatches, deadline=deadline)
    if isinstance(result, str):
        return missing_record(reference, result)
    return plan_record(reference, result, budget, "")


def evaluate_hand_strategies(gm: fx.GraphModule, mesh: Mesh, *, memory_budget: float,
                             time_limit: float = 30.0, fold_layers: bool = True, seed: int = 0,
                             table: StrategyTable | None = None,
                             strategies: tuple[HandStrategy, ...] | None = None,
                             optimizer: OptimizerState = ADAMW, microbatches: int = 1,
                             in_flight: int = 1,
                             progress: Callable[[str], None] | None = None,
                             deadline: Deadline | None = None) -> HandStrategyResults:
    """One record per hand strategy (default `standard_hand_strategies(mesh)`), then the
    `SINGLE_DEVICE` reference, for an annotated graph, and the fastest of their plans that
    fits in `memory_budget`.

    `table` is the graph's unconstrained strategy table when the caller has it (else it is
    found again); each strategy is solved with `time_limit`, `fold_layers`, `seed`,
    `microbatches` (`gm` is then one micro-batch's graph) and `in_flight` (a pipeline
    stage's micro-batches held at once) as the solver's plan was, within the planning
    call's `deadline`.
    Records of strategies that don't apply, or whose restriction admits
    no plan, have `step_time_s` None and a note saying why.
    """
    say = progress or (lambda message: None)
    table = table if table is not None else find_strategies(gm, mesh)
    records = []
    fastest: Plan | None = None
    for strategy in strategies if strategies is not None else standard_hand_strategies(mesh):
        if strategy.roles is None:
            records.append(missing_record(strategy, strategy.note))
            continue
        say(f"{STAGE} hand strategy: {strategy.name} ({','.join(strategy.roles)})")
        restricted = restrict(gm, table, mesh, strategy.roles, strategy.recompute)
        notes = [_relaxation_note(restricted.relaxed)]
        unsplit: tuple[str, ...] = ()
        if strategy.data_parallel:
            pure = pure_data_parallel(gm, restricted)
            restricted, unsplit = Restriction(pure.table, restricted.relaxed), pure.relaxed
        result = _solve_table(gm, restricted.table, mesh, time_limit=time_limit,
                              fold_layers=fold_layers, seed=seed, optimizer=optimizer,
                              microbatches=microbatches, in_flight=in_flight,
                              deadline=deadline)
        if isinstance(result, str):
            note = "; ".join(filter(None, (result, *notes)))
            records.append(missing_record(strategy, note))
        else:
            if strategy.data_parallel:
                notes += [_unsplit_axes_note(gm, mesh), _gathers_note(result, unsplit)]
            records.append(plan_record(strategy, result, memory_budget,
                                       "; ".join(filter(None, notes))))
            if records[-1].fits and (fastest is None
                                     or result.step_time_s < fastest.step_time_s):
                fastest = result
    say(f"{STAGE} hand strategy: {SINGLE_DEVICE}")
    records.append(single_device_record(gm, mesh, budget=memory_budget, time_limit=time_limit,
                                        seed=seed, optimizer=optimizer,
                                        microbatches=microbatches, deadline=deadline))
    return HandStrategyResults(tuple(records), fastest)


@dataclass(frozen=True)
class HandStrategyResults:
    """The records of `evaluate_hand_strategies` and the fastest fitting plan among them
    (None when none fits): a plan of the same search space, restricted."""

    records: tuple[HandStrategyRecord, ...]
    fastest_fitting: Plan | None


def plan_by_hand(gm: fx.GraphModule, mesh: Mesh, name: str, **options) -> Plan:
    """The plan of the standard hand strategy `name` (its restriction of the search,
    solved as `evaluate_hand_strategies` does), instead of the solver's free choice; it
    carries its own record as its only hand strategy. Raises `InfeasiblePlanError` when
    that strategy has no plan on `mesh` or its plan does not fit the memory budget."""
    tables = strategy_tables(gm, mesh, **_picked(options, (
        "fold_layers", "recompute", "microbatches", "compression", "progress")))
    budget = default_budget(mesh, options.get("memory_budget"))
    hand = _evaluated(tables, mesh, (name,), options)
    record = hand.records[0]
    if hand.fastest_fitting is None:
        raise unfit(record, mesh, budget)
    return dataclasses.replace(hand.fastest_fitting, model=options["model_name"],
                               memory_limit_bytes=budget, hand_strategies=(record,))


def unfit(record: HandStrategyRecord, mesh: Mesh, budget: float) -> InfeasiblePlanError:
    """The error of a hand strategy asked for by name (`strategy`) whose `record` has no
    plan within `budget` bytes per device on `mesh`."""
    peak = record.peak_memory_bytes
    return InfeasiblePlanError(
        f"the hand strategy {record.name!r} has no plan that fits on {mesh.describe()}",
        min_bytes=peak, expected=f"a plan within {budget:.4g} bytes per device",
        got=record.note or f"{peak:.4g} bytes per device",
        fix="raise memory_budget, use more devices" + (
            "" if record.name == MEGATRON_3D else " or micro-batches")
        + ", or let the solver choose (no strategy)")


def plan_compared(gm: fx.GraphModule, mesh: Mesh, *,
                  hand_strategies: bool | tuple[str, ...] = False,
                  strategy: str | None = None, **options) -> Plan:
    """`plan_graph(gm, mesh, **options)` with the hand strategies `hand_strategies` asks for
    (all, or those named) planned beside it (`evaluate_hand_strategies`). They ignore the
    `constraints`: they are the standard ones; without constraints, a hand strategy's plan
    that fits and is faster is the plan. With `strategy`, the plan is that hand
    strategy's (`plan_by_hand`)."""
    if strategy is not None:
        return plan_by_hand(gm, mesh, strategy, **options)
    if not hand_strategies:
        return plan_graph(gm, mesh, **options)
    tables = strategy_tables(gm, mesh, **_picked(options, (
        "fold_layers", "constraints", "recompute", "microbatches", "compression",
        "progress")))
    result = plan_graph(gm, mesh, tables=tables, **options)
    hand = _evaluated(tables, mesh, hand_strategies, options)
    # Each hand strategy is a restriction of the same search; the overlap of gradient
    # reductions is estimated round by round (plan_table), so a restricted search can
    # land on a faster plan than the whole one did: keep the fastest of them.
    fastest = hand.fastest_fitting
    if not options.get("constraints") and fastest is not None \
            and fastest.step_time_s < result.step_time_s:
        result = dataclasses.replace(fastest, model=result.model, warnings=result.warnings,
                                     memory_limit_bytes=result.memory_limit_bytes)
    return dataclasses.replace(result, hand_strategies=hand.records)


def _evaluated(tables, mesh: Mesh, asked: bool | tuple[str, ...],
               options: dict) -> HandStrategyResults:
    """`evaluate_hand_strategies` of the hand strategies `asked` for, over `tables` (of
    `strategy_tables`), with the planning call's `options`."""
    return evaluate_hand_strategies(
        tables.gm, mesh, memory_budget=default_budget(mesh, options.get("memory_budget")),
        table=tables.found, strategies=asked_hand_strategies(
            asked, mesh, training=is_training(tables.gm)),
        optimizer=optimizer_state(options.get("optimizer"),
                                  master_weights=options.get("master_weights")),
        **_picked(options, ("time_limit", "fold_layers", "seed", "microbatches", "in_flight",
                            "progress", "deadline")))


def _picked(options: dict, names: tuple[str, ...]) -> dict:
    """The `options` among `names` that were given (the callee's defaults for the rest)."""
    return {name: options[name] for name in names if name in options}
