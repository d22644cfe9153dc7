"""Plans that force one strategy on one node, and the ranks that run them.

`forced_plans` (in the parent, no process group) pins, for every distinct (op, strategy)
of a model's graph, the first node with that op to that strategy, lets the solver choose
the rest, and keeps the plan. `run_forced` (on each rank) captures each model once, builds
the `ParallelModule` of every plan, runs one forward and backward, and reports the loss and
the largest relative gradient error against the plain model, whether the bytes moved equal
the plan's, and which rows of docs/DESIGN.md's collective table the program's conversions used.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
from dataclasses import dataclass, field

import torch

import autopar
from autopar.compiler import assemble
from autopar.passes.capturing.annotate import annotate, size_hints
from autopar.passes.capturing.capture import capture
from autopar.passes.problem.build_problem import build_problem
from autopar.passes.problem.extract_plan import extract_plan
from autopar.passes.strategies.find_strategies import find_strategies
from autopar.runtime import device_mesh
from autopar.solver import solve
from autopar.values.placement import Partial, Replicate, Shard, format_placements


@dataclass(frozen=True)
class Forced:
    """`node` (an op `target`) pinned to `strategy` ("inputs -> output" text) in `plan`."""

    model: str
    node: str
    target: str
    strategy: str
    plan: dict = field(compare=False, repr=False)


def build(model: str):
    """`(module, inputs)` of "module_name" or "module_name:argument" (probe models)."""
    name, _, argument = model.partition(":")
    torch.manual_seed(0)
    module = importlib.import_module(name)
    return module.build(argument) if argument else module.build()


def _text(strategy) -> str:
    return (" | ".join(format_placements(p) for p in strategy.inputs) + " -> "
            + format_placements(strategy.output))


def forced_plans(model: str, mesh: autopar.Mesh, keep=lambda strategy: True,
                 limit: int | None = None) -> list[Forced]:
    """One plan per distinct (op, strategy) of `model`'s graph that `keep` accepts; with
    `limit`, that many of them, evenly spread over the graph."""
    module, inputs = build(model)
    gm = annotate(capture(module, inputs))
    table = find_strategies(gm, mesh)
    hints = size_hints(gm)
    seen, chosen = set(), []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.name not in table.strategies:
            continue
        for strategy in table.strategies[node.name]:
            if (node.target, strategy) not in seen and keep(strategy):
                seen.add((node.target, strategy))
                chosen.append((node, strategy))
    if limit is not None and len(chosen) > limit:
        chosen = [chosen[i * len(chosen) // limit] for i in range(limit)]
    plans = []
    for node, strategy in chosen:
        pinned = dataclasses.replace(table, strategies={**table.strategies, node.name: (strategy,)})
        problem = build_problem(gm, pinned, mesh, memory_budget=None, hints=hints,
                                fold_layers=False)
        solution = solve(problem.problem, time_limit=2.0)
        assert solution.choices, f"{node.name} pinned to {_text(strategy)} is infeasible"
        plan = extract_plan(gm, problem, solution, model_name=model, sizes={})
        plans.append(Forced(model, node.name, str(node.target), _text(strategy),
                            plan.to_dict()))
    return plans


def pinned_plan(model: str, mesh: autopar.Mesh, constraints: dict[str, str]) -> Forced:
    """The plan of `model` with `constraints` (node or tensor name -> placements)."""
    module, inputs = build(model)
    plan = autopar.plan(module, mesh, inputs, constraints=constraints, time_limit=2.0)
    pins = ", ".join(f"{k}={v}" for k, v in constraints.items())
    return Forced(model, pins, "constraints", pins, plan.to_dict())


def _kind(placement) -> str:
    return {Shard: "S", Replicate: "R", Partial: "P"}[type(placement)]


def table_rows(pm: autopar.ParallelModule) -> set[str]:
    """The rows of the collective table the program's conversions use: "P->R", "S->R",
    "R->S", "P->S", "S->S", ... per axis step, and "R used split" for a replicated tensor
    whose consumer splits the computation (no forward step, a backward all-reduce)."""
    rows = set()
    for _, redistribution in pm.collectives:
        moved = set()
        for step in redistribution.forward_steps:
            rows.add(f"{_kind(step.src)}->{_kind(step.dst)}")
            moved.add(step.axis)
        for step in redistribution.backward_steps:
            if step.axis not in moved and step.kind == "all_reduce" and isinstance(
                    redistribution.src[step.axis], Replicate):
                rows.add("R used split")
    return rows


@dataclass(frozen=True)
class Result:
    forced: Forced
    loss_error: float
    grad_error: float
    bytes_match: bool
    rows: frozenset[str]


def run_forced(rank: int, plans: tuple[Forced, ...], shape: tuple[int, ...],
               names: tuple[str, ...]) -> list[Result]:
    """Run every forced plan on this rank (see the module docstring)."""
    device = device_mesh(autopar.Mesh(shape, names, hardware="cpu"))
    results, prepared = [], {}
    for forced in plans:
        if forced.model not in prepared:
            module, inputs = build(forced.model)
            reference = copy.deepcopy(module)
            loss = reference(*inputs)
            loss.backward()
            grads = {n: p.grad for n, p in reference.named_parameters()}
            prepared[forced.model] = (module, inputs, annotate(capture(module, inputs)),
                                      float(loss.detach()), grads)
        module, inputs, gm, expected, grads = prepared[forced.model]
        pm = assemble(module, gm, autopar.Plan.from_dict(forced.plan), device)
        loss = pm(*inputs)
        loss.backward()
        full = pm.full_grads()
        errors = [float((full[n] - g).abs().max() / max(float(g.abs().max()), 1e-30))
                  for n, g in grads.items() if g is not None]
        predicted = pm.plan.comm_bytes()
        results.append(Result(forced, abs(float(loss.detach()) - expected) / abs(expected),
                              max(errors, default=0.0), pm.counter.totals() == predicted,
                              frozenset(table_rows(pm))))
    return results
