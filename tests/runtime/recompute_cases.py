"""Plans that recompute, and the rank bodies that measure what recomputation keeps.

`recompute_plan` (in the parent, no process group) plans an example under a memory budget
tight enough that the solver recomputes. `kept_bytes` (on each rank) runs the plan and its
twin that recomputes nothing and reports the activation storages autograd holds for the
backward after the forward.
"""

from __future__ import annotations

import dataclasses

import torch

import autopar
from autopar.compiler import assemble
from autopar.costs import formulas
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.passes.capturing.find_saved import find_saved, kept_outputs
from autopar.passes.capturing.gradient_path import tensor_outputs
from autopar.passes.strategies.restrict import restrict
from autopar.planning.graph import plan_table, strategy_tables
from autopar.runtime import device_mesh
from autopar.runtime.memory_probe import ForwardProbe
from autopar.values.placement import parse_placements


def recompute_plan(model: torch.nn.Module, inputs: tuple, mesh: autopar.Mesh,
                   budget_fraction: float, constraints: dict[str, str] | None = None
                   ) -> autopar.Plan:
    """The solver's plan of `model` within `budget_fraction` of the memory its replicated
    single-device plan peaks at, with `constraints` pinned (`autopar.plan`'s): tight
    enough budgets make it recompute."""
    whole = autopar.plan(model, autopar.Mesh((1,), ("x",), hardware=mesh.hardware.name),
                         inputs, recompute=False, time_limit=2.0).peak_memory_bytes
    return autopar.plan(model, mesh, inputs, memory_budget=budget_fraction * whole,
                        constraints=constraints, time_limit=10.0, microbatches=1)


def checkpointed_plan(model: torch.nn.Module, inputs: tuple, mesh: autopar.Mesh,
                      roles: tuple[str, ...]) -> autopar.Plan:
    """`roles` (`restrict`'s, one per axis) with every block checkpointed from its inputs
    (the "full" hand strategy): its recomputed ops start from, and pass through, tensors
    nothing keeps, which their recipes hold; under tensor parallelism they include ops
    whose inputs need a collective."""
    gm = annotate(capture(model, inputs))
    tables = strategy_tables(gm, mesh, microbatches=1)
    table = restrict(tables.gm, tables.found, mesh, roles, "full").table
    return plan_table(tables.gm, table, mesh, model_name=type(model).__name__,
                      memory_budget=None, time_limit=5.0, fold_layers=True, seed=0)


def without_recompute(plan: autopar.Plan) -> autopar.Plan:
    """`plan` with the same placements, keeping every activation."""
    return dataclasses.replace(plan, nodes=tuple(dataclasses.replace(n, recompute=False)
                                                 for n in plan.nodes))


def predicted_saving(model: torch.nn.Module, inputs: tuple, plan: autopar.Plan) -> float:
    """Bytes per rank the plan does not keep: the local outputs of its recomputed ops that
    some op keeps for the backward (`find_saved.kept_outputs`), less the outputs nothing
    keeps that a recomputed op's recipe holds instead (read from an op not recomputed),
    each counted once."""
    gm = annotate(capture(model, inputs))
    by_name = {n.name: n for n in gm.graph.nodes}
    placed = {n.name: n for n in plan.nodes}
    kept = kept_outputs(gm, find_saved(gm))

    def local(name: str, k: int = 0) -> float:
        spec = tensor_outputs(by_name[name])[k]
        return formulas.local_bytes(spec.nbytes, parse_placements(placed[name].output),
                                    plan.mesh.shape)

    total, held = 0.0, set()
    for node in plan.nodes:
        if node.recompute:
            for k, _ in enumerate(tensor_outputs(by_name[node.name])):
                if k in kept.get(node.name, {k}):
                    total += local(node.name, k)
            for source in by_name[node.name].all_input_nodes:
                if (source.op == "call_function" and source.name in placed
                        and not placed[source.name].recompute and not kept.get(source.name, {0})
                        and source.name not in held):
                    held.add(source.name)
                    total -= local(source.name)
    return total


def _forward_bytes(pm, inputs) -> tuple[int, torch.Tensor]:
    """Bytes of the activation storages autograd holds after one forward
    (`autopar.runtime.memory_probe.ForwardProbe`), and its loss."""
    with ForwardProbe(pm, inputs) as probe:
        loss = pm(*inputs)
    return probe.saved.activations, loss


def kept_bytes(rank: int, example: str, build: dict, plan: dict,
               shape: tuple[int, ...], names: tuple[str, ...]) -> tuple[int, int]:
    """(activation bytes autograd holds after the forward with `plan`, the same without
    recomputing), on this rank, each after a step that warms the program up."""
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
