"""What a plan predicts one device holds at the end of the forward, split by kind.

The solve bounds the peak of a per-device usage profile over a training step's timeline
(`ShardingProblem.peak_usage`, built by `autopar.passes.problem.build_problem`): the
forward, the backward and the optimizer's step. `predicted_memory` splits the end of the
forward by kind (`MemoryBreakdown.total` is the profile there; the step's peak lies at
or after it, where the backward's gradients and temporaries add to what the forward kept),
from each node's `NodePlan.memory_bytes` and `output` placements, so that each part can be
checked against what a rank really holds (`autopar.runtime.memory_probe`).

Per parameter node, with `stored = local_bytes(nbytes, output)` (its dtype) and
`elements = local_bytes(numel, output)`, op_costs' `parameter_bytes` is

    memory_bytes = stored                              -> parameters
                 + stored                              -> gradients (the parameter's dtype)
                 + elements x element_bytes(dtype)     -> optimizer_states (states + master)
                 + saving uses x local_bytes(nbytes, gathered)   -> gathered (ZeRO-2 copies;
                   ZeRO-1: uses x 2 x local_bytes(nbytes, gathered), copies and their gradients)

so `gathered` is what is left of `memory_bytes` after the first three (0 unless the node is
kept gathered). A frozen parameter (`gradient_path.trained` false) has no gradient nor
optimizer states: only the first line and the gathered copies. Buffers, constants and user
inputs are held whole-step at their placement (`buffers`, `inputs`: `memory_bytes`). An op
on the gradient path keeps its output from its op to the end of the forward:
`activations` sums their `memory_bytes` (views count 0 there), less `copies`; a recomputed
op keeps none of its outputs (the backward rebuilds them). With one
micro-batch, the gradients are made in the backward: counted in `gradients`, not in
`total`. An op off the gradient path (a
mask, a position table) lives until its last use: it counts (`transient`) only when that
use is the graph's output.

`copies` are the tensors edges convert for a consumer that keeps what it reads
(build_problem's edge usages, `passes/problem/edge_costs.held_bytes`): a tensor
converted (all-gathered, all-reduced, reduce-scattered, all-to-all'd, or sliced and copied
out) into the placement its consumer reads and saves. Per such edge (`kept_reads`; not a
parameter's, whose copies are `gathered`),

    copies += local_bytes(nbytes, read)     when read != output

which the plan counts in the consumer's `memory_bytes` and is taken out of its category
here: held to the end of the forward whatever the consumer (a recomputed one rebuilds its
output in the backward, its saved inputs are held as any op's; one off the gradient path,
a view of an integer tensor the loss keeps, is held as well). An edge that is the only way its
producer's output is kept charges that output to the producer's `memory_bytes` when it
does not convert it (so in `activations`), and nothing when it does (the output is freed
after the conversion). One micro-batch in flight: a plan of one stage. Not at this
instant, so not here: a context-parallel ring's blocks in flight, charged at its
attention's step.

The plan has no graph structure (which ops are on the gradient path, which inputs ops save)
nor parameter shapes, so `predicted_memory` reads them from the annotated graph the plan was
made from (`graph_of(model, inputs)`: capture + annotate, the same as `autopar.plan` and
`autopar.compile` do; `find_saved` runs its ops once on fake tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx, nn

from autopar.costs.optimizer_state import ADAMW, OptimizerState
from autopar.passes.capturing.find_saved import find_saved
from autopar.passes.capturing.gradient_path import gradient_path, trained
from autopar.passes.problem.build_problem import kept_reads, tensor_leaves
from autopar.passes.problem.edge_costs import copy_bytes
from autopar.passes.problem.op_costs import stored_parameter_bytes
from autopar.passes.strategies.find_strategies import producer_of
from autopar.values.mesh import Mesh
from autopar.values.placement import parse_placements
from autopar.values.plan import Plan
from autopar.values.specs import NAMES, ROLE, TENSOR, TensorSpec

# Bytes within which the derived ZeRO-2 remainder is taken as 0 (memory_bytes is a float
# sum of integers; anything above this is a real copy or an inconsistent optimizer).
_SLACK = 0.5


@dataclass(frozen=True)
class ParameterMemory:
    """One parameter's predicted bytes on one device: `name` is its canonical name."""

    name: str
    parameter: float
    gradient: float
    optimizer_states: float
    gathered: float


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes one device holds at the end of the forward, by kind (see the module docstring).

    `parameters` are the stored pieces, `gathered` the ZeRO-2 gathered copies kept until
    the backward, `optimizer_states` the optimizer's parameter-shaped states plus master
    copies; `activations` the outputs of kept ops on the gradient path, `copies` the
    converted tensors their consumers keep (see the module docstring), `transient` ops off
    the gradient path still live; `per_parameter` the parameter parts by name (graph
    order); `gradients` the parameters' gradients, held from the backward that makes them
    when `gradients_later`."""

    parameters: float
    gathered: float
    gradients: float
    optimizer_states: float
    buffers: float
    inputs: float
    activations: float
    transient: float
    copies: float = 0.0
    per_parameter: tuple[ParameterMemory, ...] = ()
    # Whether the gradients are made in the backward (one micro-batch), so not yet held
    # at the end of the forward.
    gradients_later: bool = False

    @property
    def total(self) -> float:
        """The plan's usage profile at the end of the forward (the step's peak lies at or
        after it: the backward's gradients and temporaries, `Plan.peak_memory_bytes`)."""
        return (self.parameters + self.gathered + self.optimizer_states + self.buffers
                + self.inputs + self.activations + self.copies + self.transient
                + (0.0 if self.gradients_later else self.gradients))


