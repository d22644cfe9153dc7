"""`Plan`: how every node of a model is split over a mesh, and what that is modelled to cost.

A plan is a frozen value. It is saved as versioned JSON (never pickle): `plan.save(path)`,
`Plan.load(path)`; a file from a newer autopar, or a corrupt one, raises `PlanFormatError`.
Each node keeps the formula of its chosen cost over the graph's symbolic sizes (when the
model was captured with dynamic dims), so `plan.step_time(batch=64)` re-evaluates the
prediction at other sizes without solving again.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import sympy

from autopar.errors import PlanFormatError
from autopar.values.compression import compression_named
from autopar.values.mesh import Mesh

# 2: recompute, gathered and hidden_s per node, the optimizer, FLOPs; 3: micro-batches,
# whole_gradient per node, calls per transfer; 4: the example inputs and graph planned for;
# 5: pipelines (stage per node, the pipeline's stages and schedule); 6: optimizer_s per
# node (older plans read as 0: their step times left the optimizer out); 7: training
# (False: a forward-only plan; older plans read as training ones) and its KV cache; 8:
# outputs ("sharded": a forward-only plan's outputs as its placements leave them) and a
# decode plan's prefill (prompt tokens, predicted time and peak); 9: the pieces of an
# output split unevenly; 10: a parameter's gradient compression; 11: a serving plan's
# objective and the batches its throughput search tried, and whose placements of the
# weights and cache a decode plan with its prefill took.
FORMAT_VERSION = 11
# The hand strategy record of the same step on one device: the scaling reference.
SINGLE_DEVICE = "single device"


@dataclass(frozen=True)
class TransferRecord:
    """One collective the plan performs in a training step: kind, mesh axis name, per-rank
    buffer bytes and seconds over the step, and how many `calls` make them (one per
    micro-batch, or one per step)."""

    kind: str
    axis: str
    nbytes: float
    backward: bool
    tensor: str
    seconds: float
    calls: int = 1


@dataclass(frozen=True)
class NodePlan:
    """The decision for one graph node and its modelled cost on one device.

    `recompute` (ops): the output is not kept for the backward but computed again from the
    op's inputs when the backward needs it; `transfers` then lists its inputs' forward
    collectives a second time, as backward ones. `gathered` (parameters stored sharded):
    the placements it is gathered into at its use and kept in until its backward (ZeRO-2);
    empty when it is gathered at each use (ZeRO-3) or never; with `whole_gradient`, once
    per step for every micro-batch, its gradient accumulated whole and reduce-scattered
    once (ZeRO-1). `pieces`: where the output is split unevenly, the length of every piece
    of each uneven dim, in rank order (`placement.describe_pieces`). `compression`
    (parameters): the compressed collective its gradient is reduced with
    (`autopar.values.compression`), empty for none. Times are per training
    step. `comm_s` is the time of all
    its inbound collectives, `hidden_s` the part of it that overlaps the backward's compute
    (gradient all-reduces the runtime runs in the background).
    """

    name: str
    op: str
    role: str
    module: str
    inputs: tuple[str, ...]
    output: str
    compute_s: float
    comm_s: float
    memory_bytes: float
    transfers: tuple[TransferRecord, ...]
    formula: str
    recompute: bool = False
    gathered: str = ""
    hidden_s: float = 0.0
    whole_gradient: bool = False
    stage: int = 0
    optimizer_s: float = 0.0  # a parameter's: the optimizer's step of its stored piece
    pieces: str = ""
    compression: str = ""

    def __post_init__(self) -> None:
        if self.compression and compression_named(self.compression) is None:
            raise PlanFormatError(f"node {self.name!r} of the plan names an unknown "
                                  f"compression {self.compression!r}",
                                  expected="a compression of autopar.values.compression",
                                  got=repr(self.compression),
                                  fix="plan again, or correct the plan's file")

    @property
    def time_s(self) -> float:
        """Compute plus the communication not hidden behind compute, plus a parameter's
        optimizer step."""
        return self.compute_s + self.comm_s - self.hidden_s + self.optimizer_s


@dataclass(frozen=True)
class SolverReport:
    """What the solver proved: objective (s), lower bound, relative gap, status, wall time;
    `exposed_reductions` and `exposed_gathers`: the fractions of the plan's background
    gradient reductions and parameter gathers its compute does not hide, the charges of a
    further overlap round (`autopar.planning.graph.plan_table`). `planning_s`: the whole
    planning call's wall seconds, against its `time_limit_s` (0: not recorded);
    `cut_short`: the limit ran out with this solve's gap open; `memory_free`: the
    objective of the same problem's best answer without its memory limit (at least its
    optimum; None where not searched): the plan's objective is at least `objective -
    memory_free` above the memory-free optimum."""

    objective: float
    bound: float
    gap: float
    status: str
    wall_time_s: float
    decisions: int
    tied: int
    exposed_reductions: float = 1.0
    exposed_gathers: float = 1.0
    planning_s: float = 0.0
    time_limit_s: float = 0.0
    cut_short: bool = False
    memory_free: float | None = None


@dataclass(frozen=True)
class HandStrategyRecord:
    """A standard hand-written strategy (data parallel, ZeRO-3, Megatron, ...) planned for
    the same model, mesh and cost model, for comparison with the solver's plan. Times are
    seconds per training step, bytes per device; `comm_bytes` lists (collective kind, axis,
    "forward"/"backward", bytes). `fits` says whether its peak memory is within the plan's
    memory limit; `note` says why it is not applicable when `step_time_s` is None."""

    name: str
    description: str
    step_time_s: float | None
    compute_s: float | None
    comm_s: float | None
    peak_memory_bytes: float | None
    comm_bytes: tuple[tuple[str, str, str, float], ...] = ()
    fits: bool = False
    note: str = ""
    hidden_comm_s: float = 0.0
    optimizer_s: float = 0.0


@dataclass(frozen=True)
class StageRecord:
    """One pipeline stage: the blocks it runs (`blocks`: first and last module path; `units`
    their positions in the model's main ModuleList), the pipeline rank that runs it, its
    forward plus backward time for one micro-batch (`time_s`, with its boundary sends),
    the exposed time of what it reduces once per step (`once_s`), its memory per device at
    the peak with `in_flight` micro-batches' activations held, the tensors it receives and
    sends, and the state it holds that other stages hold too (`shared`)."""

    index: int
    rank: int
    blocks: tuple[str, str]
    units: tuple[int, int]
    time_s: float
    once_s: float
    memory_bytes: float
    in_flight: int
    receives: tuple[str, ...] = ()
    sends: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()


@dataclass(frozen=True)
class PipelineRecord:
    """The pipeline of a plan: mesh axis, schedule (torch's class name without "Schedule"),
    micro-batches, stages per rank (`virtual`), the stages, the modelled step time and
    bubble (`autopar.costs.schedule`), the intra-stage mesh (`sub_mesh`: the other axes), and
    the collectives every pipeline rank runs once per step over the pipeline axis
    (`transfers`: shared weights' gradient sums, the loss's broadcast)."""

    axis: str
    schedule: str
    microbatches: int
    virtual: int
    stages: tuple[StageRecord, ...]
    step_time_s: float
    bubble: float
    sub_mesh: Mesh
    transfers: tuple[TransferRecord, ...] = ()

    @property
    def ranks(self) -> int:
        return len(self.stages) // self.virtual


@dataclass(frozen=True)
class Plan:
    """A solved sharding plan. `nodes` are in graph order. `hand_strategies` holds the
    standard strategies evaluated alongside it (empty unless asked for). `optimizer` says
    what the memory of the parameters counts (`autopar.costs.optimizer_state`);
    `model_flops` is the whole model's FLOPs of one training step (see `mfu`). A step runs
    `microbatches` micro-batches one after the other (gradient accumulation): the nodes are
    one micro-batch's, their times and bytes the whole step's. `inputs` describes the flat
    example inputs it was planned for (`autopar.planning.entry.input_signature`) and `graph`
    a digest of the captured graph's ops and tensor shapes
    (`autopar.planning.entry.graph_digest`), which compiling it checks. A plan made with
    `training=False` (`training`) is of the forward alone: its step is one forward, its
    memory the weights and one forward's live tensors, and its FLOPs the forward's; with a
    KV cache (buffers the forward writes in place), `kv_cache_bytes` per device and the
    `kv_cache_tokens` it holds (sequences x positions). Its `outputs` are "whole" on every
    rank, or "sharded": left as the output node's input placements say. A decode plan
    planned with its prefill (`plan(..., prefill=P)`) records the prefill of `prefill_tokens`
    tokens per sequence, with the weights and cache where this plan stores them: its
    latency `prefill_s` (the time to first token) and its peak `prefill_peak_bytes`, the
    weights and cache placed for the "decode" program or for the "prefill"
    (`placed_for`: whichever makes a request shorter, `autopar.planning.prefill`). Its
    `objective` is "latency" (the step at the given batch) or "throughput": then `serving`
    lists each batch the planner tried with the tokens a second its plan serves (0: it did
    not fit), and the plan is of the batch that serves the most
    (`autopar.planning.throughput`).

    A pipelined plan (`pipeline` set) holds every stage's nodes, each with its `stage`, and
    their placements on the whole mesh: replicated on the pipeline axis, which places
    stages rather than splitting tensors; `stage_plan(k)` is stage k's own plan on the
    other axes. Its step time is the schedule's, its bytes per pipeline rank."""

    model: str
    mesh: Mesh
    nodes: tuple[NodePlan, ...]
    solver: SolverReport
    memory_limit_bytes: float
    peak_memory_bytes: float
    sizes: tuple[tuple[str, int], ...] = ()
    warnings: tuple[str, ...] = ()
    hand_strategies: tuple[HandStrategyRecord, ...] = ()
    optimizer: str = "AdamW (2 states in the parameter's dtype)"
    model_flops: float = 0.0
    microbatches: int = 1
    inputs: tuple[str, ...] = ()
    graph: str = ""
    pipeline: PipelineRecord | None = None
    training: bool = True
    kv_cache_bytes: float = 0.0
    kv_cache_tokens: int = 0
    outputs: str = "whole"
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    prefill_peak_bytes: float = 0.0
    placed_for: str = "decode"
    objective: str = "latency"
    serving: tuple[tuple[int, float], ...] = ()
    version: int = FORMAT_VERSION

    @property
    def serving_batch(self) -> int | None:
        """The batch a throughput search kept: the one of `serving` with the most tokens a
        second (None for a plan made for its latency)."""
        return max(self.serving, key=lambda tried: tried[1])[0] if self.serving else None

    @property
    def compute_s(self) -> float:
        return sum(n.compute_s for n in self.nodes)

    @property
    def comm_s(self) -> float:
        """Time of every collective, hidden or not."""
        return sum(n.comm_s for n in self.nodes)

    @property
    def hidden_comm_s(self) -> float:
        """Communication that overlaps compute (gradient all-reduces in the backward)."""
        return sum(n.hidden_s for n in self.nodes)

    @property
    def exposed_comm_s(self) -> float:
        return self.comm_s - self.hidden_comm_s

    @property
    def optimizer_s(self) -> float:
        """The optimizer's step: every parameter piece's, one after the other."""
        return sum(n.optimizer_s for n in self.nodes)

    @property
    def step_time_s(self) -> float:
        """Predicted time of one training step (forward, backward and the optimizer's
        step), seconds: compute plus the communication not hidden behind it plus the
        optimizer; for a pipeline, its schedule's step; for a forward-only plan
        (`training` False), the forward's latency."""
        if self.pipeline is not None:
            return self.pipeline.step_time_s
        return self.compute_s + self.exposed_comm_s + self.optimizer_s

    @property
    def mfu(self) -> float | None:
        """Predicted model FLOPs utilisation: the model's FLOPs of one step (forward plus,
        when training, twice it for the backward, recomputation not counted) over the step
        time times the devices times their bfloat16 peak. None for a plan without FLOPs."""
        if not self.model_flops or not self.step_time_s:
            return None
        import torch

        peak = self.mesh.hardware.flops_per_second(torch.bfloat16)
        return self.model_flops / (self.step_time_s * self.mesh.size * peak)

    def node(self, name: str) -> NodePlan:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def comm_bytes(self, pipeline_rank: int | None = None) -> dict[tuple[str, str, str], float]:
        """Per-rank bytes by (collective kind, mesh axis, "forward"/"backward"). For a
        pipeline, those of the ranks at `pipeline_rank` on its axis (their stages' and the
        pipeline's own), or with None the sum over the pipeline ranks."""
        totals: dict[tuple[str, str, str], float] = defaultdict(float)
        pipeline = self.pipeline
        stages = None if pipeline is None or pipeline_rank is None else {
            s.index for s in pipeline.stages if s.rank == pipeline_rank}
        extra = () if pipeline is None else pipeline.transfers * (
            1 if pipeline_rank is not None else pipeline.ranks)
        for t in (*(t for node in self.nodes if stages is None or node.stage in stages
                    for t in node.transfers), *extra):
            totals[(t.kind, t.axis, "backward" if t.backward else "forward")] += t.nbytes
        return dict(sorted(totals.items()))

    def rank_comm_bytes(self, coordinate: tuple[int, ...]) -> dict[tuple[str, str, str], float]:
        """`comm_bytes` of the rank at mesh `coordinate`: its pipeline rank's, for a
        pipeline (the other axes' ranks of a stage move the same bytes)."""
        if self.pipeline is None:
            return self.comm_bytes()
        return self.comm_bytes(coordinate[self.mesh.axis_index(self.pipeline.axis)])

    def stage_plan(self, index: int) -> Plan:
        """Stage `index`'s own plan, on the pipeline's other axes (`sub_mesh`)."""
        pipeline = self.pipeline
        assert pipeline is not None, "not a pipelined plan"
        axis = self.mesh.axis_index(pipeline.axis)
        nodes = tuple(dataclasses.replace(
            n, inputs=tuple(drop_axis(p, axis) for p in n.inputs), output=drop_axis(n.output, axis),
            gathered=drop_axis(n.gathered, axis) if n.gathered else "")
            for n in self.nodes if n.stage == index)
        record = pipeline.stages[index]
        return dataclasses.replace(self, mesh=pipeline.sub_mesh, nodes=nodes, pipeline=None,
                                   peak_memory_bytes=record.memory_bytes,
                                   hand_strategies=())

    def step_time(self, **sizes: int) -> float:
        """Predicted step time at other symbolic sizes (by symbol name, e.g. `s0=64`)."""
        values = dict(self.sizes) | sizes
        symbols = {sympy.Symbol(k): v for k, v in values.items()}
        return float(sum(sympy.sympify(n.formula).subs(symbols) for n in self.nodes))

    def __getattr__(self, name: str):
        # Presentation depends on the plan, never the reverse: the text summary, the HTML
        # report and the DOT drawing are functions of the package, not methods.
        moved = {"summary": "autopar.summary(plan)", "report": "autopar.report(plan, path)",
                 "to_dot": "autopar.to_dot(plan)"}
        if name in moved:
            raise AttributeError(f"a Plan has no method {name}: call {moved[name]}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def to_dict(self) -> dict:
        data = asdict(self)
        data["mesh"] = self.mesh.to_dict()
        if self.pipeline is not None:
            data["pipeline"]["sub_mesh"] = self.pipeline.sub_mesh.to_dict()
        return {"format": "autopar-plan", **data}

    @classmethod
    def from_dict(cls, data: dict) -> Plan:
        if not isinstance(data, dict) or data.get("format") != "autopar-plan":
            raise PlanFormatError("not an autopar plan", expected='{"format": "autopar-plan"}',
                                  got=type(data).__name__, fix="pass a file made by plan.save")
        version = data.get("version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise PlanFormatError(
                f"plan format version {version!r} is newer than this autopar reads",
                expected=f"version <= {FORMAT_VERSION}", got=repr(version),
                fix="upgrade autopar, or re-plan the model with this version")
        try:
            nodes = tuple(NodePlan(**{**n, "inputs": tuple(n["inputs"]),
                                      "transfers": tuple(TransferRecord(**t)
                                                         for t in n["transfers"])})
                          for n in data["nodes"])
            return cls(model=data["model"], mesh=Mesh.from_dict(data["mesh"]), nodes=nodes,
                       solver=SolverReport(**data["solver"]),
                       memory_limit_bytes=data["memory_limit_bytes"],
                       peak_memory_bytes=data["peak_memory_bytes"],
                       sizes=tuple((k, v) for k, v in data["sizes"]),
                       warnings=tuple(data["warnings"]),
                       hand_strategies=tuple(
                           HandStrategyRecord(**{**h, "comm_bytes": tuple(
                               tuple(row) for row in h.get("comm_bytes", ()))})
                           for h in data.get("hand_strategies", ())),
                       inputs=tuple(data.get("inputs", ())), graph=data.get("graph", ""),
                       pipeline=_pipeline_from_dict(data.get("pipeline")),
                       **{key: data[key] for key in ("optimizer", "model_flops",
                                                     "microbatches", "training",
                                                     "kv_cache_bytes", "kv_cache_tokens",
                                                     "outputs", "prefill_tokens", "prefill_s",
                                                     "prefill_peak_bytes", "placed_for",
                                                     "objective")
                          if key in data},
                       serving=tuple((int(b), float(t)) for b, t in data.get("serving", ())),
                       version=version)
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanFormatError(f"plan file is corrupt: {exc!r}",
                                  expected=f"the fields {[f.name for f in fields(cls)]}",
                                  got=", ".join(sorted(data)),
                                  fix="re-create it with autopar.plan(...).save(path)") from exc

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PlanFormatError(f"cannot read plan file {path}: {exc}",
                                  expected="a JSON file written by Plan.save", got=str(path),
                                  fix="check the path, or re-create the plan") from exc
        return cls.from_dict(data)


def _pipeline_from_dict(data: dict | None) -> PipelineRecord | None:
    if data is None:
        return None
    stages = tuple(StageRecord(**{**s, **{key: tuple(s[key]) for key in (
        "blocks", "units", "receives", "sends", "shared")}}) for s in data["stages"])
    return PipelineRecord(**{**data, "stages": stages, "sub_mesh": Mesh.from_dict(
        data["sub_mesh"]), "transfers": tuple(TransferRecord(**t) for t in data["transfers"])})


def insert_axis(placements: str, axis: int) -> str:
    """`"S(0),R"` with a replicated entry inserted at mesh axis `axis`."""
    parts = placements.split(",")
    return ",".join([*parts[:axis], "R", *parts[axis:]])


def drop_axis(placements: str, axis: int) -> str:
    """`"S(0),R,R"` without mesh axis `axis`'s entry."""
    parts = placements.split(",")
    return ",".join(parts[:axis] + parts[axis + 1:])


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
