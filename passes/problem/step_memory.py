"""Problem pass, memory: a training step's timeline, and what its backward and optimizer
step hold on it besides what the forward keeps.

The problem's memory is a usage profile over time steps (`autopar.solver.ShardingProblem`),
so that its peak is where a run reaches it: at the start of the backward on the loss's
gradients, in a recomputed block's backward, or in the optimizer's step for a model whose
state outweighs its activations. `Timeline` numbers the steps: the T decision nodes in
graph order (the forward), the same in reverse (the backward: node i's at 2T - 1 - i),
then the optimizer's step, one per parameter node when the device steps one tensor at a
time (torch's default on CPU: the profile's `multi_tensor_optimizer` false), else one.
`build_problem` places what the forward keeps on it (an op's kept tensors from its step to
its backward, `Timeline.freed`); `BackwardUsages` adds, as `EdgeUsage`s:

- made: at an op's backward, the gradient of each input a gradient flows to, at the
  placement the op reads it (before a conversion's backward brings it to its producer's),
  and one of each tensor it saves inside (a fused op's intermediates: log-softmax's output
  in a cross-entropy), divided as its work is; a view makes a view;
- held: an op's output gradient at its output placement, from the step after its last
  reader's backward (through views: the reader of a view makes the gradient its base
  receives) to its own, which consumes it; a parameter's, with one micro-batch, from its
  last reader's backward to the end of the step (the optimizer's step reads it; with
  several micro-batches it is accumulated from the first and held the whole step, in the
  parameter's own usage);
- rebuilt: the outputs a recomputed op would keep, from the backward of the last op of its
  recompute region (or of its last reader, later), which rebuilds the region, to its own;
- converted (`EdgeCache.transients`): at a consumer's step, the converted tensor it reads
  and does not keep; at its backward, the gradient converted to the placement its producer
  needs and a ZeRO-3 parameter's copy gathered again; each conversion with its staging
  buffers (`autopar.costs.staging`: the pieces an all-to-all receives, a gather's result
  before it is laid out along its dim);
- ring blocks: a context-parallel attention's key and value block in hand and the one
  arriving (two of `Ring.kv_bytes`) at its step, each with its gradients
  (`Ring.grad_bytes`) at its backward;
- the optimizer's temporaries (`OptimizerState.temporary_bytes`) of each parameter at its
  step, for all the parameters a folded node stands for at once on a multi-tensor step;
- kernel workspaces (`autopar.costs.workspace`: a convolution's reordered operands) at an
  op's step and at its backward's.

Everything the backward adds is one micro-batch's and counted once: the backward runs one
block at a time, however many micro-batches are in flight or blocks a folded node stands
for. Usages of one end alone are carried by an edge usage constant along its other end, so
the solver's relaxation of edge usages is exact for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch.fx as fx

from autopar.costs import formulas, uneven, workspace
from autopar.passes.capturing.gradient_path import tensor_outputs
from autopar.passes.problem.edge_costs import EdgeRef
from autopar.passes.strategies.offer_recompute import recompute_region
from autopar.rules.attention import RING_TARGETS
from autopar.solver.problem import EdgeUsage
from autopar.values.specs import ROLE


def held_copies(node: fx.Node, on_path: bool, in_flight: int) -> int:
    """How many micro-batches' own usage `node` holds: state, once; a user or boundary
    input, or what an op on the gradient path (`on_path`) keeps, each of the `in_flight`."""
    if node.meta.get(ROLE) == "input" or (node.op == "call_function" and on_path):
        return in_flight
    return 1


def microbatch_copies(node: fx.Node, on_path: bool, in_flight: int) -> int:
    """How many of its `held_copies` the node's own interval holds: all, but for an op
    on the gradient path with more than one micro-batch in flight the one whose backward
    runs first, which frees it at the op's backward (`BackwardUsages.current`;
    the others' are held to the end of the backward, `Timeline.freed`)."""
    copies = held_copies(node, on_path, in_flight)
    if node.op == "call_function" and copies > 1:
        return copies - 1
    return copies


@dataclass(frozen=True)
class Timeline:
    """The time steps of one training step (module docstring): `forward` decision nodes,
    the `parameters` among them (indices), whether the optimizer steps one tensor at a
    time (`per_tensor`), and the micro-batches whose activations are held at once."""

    forward: int
    parameters: tuple[int, ...]
    per_tensor: bool
    in_flight: int = 1

    @property
    def steps(self) -> int:
        return 2 * self.forward + (max(1, len(self.parameters)) if self.per_tensor else 1)

    def backward_step(self, index: int) -> int:
        """The time step of the backward of the decision node at `index`."""
        return 2 * self.forward - 1 - index

    def freed(self, index: int) -> int:
        """The time step from which what the node at `index` keeps for the backward is
        freed: the step after its backward; with several micro-batches in flight (a
        pipeline stage) the others' are still held, so none before the backward's end."""
        if self.in_flight > 1:
            return 2 * self.forward
        return self.backward_step(index) + 1

    def optimizer_step(self, index: int) -> int:
        """The time step of the optimizer's step of the parameter node at `index`."""
        return 2 * self.forward + (self.parameters.index(index) if self.per_tensor else 0)


