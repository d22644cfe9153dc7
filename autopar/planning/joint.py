"""A decode program and its prefill planned as one problem.

Both programs read the same weights and write the same KV cache, so where those are
stored is one decision for both, while each program's activations are its own. A request
runs the prefill once, then the decode program once per new token (`steps` times), so the
problem (`autopar.solver.combine`) is

    minimise  steps x decode + prefill   over every placement of both programs,

the weights and the cache (a parameter or buffer of the same name in both captures)
placed alike, each program's memory on its own timeline within the same budget. Its answer
is the pair of plans whose request is the shortest the solver finds, where planning one
program and pinning the other to its placements (`autopar.planning.prefill`) finds the best
pair only when one program's placements suit both.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch.fx as fx

from autopar.passes.capturing.annotate import size_hints
from autopar.passes.problem.build_problem import ProblemBuild, build_problem
from autopar.passes.problem.edge_cache import EdgeCache
from autopar.passes.problem.edge_costs import Background
from autopar.passes.problem.extract_plan import extract_plan
from autopar.planning.graph import STAGE, strategy_tables
from autopar.solver import solve
from autopar.solver.combine import combined, split
from autopar.values.mesh import Mesh
from autopar.values.plan import Plan
from autopar.values.specs import ROLE

# What both programs hold: placed once, for both.
STATE = ("parameter", "buffer")


def plan_both(decode: fx.GraphModule, prefill: fx.GraphModule, mesh: Mesh, *, steps: int,
              memory_budget: float, charges: Background, time_limit: float, seed: int,
              model_name: str, progress: Callable[[str], None] | None = None
              ) -> tuple[Plan, Plan] | None:
    """The decode and prefill plans of one solve (module docstring), each program's
    collectives in the background charged at `charges`; None when the solve finds no
    answer that fits within `time_limit`."""
    say = progress or (lambda message: None)
    edges = EdgeCache(mesh)
    tables, builds = [], []
    for gm in (decode, prefill):
        tables.append(strategy_tables(gm, mesh, progress=progress))
        builds.append(build_problem(tables[-1].gm, tables[-1].table, mesh,
                                    memory_budget=memory_budget,
                                    hints=size_hints(tables[-1].gm), charges=charges,
                                    saved=tables[-1].saved, edge_cache=edges))
    first, second = (build.problem for build in builds)
    say(f"{STAGE} solve (decode x {steps} + prefill as one problem, "
        f"{first.num_nodes + second.num_nodes} decisions)")
    solution = solve(combined(first, second, weights=(float(steps), 1.0),
                              shared=_shared(*builds, *(t.gm for t in tables))),
                     time_limit=time_limit, seed=seed, progress=progress, repeatable=True)
    if not solution.choices:
        return None
    decoded, prefilled = split(solution, first, second)
    return tuple(extract_plan(table.gm, build, part, model_name=model_name,
                              sizes={str(k): v for k, v in size_hints(table.gm).items()})
                 for table, build, part in zip(tables, builds, (decoded, prefilled)))


def _shared(decode: ProblemBuild, prefill: ProblemBuild, decode_gm: fx.GraphModule,
            prefill_gm: fx.GraphModule) -> list[tuple[int, int, np.ndarray]]:
    """(decode node, prefill node, which strategy pairs place them alike) for every weight
    and buffer both problems decide."""
    roles = {n.name: n.meta.get(ROLE) for n in decode_gm.graph.nodes}
    in_prefill = {name: j for j, name in enumerate(prefill.nodes)}
    pairs = []
    for i, name in enumerate(decode.nodes):
        j = in_prefill.get(name)
        if j is None or roles.get(name) not in STATE:
            continue
        mine = [s.output for s in decode.strategies[i]]
        theirs = [s.output for s in prefill.strategies[j]]
        pairs.append((i, j, np.array([[a == b for b in theirs] for a in mine])))
    return pairs
