"""Plan pass: read the solver's choices back into a `Plan`.

Reads `autopar_role`, `autopar_flops`, `autopar_bytes`, `autopar_tensor` and the
`ProblemBuild`. For every decision node it records the chosen placements, the compute and
the inbound collectives (forward and backward) with their bytes, its memory, and the formula
of its cost over the graph's symbolic sizes, re-derived with the same cost functions the
problem was built with so the plan can be re-evaluated at other sizes.
"""

from __future__ import annotations

import sympy
import torch.fx as fx

from autopar import cost
from autopar.passes.build_problem import (
    ProblemBuild,
    module_of,
    op_compute_time,
    strategy_edge_transfers,
)
from autopar.placement import format_placements
from autopar.plan_types import NodePlan, Plan, SolverReport, TransferRecord
from autopar.solver import Solution
from autopar.specs import FLOPS, ROLE


def _symbolic_cost(node: fx.Node, build: ProblemBuild, strategy, inbound) -> sympy.Expr:
    mesh = build.mesh
    total = sympy.sympify(op_compute_time(node, strategy, mesh,
                                          differentiable=build.requires_grad[node.name],
                                          size=sympy.sympify))
    for ref, src, dst, _ in inbound:
        for transfer in strategy_edge_transfers(ref, src, dst, ref.tensor.sym_nbytes,
                                                mesh.shape):
            total += transfer.time(mesh)
    return sympy.sympify(total)


def training_flops(gm: fx.GraphModule, on_path: dict[str, bool], sizes: dict) -> float:
    """FLOPs of one training step of the whole model on one device: each op's forward, and
    twice it again for the backward of ops on the gradient path."""
    symbols = {sympy.Symbol(k): v for k, v in sizes.items()}
    total = 0.0
    for node in gm.graph.nodes:
        flops = node.meta.get(FLOPS, 0)
        flops = float(flops.subs(symbols)) if hasattr(flops, "subs") else float(flops)
        total += flops * (1 + cost.BACKWARD_FLOPS_FACTOR * on_path.get(node.name, False))
    return total


def extract_plan(gm: fx.GraphModule, build: ProblemBuild, solution: Solution, *,
                 model_name: str, sizes: dict[str, int], warnings: tuple[str, ...] = ()) -> Plan:
    """The `Plan` of a feasible solution of `build.problem`."""
    assert solution.choices, "extract_plan needs a feasible solution"
    problem, mesh = build.problem, build.mesh
    by_name = {n.name: n for n in gm.graph.nodes}
    chosen = {name: build.strategies[i][solution.choices[i]]
              for i, name in enumerate(build.nodes)}
    inbound: dict[str, list] = {name: [] for name in build.nodes}
    for e, ref in enumerate(build.edges):
        a, b = problem.edges[e]
        inbound[ref.consumer].append(
            (ref, chosen[ref.producer], chosen[ref.consumer],
             float(problem.edge_costs[e][solution.choices[a], solution.choices[b]])))
    nodes = []
    for i, name in enumerate(build.nodes):
        node, strategy = by_name[name], chosen[name]
        transfers = tuple(
            TransferRecord(t.kind, mesh.axis_names[t.axis], float(t.nbytes), t.backward,
                           ref.producer, float(t.time(mesh)))
            for ref, src, dst, _ in inbound[name]
            for t in strategy_edge_transfers(ref, src, dst, ref.tensor.nbytes, mesh.shape))
        nodes.append(NodePlan(
            name=name, op=str(node.target) if node.op == "call_function" else node.op,
            role=node.meta.get(ROLE, node.op), module=module_of(node),
            inputs=tuple(format_placements(p) for p in strategy.inputs),
            output=format_placements(strategy.output),
            compute_s=float(problem.node_costs[i][solution.choices[i]]),
            comm_s=sum(c for *_, c in inbound[name]),
            memory_bytes=float(problem.node_usages[i][solution.choices[i]]),
            transfers=transfers,
            formula=str(_symbolic_cost(node, build, strategy, inbound[name])) if sizes
            else repr(float(problem.node_costs[i][solution.choices[i]])
                      + sum(c for *_, c in inbound[name])),
            recompute=strategy.recompute,
            gathered=format_placements(strategy.gathered) if strategy.gathered else ""))
    report = SolverReport(objective=solution.cost, bound=solution.bound, gap=solution.gap,
                          status=solution.status, wall_time_s=solution.wall_time,
                          decisions=problem.num_nodes,
                          tied=sum(len(group) - 1 for group in problem.ties))
    limit = problem.usage_limit if problem.usage_limit is not None else float("inf")
    return Plan(model=model_name, mesh=mesh, nodes=tuple(nodes), solver=report,
                memory_limit_bytes=limit, optimizer=build.optimizer.describe(),
                model_flops=training_flops(gm, build.requires_grad, sizes),
                peak_memory_bytes=problem.peak_usage(solution.choices),
                sizes=tuple(sorted(sizes.items())), warnings=warnings)
