"""Plans that recompute, and the rank bodies that measure what recomputation keeps.

`recompute_plan` (in the parent, no process group) plans an example under a memory budget
that forces sharding, with every op that may be recomputed restricted to recomputing, except
where that is forbidden (an op reading another block's recomputed output): so the program
rebuilds almost every activation, and its inbound edges' forward collectives run again in
the backward. `kept_bytes` (on each rank) runs the plan and its twin that recomputes nothing
and reports the bytes the forward leaves allocated, which autograd holds for the backward.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.profiler import ProfilerActivity, profile

import autopar
from autopar import cost
from autopar.compiler import assemble
from autopar.passes.annotate import annotate
from autopar.passes.capture import capture
from autopar.placement import parse_placements
from autopar.runtime import device_mesh
from autopar.specs import TENSOR


def recompute_plan(model: torch.nn.Module, inputs: tuple, mesh: autopar.Mesh,
                   budget_fraction: float, constraints: dict[str, str] | None = None
                   ) -> autopar.Plan:
    """The solver's plan of `model` within `budget_fraction` of the memory its replicated
    single-device plan peaks at, with `constraints` pinned (`autopar.plan`'s): tight
    enough budgets make it recompute."""
    whole = autopar.plan(model, autopar.Mesh((1,), ("x",), hardware=mesh.hardware.name),
                         inputs, recompute=False, time_limit=2.0).peak_memory_bytes
    return autopar.plan(model, mesh, inputs, memory_budget=budget_fraction * whole,
                        constraints=constraints, time_limit=10.0)


def without_recompute(plan: autopar.Plan) -> autopar.Plan:
    """`plan` with the same placements, keeping every activation."""
    return dataclasses.replace(plan, nodes=tuple(dataclasses.replace(n, recompute=False)
                                                 for n in plan.nodes))


def predicted_saving(model: torch.nn.Module, inputs: tuple, plan: autopar.Plan) -> float:
    """Bytes per rank the plan does not keep: the local outputs of its recomputed ops."""
    gm = annotate(capture(model, inputs))
    specs = {n.name: n.meta[TENSOR] for n in gm.graph.nodes}
    total = 0.0
    for node in plan.nodes:
        if node.recompute:
            spec = specs[node.name]
            for s in spec if isinstance(spec, tuple) else (spec,):
                if s is not None:
                    total += cost.local_bytes(s.nbytes, parse_placements(node.output),
                                              plan.mesh.shape)
    return total


def _forward_bytes(pm, inputs) -> tuple[int, torch.Tensor]:
    """Bytes allocated and not freed during one forward, and its loss."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = pm(*inputs)
    return sum(e.self_cpu_memory_usage for e in prof.events()), loss


def kept_bytes(rank: int, example: str, build: dict, plan: dict,
               shape: tuple[int, ...], names: tuple[str, ...]) -> tuple[int, int]:
    """(bytes the forward leaves allocated with `plan`, the same without recomputing), on
    this rank, each after a step that warms the program up."""
    import importlib

    device = device_mesh(autopar.Mesh(shape, names, hardware="cpu"))
    torch.manual_seed(0)
    model, inputs = importlib.import_module(example).build(**build)
    gm = annotate(capture(model, inputs))
    measured = []
    for chosen in (autopar.Plan.from_dict(plan), without_recompute(autopar.Plan.from_dict(plan))):
        pm = assemble(model, gm, chosen, device)
        pm(*inputs).backward()
        nbytes, loss = _forward_bytes(pm, inputs)
        loss.backward()
        measured.append(nbytes)
    return measured[0], measured[1]


def train_and_measure(rank: int, cases: tuple, shape: tuple[int, ...], names: tuple[str, ...],
                      measured: int | None = None) -> tuple[list, tuple[int, int] | None]:
    """`equivalence_cases.train_all`, then `kept_bytes` of case `measured` (in the same
    processes: starting them costs seconds)."""
    from equivalence_cases import train_all

    outcomes = train_all(rank, cases, shape, names)
    if measured is None:
        return outcomes, None
    case = cases[measured]
    return outcomes, kept_bytes(rank, case.example, dict(case.build), case.plan, shape, names)
