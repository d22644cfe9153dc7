"""One pipeline candidate's stages: screened a stage at a time (`Screening`), the chosen
one's slowest then planned in full (`refined_stages`), and costed by the schedule into one
plan of the whole mesh (`costed`): `autopar.planning.pipeline.plan`'s steps 3 and 4."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping

import torch.fx as fx

from autopar.costs import formulas, uneven
from autopar.costs.schedule import bubble, in_flight, rank_of, step_time
from autopar.errors import InfeasiblePlanError
from autopar.passes.capturing.capture import is_training
from autopar.passes.capturing.gradient_path import gradient_path, tensor_outputs
from autopar.passes.layout.split_stages import Stage
from autopar.values.mesh import Mesh
from autopar.values.pipeline import Schedule
from autopar.values.placement import parse_placements
from autopar.values.plan import (
    PipelineRecord,
    Plan,
    SolverReport,
    StageRecord,
    TransferRecord,
    insert_axis,
)
from autopar.values.specs import BOUNDARY, NAMES, TENSOR, TensorSpec

# The chosen candidate's stages are planned in full until those left screened take at
# most this share of the step (`refined_stages`).
SCREENED_SHARE = 0.1
# The loss reaches every pipeline rank as one float32 scalar.
LOSS_BYTES = 4


class Screening:
    """One candidate's screening, a stage at a time, in order (a stage is planned against
    the placements the stages before it send): `bound()` is a lower bound of its step, the
    schedule's step with its screened stages at their times per micro-batch and the others
    at `least` (each a lower bound of its stage's: the step is monotone in every stage's
    time), `advance()` screens the next stage (`InfeasiblePlanError` when it does not
    fit), and once `done`, `plans` are its stages' (`costed` makes the candidate's plan).
    `screened` gives the stages' screening plans in order (`screened_stages`).

    An interleaved candidate's rank holds a stage of every round of `ranks` stages, and its
    step is bound by the slowest rank's sum: after each stage screened in order, the later
    stages of its rank are screened ahead of order (`probe(k, pinned, received)`: stage `k`
    planned with the shared weights `pinned` as stored so far, as if it received
    `received`, guessed as what the stage before it in order sends: the same boundary, a
    round later), their times standing in the bound for their least until the stage is
    screened in order (screening times, as the in-order stages' are: the bound is a lower
    bound of the step the screening plans give). A candidate whose ranks lose is left
    after a stage or two of a round, not a whole round; where the guess was right, the
    screening in order finds the stage planned (the plans are cached by their pins).
    Mutable: each advance adds a plan or a stage screened ahead."""

    def __init__(self, stages: tuple[Stage, ...], schedule: Schedule, microbatches: int,
                 ranks: int, least: tuple[float, ...], screened: Iterator[tuple[Plan, tuple]],
                 probe: Callable[[int, dict[str, str], dict[str, str]], Plan] | None = None
                 ) -> None:
        self.stages, self.schedule, self.microbatches = stages, schedule, microbatches
        self.ranks, self.least, self._screened = ranks, least, screened
        self.plans: list[Plan] = []
        self._probe, self._probed = probe, {}

    @property
    def done(self) -> bool:
        return len(self.plans) == len(self.stages)

    def bound(self) -> float:
        times = [_split_time(plan, self.microbatches)[0] for plan in self.plans]
        for k in range(len(times), len(self.stages)):
            probed = self._probed.get(k)
            times.append(self.least[k] if probed is None else
                         max(self.least[k], _split_time(probed, self.microbatches)[0]))
        return step_time(times, self.microbatches, self.ranks, self.schedule)

    def advance(self) -> None:
        ahead = self._ahead()
        if ahead is None:
            plan, _ = next(self._screened)
            self.plans.append(plan)
            return
        k, received, pinned = ahead
        try:
            self._probed[k] = self._probe(k, pinned, received)
        except InfeasiblePlanError:  # with guessed pins: the screening in order decides
            self._probed[k] = None

    def _ahead(self) -> tuple[int, dict[str, str], dict[str, str]] | None:
        """The next stage to screen ahead of order, what it is guessed to receive and the
        shared weights stored so far, or None (class docstring)."""
        if self._probe is None or not self.plans or len(self.stages) == self.ranks:
            return None
        last = len(self.plans) - 1
        sent, pinned = _placed(self.stages, self.plans)
        sends = self.stages[last].sends
        for k in range(last + self.ranks, len(self.stages), self.ranks):
            receives = self.stages[k].receives
            if k in self._probed or len(receives) != len(sends):
                continue
            return k, {name: sent.get(name, sent[own])
                       for name, own in zip(receives, sends)}, pinned
        return None


def screened_stages(stages: tuple[Stage, ...], schedule: Schedule, microbatches: int,
                    ranks: int, inner: tuple[Mesh, ...], memory_budget: float | None,
                    plan_stage: Callable[..., Plan], cache: dict[tuple, Plan],
                    pins: Mapping[str, str], chosen: Mapping[tuple, Plan] | None = None
                    ) -> Iterator[tuple[Plan, tuple]]:
    """Each stage's plan with the key it was planned under, in order: the plan `chosen` has
    for the key, else its screening plan (`screened_stage`; cached). The pins are the
    `pins` (`_stage_pins`) of the tensors it holds, a shared weight where the first stage
    holding it stored it, and its boundary inputs as their sender sends them."""
    sent: dict[str, str] = {}  # boundary tensor -> the placement its sender chose
    pinned: dict[str, str] = {}
    for stage in stages:
        # Each rank receives its counterpart's piece: the placement the sender chose.
        received = {name: sent[name] for name in stage.receives}
        plan, key = screened_stage(stages, stage.index, schedule, microbatches, ranks, inner,
                                   memory_budget, plan_stage, cache, pins, pinned, received)
        plan = (chosen or {}).get(key, plan)
        _place(stage, plan, sent, pinned)
        yield plan, key


def _placed(stages: tuple[Stage, ...], plans: list[Plan]
            ) -> tuple[dict[str, str], dict[str, str]]:
    """What the first stages, planned as `plans`, fixed for the later ones: the placement
    each boundary tensor is sent in, by name, and where each shared weight is stored (its
    first holder's)."""
    sent: dict[str, str] = {}
    pinned: dict[str, str] = {}
    for stage, plan in zip(stages, plans):
        _place(stage, plan, sent, pinned)
    return sent, pinned


def _place(stage: Stage, plan: Plan, sent: dict[str, str], pinned: dict[str, str]) -> None:
    """Add to `sent` and `pinned` (`_placed`) what `stage`, planned as `plan`, fixes."""
    sent.update(_sent_placements(plan, stage))
    for name, placements in _shared_placements(plan, stage).items():
        pinned.setdefault(name, placements)


def screened_stage(stages: tuple[Stage, ...], k: int, schedule: Schedule, microbatches: int,
                   ranks: int, inner: tuple[Mesh, ...], memory_budget: float | None,
                   plan_stage: Callable[..., Plan], cache: dict[tuple, Plan],
                   pins: Mapping[str, str], pinned: Mapping[str, str],
                   received: Mapping[str, str]) -> tuple[Plan, tuple]:
    """Stage `k`'s screening plan (`plan_stage`, cached) and its key, (micro-batches, stage
    count, stage, micro-batches in flight, pins): the `pins` of the tensors it holds, its
    shared weights where `pinned` has them, its boundary inputs as `received`."""
    stage = stages[k]
    held, share = _stage_budget(stage, schedule, microbatches, ranks, len(stages),
                                memory_budget)
    wanted = {name: placements for name, placements in pins.items()
              if holds(stage.module, name)}
    wanted.update({name: pinned[name] for name in stage.shared if name in pinned})
    wanted.update(received)
    key = (microbatches, len(stages), stage.index, held, tuple(sorted(wanted.items())))
    if key not in cache:
        cache[key] = plan_stage(stage.module, inner[rank_of(stage.index, ranks)],
                                memory_budget=share,
                                microbatches=microbatches, in_flight=held,
                                constraints=wanted or None)
    return cache[key], key


def _stage_budget(stage: Stage, schedule: Schedule, microbatches: int, ranks: int,
                  count: int, memory_budget: float | None) -> tuple[int, float | None]:
    """(micro-batches in flight, memory budget) of a stage of `count`: a rank holds
    count / ranks stages in the budget."""
    held = in_flight(schedule, microbatches, ranks, rank_of(stage.index, ranks),
                     count // ranks, stage.index // ranks)
    return held, None if memory_budget is None else memory_budget / (count // ranks)


def refined_stages(stages: tuple[Stage, ...], schedule: Schedule, microbatches: int,
                   ranks: int, inner: tuple[Mesh, ...], axis_name: str, link,
                   memory_budget: float | None, plan_stage: Callable[..., Plan],
                   cache: dict[tuple, Plan], pins: Mapping[str, str]) -> list[Plan]:
    """The stages' plans after planning some in full: the slowest stage (time per
    micro-batch, its sends included) while it is one only screened, then the slowest
    screened one while the screened stages' times add up to more than `SCREENED_SHARE` of
    the step. The step is the slowest stage's time m - 1 times over plus one pass through
    the others, so a faster stage gains the step at most its own time once: planning it
    in full is worth its solve when the stages left screened weigh in the step (few
    micro-batches), not when they don't (with many micro-batches, one or two full solves).
    A full plan replaces the screening one when faster; if it sends its boundary tensors
    or stores a weight it shares otherwise, the later stages, planned against those, are
    screened again with the new pins (pins flow forward only, so this ends: at most 2s
    full solves)."""
    chosen: dict[tuple, Plan] = {}  # stage key -> its plan in full
    done: set[tuple] = set()  # the keys planned in full

    def next_stage(planned: list[tuple[Plan, tuple]]) -> int | None:
        times = [_split_time(_with_sends(plan, stage, microbatches, axis_name, link),
                             microbatches)[0] for stage, (plan, _) in zip(stages, planned)]
        waiting = [k for k, (_, key) in enumerate(planned) if key not in done]
        slowest = max(range(len(stages)), key=times.__getitem__)
        if slowest in waiting:
            return slowest
        step = step_time(times, microbatches, ranks, schedule)
        if not waiting or sum(times[k] for k in waiting) <= SCREENED_SHARE * step:
            return None
        return max(waiting, key=times.__getitem__)

    for _ in range(2 * len(stages)):
        planned = list(screened_stages(stages, schedule, microbatches, ranks, inner,
                                       memory_budget, plan_stage, cache, pins, chosen))
        k = next_stage(planned)
        if k is None:
            break
        (plan, key), stage = planned[k], stages[k]
        done.add(key)
        held, share = _stage_budget(stage, schedule, microbatches, ranks, len(stages),
                                    memory_budget)
        wanted = dict(key[-1])
        try:
            full = plan_stage(stage.module, inner[rank_of(stage.index, ranks)],
                              memory_budget=share,
                              microbatches=microbatches, in_flight=held,
                              constraints=wanted or None, refining=plan)
        except InfeasiblePlanError:
            continue
        if full.step_time_s < plan.step_time_s:
            chosen[key] = full
            try:  # the later stages, screened against its placements
                list(screened_stages(stages, schedule, microbatches, ranks, inner,
                                     memory_budget, plan_stage, cache, pins, chosen))
            except InfeasiblePlanError:
                del chosen[key]
    return [plan for plan, _ in screened_stages(stages, schedule, microbatches, ranks, inner,
                                                memory_budget, plan_stage, cache, pins,
                                                chosen)]


def costed(stages: tuple[Stage, ...], blocks: tuple[str, ...], stage_plans: list[Plan],
           schedule: Schedule, microbatches: int, ranks: int, mesh: Mesh, axis: int,
           memory_budget: float | None) -> Plan:
    """One plan of the whole mesh from its stages' plans, costed by the schedule (module
    docstring): each stage's boundary sends added (`_with_sends`), the shared weights'
    gradient all-reduce and the broadcast of what the last stage returns (`_returned`) over
    the pipeline axis."""
    virtual = len(stages) // ranks
    link = mesh.axis_links[axis]
    axis_name = mesh.axis_names[axis]
    inner = stage_plans[0].mesh
    records, plans, shared_bytes, pinned = [], [], {}, {}
    for stage, stage_plan in zip(stages, stage_plans):
        held, _ = _stage_budget(stage, schedule, microbatches, ranks, len(stages), None)
        plan = _with_sends(stage_plan, stage, microbatches, axis_name, link)
        # A weight two stages hold (tied) sums its gradients over them: none in a forward.
        shares = _shared_placements(plan, stage) if is_training(stage.module) else {}
        for name, placements in shares.items():
            pinned.setdefault(name, placements)
            spec = _state_node(stage.module, name).meta[TENSOR]
            shared_bytes[name] = formulas.local_bytes(uneven.cost_bytes(spec, inner),
                                                      parse_placements(pinned[name]), inner.shape)
        per_microbatch, once = _split_time(plan, microbatches)
        records.append(StageRecord(
            stage.index, rank_of(stage.index, ranks), (blocks[stage.first], blocks[stage.last]),
            (stage.first, stage.last), per_microbatch, once, plan.peak_memory_bytes, held,
            stage.receives, stage.sends, stage.shared))
        plans.append(plan)
    transfers = tuple(TransferRecord(
        "all_reduce", axis_name, float(nbytes), True, name,
        float(formulas.collective_time("all_reduce", nbytes, ranks, link)))
        for name, nbytes in sorted(shared_bytes.items()))
    name, nbytes = _returned(stages[-1].module, microbatches)
    transfers += (TransferRecord("broadcast", axis_name, float(nbytes), False, name,
                                 float(formulas.collective_time("broadcast", nbytes, ranks,
                                                                link))),)
    times = [r.time_s for r in records]
    total = (step_time(times, microbatches, ranks, schedule) + max(r.once_s for r in records)
             + sum(t.seconds for t in transfers))
    per_rank = [sum(r.memory_bytes for r in records if r.rank == k) for k in range(ranks)]
    record = PipelineRecord(axis_name, schedule.name, microbatches, virtual, tuple(records),
                            total, bubble(times, microbatches, ranks, schedule), inner,
                            transfers)
    return _combined(plans, record, mesh, axis, max(per_rank), memory_budget)


def _returned(last: fx.GraphModule, microbatches: int) -> tuple[str, int]:
    """What the last stage broadcasts to the other pipeline ranks, and its bytes: the loss
    (one float32 scalar) of a training step; a forward-only graph's outputs, whole (its
    `microbatches` micro-batches' rows of them, which `last` is one of)."""
    if is_training(last):
        return "loss", LOSS_BYTES
    output = next(n for n in last.graph.nodes if n.op == "output")
    return "outputs", microbatches * sum(spec.nbytes for value in output.all_input_nodes
                                         for spec in tensor_outputs(value))


def holds(module: fx.GraphModule, name: str) -> bool:
    """Whether `module` has a node named `name`, or a tensor of that name."""
    return any(n.name == name or name in n.meta.get(NAMES, ()) for n in module.graph.nodes)


def _shared_placements(plan: Plan, stage: Stage) -> dict[str, str]:
    """Where `stage`'s plan stores the weights it shares with other stages, by name."""
    return {name: plan.node(_state_node(stage.module, name).name).output
            for name in stage.shared}


def _state_node(module: fx.GraphModule, name: str) -> fx.Node:
    return next(n for n in module.graph.nodes if n.op == "placeholder"
                and name in n.meta.get(NAMES, ()))


def _sent_placements(plan: Plan, stage: Stage) -> dict[str, str]:
    """The placements (on the sub-mesh) `stage` sends its boundary tensors in, by name: its
    output node's, as its plan chose."""
    if not stage.sends:
        return {}
    output = next(n for n in plan.nodes if n.role == "output")
    return dict(zip(stage.sends, output.inputs))


def _with_sends(plan: Plan, stage: Stage, microbatches: int, axis: str, link) -> Plan:
    """`plan` with the stage's boundary sends over the pipeline axis: its outputs forward
    (on the output node) and, in a training step, the gradients of the floating inputs it
    received backward (on those inputs), once per micro-batch, each rank its piece of the
    tensor to its counterpart, at `B / beta + alpha` each (`formulas.send_time`)."""
    module = stage.module
    by_name = {n.name: n for n in module.graph.nodes}
    shape = plan.mesh.shape

    def sends(specs: list[tuple[str, TensorSpec, str]],
              backward: bool) -> tuple[TransferRecord, ...]:
        pieces = [(name, formulas.local_bytes(uneven.tensor_bytes(spec, shape),
                                              parse_placements(placed), shape))
                  for name, spec, placed in specs]
        return tuple(TransferRecord(
            "send", axis, float(nbytes * microbatches), backward, name,
            float(microbatches * formulas.send_time(nbytes, link)),
            microbatches)
            for name, nbytes in pieces)

    placed = _sent_placements(plan, stage)
    gradients = gradient_path(module)
    nodes = []
    for node in plan.nodes:
        added: tuple[TransferRecord, ...] = ()
        graph_node = by_name.get(node.name)
        if node.role == "output" and stage.sends:
            added = sends([(name, _sent_spec(module, name), placed[name])
                           for name in stage.sends], False)
        elif graph_node is not None and graph_node.op == "placeholder" and \
                graph_node.meta.get(BOUNDARY) and gradients.get(graph_node.name):
            added = sends([(node.name, graph_node.meta[TENSOR], node.output)], True)
        if added:
            node = dataclasses.replace(node, transfers=node.transfers + added,
                                       comm_s=node.comm_s + sum(t.seconds for t in added))
        nodes.append(node)
    return dataclasses.replace(plan, nodes=tuple(nodes))


def _sent_spec(module: fx.GraphModule, name: str) -> TensorSpec:
    output = next(n for n in module.graph.nodes if n.op == "output")
    return next(v.meta[TENSOR] for v in output.args[0] if v.name == name)


def _split_time(plan: Plan, microbatches: int) -> tuple[float, float]:
    """(forward plus backward of one micro-batch, the once-per-step part: the exposed
    time of what it reduces once and its optimizer step) of a stage's plan of
    `microbatches` micro-batches."""
    once = sum(t.seconds for n in plan.nodes for t in n.transfers
               if microbatches > 1 and t.calls == 1)
    exposed_once = max(0.0, once - plan.hidden_comm_s) + plan.optimizer_s
    return (plan.step_time_s - exposed_once) / microbatches, exposed_once


def _combined(plans: list[Plan], record: PipelineRecord, mesh: Mesh, axis: int,
              peak: float, budget: float | None) -> Plan:
    """One plan of the whole mesh from the stages' plans (see `Plan`)."""
    nodes = tuple(dataclasses.replace(
        n, stage=k, inputs=tuple(insert_axis(p, axis) for p in n.inputs),
        output=insert_axis(n.output, axis),
        gathered=insert_axis(n.gathered, axis) if n.gathered else "")
        for k, plan in enumerate(plans) for n in plan.nodes)
    reports = [p.solver for p in plans]
    statuses = [r.status for r in reports]
    solver = SolverReport(
        objective=record.step_time_s, bound=sum(r.bound for r in reports),
        gap=max(r.gap for r in reports),
        status="optimal" if all(s == "optimal" for s in statuses) else "feasible",
        wall_time_s=sum(r.wall_time_s for r in reports),
        decisions=sum(r.decisions for r in reports), tied=sum(r.tied for r in reports))
    warnings = tuple(dict.fromkeys(w for p in plans for w in p.warnings))
    first = plans[0]
    return Plan(model=first.model, mesh=mesh, nodes=nodes, solver=solver,
                memory_limit_bytes=float("inf") if budget is None else budget,
                peak_memory_bytes=peak, warnings=warnings,
                optimizer=first.optimizer, model_flops=sum(p.model_flops for p in plans),
                microbatches=record.microbatches, pipeline=record)