def graph_of(model: nn.Module, example_inputs: tuple) -> fx.GraphModule:
    """The annotated graph `autopar.plan(model, mesh, example_inputs)` plans (capture then
    annotate; no process group, works on `meta` models)."""
    from autopar.passes.capturing.annotate import annotate
    from autopar.passes.capturing.capture import capture

    return annotate(capture(model, tuple(example_inputs)))


def predicted_memory(plan: Plan, graph: fx.GraphModule,
                     optimizer: OptimizerState = ADAMW) -> MemoryBreakdown:
    """The plan's bytes per device at the end of the forward, split by kind.

    `graph` is the annotated graph the plan was made from (`graph_of`), `optimizer` the
    `OptimizerState` the plan was made with (`autopar.costs.optimizer_state(...)`; AdamW is the
    default of `autopar.plan` and `autopar.compile`). Pure: reads the plan and the graph.
    Raises ValueError when a plan node is missing from the graph or a parameter's
    `memory_bytes` is less than its piece, gradient and states (another optimizer).
    """
    by_name = {n.name: n for n in graph.graph.nodes}
    planned = {n.name for n in plan.nodes}
    missing = planned - set(by_name)
    if missing:
        raise ValueError(f"plan nodes {sorted(missing)[:5]} are not in the graph: "
                         "give the graph of the model and inputs the plan was made for")
    on_path = gradient_path(graph)
    totals = dict.fromkeys(("parameters", "gathered", "gradients", "optimizer_states",
                            "buffers", "inputs", "activations", "transient", "copies"), 0.0)
    copies = _copies(plan, graph)
    per_parameter = []
    for node in plan.nodes:
        fx_node = by_name[node.name]
        if node.role == "parameter":
            part = _parameter(node.name, fx_node, node.memory_bytes,
                              parse_placements(node.output), plan.mesh, optimizer)
            per_parameter.append(part)
            totals["parameters"] += part.parameter
            totals["gradients"] += part.gradient
            totals["optimizer_states"] += part.optimizer_states
            totals["gathered"] += part.gathered
        elif node.role in ("buffer", "constant"):
            totals["buffers"] += node.memory_bytes
        elif node.role == "input":
            totals["inputs"] += node.memory_bytes
        elif node.role == "op":
            own = node.memory_bytes - copies.get(node.name, 0.0)
            totals["copies"] += copies.get(node.name, 0.0)
            if on_path[node.name]:
                totals["activations"] += own
            elif _live_at_output(fx_node, planned):
                totals["transient"] += own
    return MemoryBreakdown(**totals, per_parameter=tuple(per_parameter),
                           gradients_later=plan.microbatches == 1)


def _copies(plan: Plan, graph: fx.GraphModule) -> dict[str, float]:
    """Per op, the bytes of the converted tensors it keeps (the module docstring), which
    its `memory_bytes` counts."""
    placed = {n.name: n for n in plan.nodes}
    on_path = gradient_path(graph)
    reads = kept_reads(graph, find_saved(graph), on_path)
    copies: dict[str, float] = {}
    for node in graph.graph.nodes:
        consumer = placed.get(node.name)
        if consumer is None or consumer.role != "op":
            continue
        for position, leaf in enumerate(tensor_leaves(node)):
            producer = placed.get(producer_of(leaf).name)
            if (node.name, position) not in reads or producer is None \
                    or producer.role == "parameter":
                continue
            copies[node.name] = copies.get(node.name, 0.0) + float(copy_bytes(
                leaf.meta[TENSOR].nbytes, parse_placements(producer.output),
                parse_placements(consumer.inputs[position]), plan.mesh.shape,
                off_path=not on_path[producer.name]))
    return copies


def _parameter(name: str, node: fx.Node, memory_bytes: float, placements,
               mesh: Mesh, optimizer: OptimizerState) -> ParameterMemory:
    spec: TensorSpec = node.meta[TENSOR]
    stored, states = map(float, stored_parameter_bytes(spec, placements, mesh.shape,
                                                       optimizer, mesh.shares))
    gradient = stored
    if not trained(node):  # frozen: no gradient, master copy or optimizer states
        gradient = states = 0.0
    gathered = memory_bytes - stored - gradient - states
    if gathered < -_SLACK:
        raise ValueError(
            f"parameter {name}: the plan counts {memory_bytes:.0f} bytes, less than its piece, "
            f"gradient and {optimizer.describe()} states ({stored + gradient + states:.0f}): "
            "the plan was made for another optimizer")
    return ParameterMemory(node.meta[NAMES][0], stored, gradient, states,
                           gathered if gathered > _SLACK else 0.0)


def _live_at_output(node: fx.Node, decisions: set[str]) -> bool:
    """Whether an op off the gradient path is read by the graph's output (through
    pass-through nodes such as getitem), so lives to the end of the forward."""
    for user in node.users:
        if user.op == "output":
            return True
        if user.name not in decisions and _live_at_output(user, decisions):
            return True
    return False


def parameter_dtype(graph: fx.GraphModule, name: str) -> torch.dtype:
    """The dtype of parameter `name` in `graph` (KeyError if none has that name)."""
    for node in graph.graph.nodes:
        if node.op == "placeholder" and node.meta.get(ROLE) == "parameter" \
                and name in node.meta[NAMES]:
            return node.meta[TENSOR].dtype
    raise KeyError(name)
