"""Plan pass: read the solver's choices back into a `Plan`.

Reads `autopar_role`, `autopar_flops`, `autopar_bytes`, `autopar_tensor` and the
`ProblemBuild`. For every decision node it records the chosen placements, the compute and
the inbound collectives (forward and backward) with their bytes, its memory (with what its
edges hold: the copies of its inputs it keeps, its output when an edge it alone is kept
through holds it, `edge_costs.held_bytes`), and the formula
of its cost over the graph's symbolic sizes, re-derived with the same cost functions the
problem was built with so the plan can be re-evaluated at other sizes. A folded graph's
plan (`passes/problem/fold_depth.py`) is the unfolded graph's: each node of the representative
block is recorded once per node it stands for, under that node's name and module, reading
its own copies' tensors, and the nodes come in the unfolded graph's order.
"""

from __future__ import annotations

import dataclasses

import sympy
import torch.fx as fx

from autopar.costs import formulas, uneven
from autopar.passes.capturing.gradient_path import tensor_outputs, trained
from autopar.passes.problem.build_problem import ProblemBuild
from autopar.passes.problem.edge_costs import (
    Background,
    background_seconds,
    held_bytes,
    hidden_seconds,
    step_repeats,
    step_seconds,
    strategy_edge_transfers,
    transfer_seconds,
)
from autopar.passes.problem.op_costs import (
    compression_time,
    op_compute_time,
    op_ring,
    op_time,
    parameter_step_time,
)
from autopar.passes.problem.rebuilt import never_rebuilt
from autopar.passes.problem.step_memory import held_copies, microbatch_copies
from autopar.solver import Solution
from autopar.values.mesh import Mesh
from autopar.values.placement import describe_pieces, format_placements
from autopar.values.plan import NodePlan, Plan, SolverReport, TransferRecord
from autopar.values.specs import BYTES, FLOPS, FOLD, ROLE, Fold, module_of


def _symbolic_cost(node: fx.Node, build: ProblemBuild, strategy, inbound,
                   hidden: Background) -> sympy.Expr:
    """The node's time over the graph's size symbols: compute, plus its inbound
    collectives, less the `hidden` fractions of its background reductions and gathers."""
    mesh, count = build.mesh, build.microbatches
    total = count * sympy.sympify(op_time(
        node, strategy, mesh, differentiable=build.requires_grad[node.name],
        size=sympy.sympify))
    if trained(node):
        total += parameter_step_time(tensor_outputs(node)[0], strategy.output, mesh,
                                     build.optimizer)
        total += compression_time(tensor_outputs(node)[0], strategy, mesh)
    for ref, src, dst in inbound:
        nbytes = uneven.cost_bytes(ref.tensor, mesh, symbolic=True)
        transfers = strategy_edge_transfers(ref, src, dst, nbytes, mesh.shape)
        total += sum(step_seconds(ref, src, transfers, count, mesh))
        total -= hidden_seconds(ref, src, transfers, count, mesh, hidden)
    return sympy.sympify(total)


def _at(value, sizes: dict[str, int]) -> float:
    """`value` (a number or a formula over size symbols) at `sizes` (by symbol name)."""
    if not hasattr(value, "free_symbols"):
        return float(value)
    return float(value.subs({symbol: sizes[str(symbol)] for symbol in value.free_symbols}))


def _compute_split(node: fx.Node, build: ProblemBuild, strategy,
                   sizes: dict[str, int]) -> tuple[float, float]:
    """Seconds of `node`'s compute in one micro-batch's forward, and in its backward (its
    backward and any recomputed forward): what background gathers and gradient reductions
    can hide behind."""
    def size(value):
        return _at(value, sizes)

    differentiable = build.requires_grad[node.name]
    both = op_compute_time(node, strategy, build.mesh, differentiable=differentiable,
                           size=size)
    forward = op_compute_time(node, strategy, build.mesh, differentiable=False, size=size)
    return float(forward), float(both - forward)