class BackwardUsages:
    """The `EdgeUsage`s of the backward and the optimizer's step (module docstring) of the
    problem `builder` (`build_problem`'s, which calls this module: its graph, strategies,
    mesh and `Timeline`) is building, with its `edges`."""

    def __init__(self, builder, edges: tuple[EdgeRef, ...]) -> None:
        self.b, self.edges = builder, edges
        self.timeline = builder.timeline
        self.first_input: dict[str, str] = {}
        self.first_reader: dict[str, str] = {}
        for ref in edges:
            self.first_input.setdefault(ref.consumer, ref.producer)
            self.first_reader.setdefault(ref.producer, ref.consumer)
        self.region_end: dict[str, int] = {}  # recompute region -> its last node's index
        for i, name in enumerate(builder.order):
            self.region_end[recompute_region(builder.by_name[name])] = i

    def all(self) -> tuple[EdgeUsage, ...]:
        usages = (*self.current(), *self.made(), *self.held(), *self.parameters(),
                  *self.converted(), *self.rings(), *self.workspaces())
        return tuple(u for u in usages if u.usages.any())

    def current(self):
        """With several micro-batches in flight, what each op on the gradient path keeps for
        the one whose backward runs first, from the op's step to its backward: freed there,
        while the others' are held to the backward's end (`microbatch_copies`)."""
        b, timeline = self.b, self.timeline
        if timeline.in_flight == 1:
            return
        for name in b.order:
            node = b.by_name[name]
            if node.op != "call_function" or not b.on_path[name] or name not in self.first_input:
                continue
            index = b.index[name]
            own = b.own_usages(node, b.table.strategies[name]) * b.repeats[index]
            yield self._one_end(self.first_input[name], name, own,
                                (index, timeline.backward_step(index) + 1))

    def made(self):
        """At each op's backward, its inputs' gradients at the placements it reads."""
        b = self.b
        for ref in self.edges:
            consumer = b.by_name[ref.consumer]
            if not ref.requires_grad or ref.consumer_is_view or consumer.op != "call_function":
                continue
            made = np.array([float(formulas.local_bytes(
                uneven.cost_bytes(ref.tensor, b.mesh), st.inputs[ref.position], b.mesh.shape))
                for st in b.table.strategies[ref.consumer]])
            step = self.timeline.backward_step(b.index[ref.consumer])
            yield self._one_end(ref.producer, ref.consumer, made, (step, step + 1))

    def held(self):
        """Per op that writes its output: its output gradient from its last reader's
        backward to its own, what it saves inside made again at its own, and its outputs
        rebuilt when recomputed."""
        b, timeline = self.b, self.timeline
        for name in b.order:
            node = b.by_name[name]
            if node.op != "call_function" or not b.on_path[name] \
                    or name not in self.first_input or b.moves_no_bytes(node):
                continue
            strategies = b.table.strategies[name]
            floating = frozenset(k for k, spec in enumerate(tensor_outputs(node))
                                 if spec.dtype.is_floating_point)
            entry = b.saved.get(name)
            own, last = timeline.backward_step(b.index[name]), self._last_reader(node)
            rebuilt_at = timeline.backward_step(
                max(last, self.region_end[recompute_region(node)]))
            for values, interval in (
                    ([b.output_bytes(node, st, floating) for st in strategies],
                     (timeline.backward_step(last) + 1, own + 1)),
                    ([entry.internal_bytes / formulas.compute_divisor(
                        st.inputs, st.output, b.mesh.shape) if entry else 0.0
                      for st in strategies], (own, own + 1)),
                    ([b.output_bytes(node, st, b.kept.get(name)) if st.recompute else 0.0
                      for st in strategies], (rebuilt_at, own + 1))):
                if interval[0] < interval[1]:
                    yield self._one_end(self.first_input[name], name,
                                        np.array(values, dtype=float), interval)

    def parameters(self):
        """Per parameter node, with `timed_gradients`, its gradient at its stored placement
        from its last reader's backward to the end of the step, for the parameters the node
        stands for; and its optimizer step's temporaries at its step."""
        b, timeline = self.b, self.timeline
        multi_tensor = not timeline.per_tensor
        for index in timeline.parameters:
            name = b.order[index]
            if name not in self.first_reader:
                continue
            spec, strategies = tensor_outputs(b.by_name[name])[0], b.table.strategies[name]
            step, repeats = timeline.optimizer_step(index), b.repeats[index]
            last = timeline.backward_step(self._last_reader(b.by_name[name]))
            temporary = b.optimizer.temporary_bytes(spec.dtype, multi_tensor=multi_tensor)
            for per_element, times, interval in (
                    (spec.itemsize if b.timed_gradients else 0.0, repeats,
                     (last + 1, timeline.steps)),
                    (temporary, repeats if multi_tensor else 1, (step, step + 1))):
                values = np.array([times * per_element * float(formulas.local_bytes(
                    spec.numel, st.output, b.mesh.shape)) for st in strategies])
                reader = self.first_reader[name]
                yield EdgeUsage((index, b.index[reader]), np.broadcast_to(
                    values[:, None], (values.size, len(b.table.strategies[reader]))), interval)

    def converted(self):
        """What each edge's conversions make and nothing keeps (`EdgeCache.transients`):
        at its consumer's step in the forward, at its backward's in the backward; 0 where
        the edge's cost forbids the pair."""
        b = self.b
        for ref in self.edges:
            src, dst = b.table.strategies[ref.producer], b.table.strategies[ref.consumer]
            c = b.index[ref.consumer]
            finite = np.isfinite(b.edge_matrix(ref))
            for matrix, step in zip(b.edge_cache.transients(ref, src, dst),
                                    (c, self.timeline.backward_step(c))):
                yield EdgeUsage((b.index[ref.producer], c), np.where(finite, matrix, 0.0),
                                (step, step + 1))

    def rings(self):
        """A context-parallel attention's ring blocks in flight besides its own, in its
        forward and its backward."""
        b = self.b
        for name in b.order:
            node = b.by_name[name]
            if node.op != "call_function" or node.target not in RING_TARGETS \
                    or name not in self.first_input:
                continue
            rings = [b.ring(node, st) for st in b.table.strategies[name]]
            c, back = b.index[name], self.timeline.backward_step(b.index[name])
            yield self._one_end(self.first_input[name], name, np.array(
                [0.0 if r is None else 2 * float(r.kv_bytes) for r in rings]), (c, c + 1))
            if b.on_path[name]:
                yield self._one_end(self.first_input[name], name, np.array(
                    [0.0 if r is None else 2 * float(r.kv_bytes + r.grad_bytes)
                     for r in rings]), (back, back + 1))

    def workspaces(self):
        """Each op's kernel workspace at its step, and its backward's at its backward."""
        b = self.b
        operands: dict[str, dict[int, int]] = {}
        for ref in self.edges:
            operands.setdefault(ref.consumer, {})[ref.position] = uneven.cost_bytes(
                ref.tensor, b.mesh)
        for name, sizes in operands.items():
            node = b.by_name[name]
            family = formulas.kernel_family(node.target)
            if node.op != "call_function" or family not in workspace.FAMILIES:
                continue
            output = uneven.cost_bytes(tensor_outputs(node)[0], b.mesh)
            spaces = [workspace.kernel_workspace(family, tuple(
                float(formulas.local_bytes(sizes[k], st.inputs[k], b.mesh.shape))
                for k in sorted(sizes)), float(formulas.local_bytes(output, st.output,
                                                                      b.mesh.shape)))
                for st in b.table.strategies[name]]
            c = b.index[name]
            yield self._one_end(self.first_input[name], name,
                                np.array([w.forward for w in spaces]), (c, c + 1))
            if b.on_path[name]:
                back = self.timeline.backward_step(c)
                yield self._one_end(self.first_input[name], name,
                                    np.array([w.backward for w in spaces]), (back, back + 1))

    def _one_end(self, other: str, name: str, values: np.ndarray,
                 interval: tuple[int, int]) -> EdgeUsage:
        """An `EdgeUsage` of `values` (per strategy of `name`) over `interval`, carried by
        the pair (`other`, `name`) and constant along `other`."""
        shape = (len(self.b.table.strategies[other]), values.size)
        return EdgeUsage((self.b.index[other], self.b.index[name]),
                         np.broadcast_to(values, shape), interval)

    def _last_reader(self, node: fx.Node) -> int:
        """The index of the last decision node that reads `node`'s storage: through views,
        their readers (its own index if none)."""
        b = self.b
        last = b.index[node.name]
        for user in b.decision_users(node):
            reader = b.by_name[user]
            last = max(last, b.index[user])
            if reader.op == "call_function" and b.moves_no_bytes(reader):
                last = max(last, self._last_reader(reader))
        return last

