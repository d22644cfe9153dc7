"""What a plan predicts one device holds at the end of the forward, split by kind.

The solve bounds the peak of a per-device usage profile (`ShardingProblem.peak_usage`, built
by `autopar.passes.problem.build_problem`). Training's usage grows through the forward (every kept
activation is added) and the backward frees activations faster than it makes gradients,
so the end of the forward is where a plan's peak lies (`MemoryBreakdown.total` equals the
profile at its last step). `predicted_memory` splits that instant by kind, from each
node's `NodePlan.memory_bytes` and `output` placements, so that each part can be checked
against what a rank really holds (`autopar.runtime.memory_probe`).

Per parameter node, with `stored = local_bytes(nbytes, output)` (its dtype) and
`elements = local_bytes(numel, output)`, build_problem's `parameter_bytes` is

    memory_bytes = stored                              -> parameters
                 + stored                              -> gradients (the parameter's dtype)
                 + elements x element_bytes(dtype)     -> optimizer_states (states + master)
                 + saving uses x local_bytes(nbytes, gathered)   -> gathered (ZeRO-2 copies;
                   ZeRO-1: uses x 2 x local_bytes(nbytes, gathered), copies and their gradients)

so `gathered` is what is left of `memory_bytes` after the first three (0 unless the node is
kept gathered). Buffers, constants and user inputs are held whole-step at their placement
(`buffers`, `inputs`: `memory_bytes`). An op on the gradient path keeps its output from its
op to the end of the forward: `activations` sums their `memory_bytes` (views count 0 there);
a recomputed op keeps nothing, but the first block of a tie group carries its recomputed
outputs as the one block the backward rebuilds at a time: those bytes are
`recompute_reserve`, not held at the end of the forward. An op off the gradient path (a
mask, a position table) lives until its last use: it counts (`transient`) only when that
use is the graph's output.

The plan has no graph structure (which ops are on the gradient path) nor parameter shapes,
so `predicted_memory` reads both from the annotated graph the plan was made from
(`graph_of(model, inputs)`: capture + annotate, the same as `autopar.plan` and
`autopar.compile` do).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx, nn

from autopar.costs.optimizer_state import ADAMW, OptimizerState
from autopar.passes.capturing.gradient_path import gradient_path
from autopar.passes.problem.build_problem import stored_parameter_bytes
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
    copies; `activations` the outputs of kept ops on the gradient path, `recompute_reserve`
    the first tied block's recomputed outputs (charged, not held at this instant),
    `transient` ops off the gradient path still live; `per_parameter` the parameter parts
    by name (graph order)."""

    parameters: float
    gathered: float
    gradients: float
    optimizer_states: float
    buffers: float
    inputs: float
    activations: float
    recompute_reserve: float
    transient: float
    per_parameter: tuple[ParameterMemory, ...] = ()

    @property
    def total(self) -> float:
        """The plan's usage profile at the end of the forward (its peak when the peak lies
        there, as it does for training graphs whose kept activations grow to the end)."""
        return (self.parameters + self.gathered + self.gradients + self.optimizer_states
                + self.buffers + self.inputs + self.activations + self.recompute_reserve
                + self.transient)


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
    mesh_shape = plan.mesh.shape
    totals = dict.fromkeys(("parameters", "gathered", "gradients", "optimizer_states",
                            "buffers", "inputs", "activations", "recompute_reserve",
                            "transient"), 0.0)
    per_parameter = []
    for node in plan.nodes:
        fx_node = by_name[node.name]
        if node.role == "parameter":
            part = _parameter(node.name, fx_node, node.memory_bytes,
                              parse_placements(node.output), mesh_shape, optimizer)
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
            if on_path[node.name]:
                totals["recompute_reserve" if node.recompute else "activations"] += \
                    node.memory_bytes
            elif _live_at_output(fx_node, planned):
                totals["transient"] += node.memory_bytes
    return MemoryBreakdown(**totals, per_parameter=tuple(per_parameter))


def _parameter(name: str, node: fx.Node, memory_bytes: float, placements,
               mesh_shape: tuple[int, ...], optimizer: OptimizerState) -> ParameterMemory:
    spec: TensorSpec = node.meta[TENSOR]
    stored, states = map(float, stored_parameter_bytes(spec, placements, mesh_shape,
                                                       optimizer))
    gathered = memory_bytes - 2 * stored - states
    if gathered < -_SLACK:
        raise ValueError(
            f"parameter {name}: the plan counts {memory_bytes:.0f} bytes, less than its piece, "
            f"gradient and {optimizer.describe()} states ({2 * stored + states:.0f}): the plan "
            "was made for another optimizer")
    return ParameterMemory(node.meta[NAMES][0], stored, stored, states,
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