def training_flops(gm: fx.GraphModule, on_path: dict[str, bool], sizes: dict) -> float:
    """FLOPs of one training step of the whole model on one device: each op's forward, and
    twice it again for the backward of ops on the gradient path."""
    fold = gm.meta.get(FOLD)
    total = 0.0
    for node in gm.graph.nodes:
        flops = _at(node.meta.get(FLOPS, 0), sizes) * (fold.repeats(node.name) if fold else 1)
        total += flops * (1 + formulas.BACKWARD_FLOPS_FACTOR * on_path.get(node.name, False))
    return total


def _edges(build: ProblemBuild, chosen) -> dict[str, list]:
    """(edge, producer's strategy, consumer's strategy, transfers) per consumer."""
    edges: dict[str, list] = {name: [] for name in build.nodes}
    for ref in build.edges:
        src, dst = chosen[ref.producer], chosen[ref.consumer]
        edges[ref.consumer].append((ref, src, dst, strategy_edge_transfers(
            ref, src, dst, uneven.cost_bytes(ref.tensor, build.mesh),
            build.mesh.shape)))
    return edges


def _held(build: ProblemBuild, chosen) -> dict[str, float]:
    """Per node, the bytes the edges hold for it under the `chosen` strategies
    (`edge_costs.held_bytes`, the problem's edge usages): the copies a consumer keeps and
    the output an owning edge or a recipe holds for its producer, once per micro-batch in
    flight, for one node of the unfolded graph."""
    held = dict.fromkeys(build.nodes, 0.0)
    for ref in build.edges:
        if not (ref.keeps or ref.recipe):
            continue
        src = chosen[ref.producer]
        copy, own = held_bytes(ref, src, chosen[ref.consumer],
                               uneven.cost_bytes(ref.tensor, build.mesh),
                               build.mesh.shape)
        held[ref.consumer] += build.in_flight * float(copy)
        held[ref.producer] += build.in_flight * float(own)
    return held


def _hidden(build: ProblemBuild, by_name, chosen, edges, sizes: dict[str, int]) -> Background:
    """The fractions of the background collectives hidden behind compute: min(1, C / G),
    with G their time in one micro-batch and C the compute they overlap there: the
    backward's for gradient reductions, the forward's for parameter gathers. With several
    micro-batches G is the last one's, the busiest: the reductions deferred to it and its
    own. (The reductions of the last gradients the backward makes have little compute
    left to hide behind, the first gather none before it; C counts all of it, an
    optimistic bound.) The profile's `overlap_slowdown` s is the share of background
    communication that compute beside it does not hide (both share the device): the
    fractions are scaled by 1 - s."""
    mesh = build.mesh
    repeats = dict(zip(build.nodes, build.repeats))
    reductions = gathers = 0.0
    for name, per_node in edges.items():
        for ref, src, _, transfers in per_node:
            edge = background_seconds(ref, src, transfers,
                                      transfer_seconds(ref, transfers, mesh))
            reductions += repeats[name] * float(edge[0])
            gathers += repeats[name] * float(edge[1])
    forward = backward = 0.0
    if reductions or gathers:
        for name in build.nodes:
            ahead, behind = _compute_split(by_name[name], build, chosen[name], sizes)
            forward += repeats[name] * ahead
            backward += repeats[name] * behind
    kept = max(0.0, 1.0 - mesh.hardware.overlap_slowdown)
    return Background(kept * min(1.0, backward / reductions) if reductions else 0.0,
                      kept * min(1.0, forward / gathers) if gathers else 0.0)


def extract_plan(gm: fx.GraphModule, build: ProblemBuild, solution: Solution, *,
                 model_name: str, sizes: dict[str, int], warnings: tuple[str, ...] = ()) -> Plan:
    """The `Plan` of a feasible solution of `build.problem`."""
    assert solution.choices, "extract_plan needs a feasible solution"
    problem, mesh = build.problem, build.mesh
    by_name = {n.name: n for n in gm.graph.nodes}
    chosen = {name: build.strategies[i][solution.choices[i]]
              for i, name in enumerate(build.nodes)}
    # What the problem recomputes and the runtime never rebuilds is listed as it runs.
    chosen.update((name, dataclasses.replace(chosen[name], recompute=False))
                  for name in never_rebuilt(build, chosen))
    edges = _edges(build, chosen)
    hidden = _hidden(build, by_name, chosen, edges, sizes)
    fold: Fold | None = gm.meta.get(FOLD)
    held = _held(build, chosen)
    nodes = []
    for i, name in enumerate(build.nodes):
        plan = _node_plan(i, name, by_name[name], chosen[name], build, solution, edges[name],
                          hidden, sizes)
        if held[name]:
            plan = dataclasses.replace(plan, memory_bytes=plan.memory_bytes + held[name])
        nodes.extend(_unfolded(plan, fold) if fold else (plan,))
    if fold:
        nodes.sort(key=lambda n: fold.order[n.name])
    report = SolverReport(objective=solution.cost, bound=solution.bound, gap=solution.gap,
                          status=solution.status, wall_time_s=solution.wall_time,
                          decisions=problem.num_nodes,
                          tied=sum(len(group) - 1 for group in problem.ties),
                          exposed_reductions=1 - hidden.reductions,
                          exposed_gathers=1 - hidden.gathers,
                          memory_free=solution.memory_free)
    limit = problem.usage_limit if problem.usage_limit is not None else float("inf")
    return Plan(model=model_name, mesh=mesh, nodes=tuple(nodes), solver=report,
                memory_limit_bytes=limit, optimizer=build.optimizer.describe(),
                model_flops=build.microbatches * training_flops(gm, build.requires_grad, sizes),
                peak_memory_bytes=problem.peak_usage(solution.choices),
                sizes=tuple(sorted(sizes.items())), warnings=warnings,
                microbatches=build.microbatches)


def _node_plan(i: int, name: str, node: fx.Node, strategy, build: ProblemBuild,
               solution: Solution, inbound: list, hidden: Background,
               sizes: dict[str, int]) -> NodePlan:
    """The plan of decision node `i` (`name`, the graph's `node`) under its chosen
    `strategy`: its compute, its `inbound` collectives (`_edges`'s, with their transfers)
    and those of a ring it runs (whose exposed time counts as communication), its memory,
    and the formula of its cost. Where the problem's strategy recomputed the op and
    `strategy` (the runtime's, `rebuilt.never_rebuilt`) does not, its compute is costed
    again."""
    problem, mesh = build.problem, build.mesh
    comm, overlapped, records = _inbound(build, inbound, hidden)
    compute = float(problem.node_costs[i][solution.choices[i]]) / build.repeats[i]
    if strategy.recompute != build.strategies[i][solution.choices[i]].recompute:
        compute = build.microbatches * float(op_time(
            node, strategy, mesh, differentiable=build.requires_grad[name],
            size=lambda value: _at(value, sizes)))
    # A parameter's node cost is its optimizer step and the casts of a compressed gradient
    # reduction (`build_problem.node_cost`), which count as compute.
    parameter = node.meta.get(ROLE) == "parameter"
    casts = float(compression_time(tensor_outputs(node)[0], strategy, mesh)) if parameter else 0
    step = compute - casts if parameter else 0.0
    compute -= step
    ring = op_ring(node, strategy, mesh, lambda value: _at(value, sizes))
    if ring is not None:  # the ring's exposed time is communication, not compute
        differentiable = build.requires_grad[name]
        exposed = build.microbatches * float(ring.exposed_seconds(
            *_compute_split(node, build, strategy, sizes), mesh,
            differentiable=differentiable))
        compute -= exposed
        comm += exposed
        records.extend(TransferRecord(
            t.kind, mesh.axis_names[t.axis], build.microbatches * float(t.nbytes),
            t.backward, name, float(t.time(mesh)), calls=build.microbatches)
            for t in ring.transfers(differentiable=differentiable))
    return NodePlan(
        name=name, op=str(node.target) if node.op == "call_function" else node.op,
        role=node.meta.get(ROLE, node.op), module=module_of(node),
        inputs=tuple(format_placements(p) for p in strategy.inputs),
        output=format_placements(strategy.output),
        compute_s=compute, comm_s=comm, optimizer_s=step,
        memory_bytes=_memory_bytes(i, node, strategy, build, solution),
        transfers=tuple(records),
        formula=str(_symbolic_cost(node, build, strategy, [e[:3] for e in inbound], hidden))
        if sizes else repr(compute + comm - overlapped + step),
        # A view's flag only mirrors its base's (build_problem): views run no op.
        recompute=strategy.recompute and node.meta.get(BYTES, 0) != 0,
        gathered=format_placements(strategy.gathered) if strategy.gathered else "",
        whole_gradient=strategy.whole_gradient, hidden_s=overlapped,
        pieces=_pieces(node, strategy, build.mesh), compression=strategy.compression or "")


def _pieces(node: fx.Node, strategy, mesh: Mesh) -> str:
    """The pieces of the node's (first) output where it is split unevenly."""
    outputs = tensor_outputs(node) if node.op != "output" else ()
    if not outputs or outputs[0].sym_shape is not None:
        return ""
    return describe_pieces(outputs[0].shape, strategy.output, mesh.shape, mesh.shares)


def _memory_bytes(i: int, node: fx.Node, strategy, build: ProblemBuild,
                  solution: Solution) -> float:
    """The bytes node `i` holds (its usage in the problem, once), a parameter's with its
    gradient, and an op's for every micro-batch in flight: the problem may count either
    over an interval of its own (`timed_gradients`, `BackwardUsages.current`)."""
    usage = float(build.problem.node_usages[i][solution.choices[i]]) / build.held_repeats[i]
    on_path, in_flight = build.requires_grad[node.name], build.in_flight
    usage *= held_copies(node, on_path, in_flight) / microbatch_copies(node, on_path, in_flight)
    if build.timed_gradients and trained(node):
        gradient = uneven.cost_bytes(tensor_outputs(node)[0], build.mesh)
        usage += float(formulas.local_bytes(gradient, strategy.output, build.mesh.shape))
    return usage


def _inbound(build: ProblemBuild, inbound: list,
             hidden: Background) -> tuple[float, float, list[TransferRecord]]:
    """A node's `inbound` collectives (`_edges`'s) over a step: their seconds, the seconds
    of them `hidden` behind compute, and their records."""
    mesh = build.mesh
    comm = overlapped = 0.0
    records = []
    for ref, src, _, transfers in inbound:
        repeated = step_repeats(ref, src, transfers, build.microbatches)
        seconds = [float(x) for x in step_seconds(ref, src, transfers,
                                                  build.microbatches, mesh)]
        comm += sum(seconds)
        overlapped += float(hidden_seconds(ref, src, transfers, build.microbatches, mesh,
                                           hidden))
        records.extend(TransferRecord(
            t.kind, mesh.axis_names[t.axis], n * float(t.nbytes), t.backward,
            ref.producer, time, calls=n) for t, n, time in zip(transfers, repeated, seconds))
    return comm, overlapped, records


def _unfolded(plan: NodePlan, fold: Fold) -> tuple[NodePlan, ...]:
    """The plans of the unfolded nodes a folded graph's node stands for (one for a node
    that stands for itself), each reading its own copies' tensors."""
    def copy(k: int, name: str, module: str) -> NodePlan:
        transfers = tuple(dataclasses.replace(t, tensor=fold.producer(t.tensor, plan.name, k))
                          for t in plan.transfers)
        return dataclasses.replace(plan, name=name, module=module, transfers=transfers)

    if plan.name not in fold.copies:
        renamed = any(t.tensor in fold.copies for t in plan.transfers)
        return (copy(0, plan.name, plan.module) if renamed else plan,)
    return tuple(copy(k, name, module) for k, (name, module) in enumerate(
        zip(fold.copies[plan.name], fold.modules[plan.name])))
