"""The linear relaxation of the reduced problem, solved by HiGHS (shipped with OR-Tools).

Same linearisation as the CP-SAT model (`cpsat.py`), every variable continuous in [0, 1]:
the local-polytope relaxation. Its optimum is a lower bound on the reduced cost (memory
rows for only some segments relax it further), and on our torch graphs it usually equals
the best cost the heuristics find, which proves that cost optimal in about a second where
CP-SAT's search needs many. HiGHS works to floating-point tolerances, so the bound is
trusted to about 1e-9 relative.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from ortools.linear_solver import pywraplp

from autopar.solver.flat import Flat


@contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Silence C-level stdout: HiGHS may print a banner even when told not to."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:
        yield
        return
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def _node_rows(flat: Flat, solver: pywraplp.Solver,
               objective: pywraplp.Objective) -> list[dict[int, pywraplp.Variable]]:
    out = []
    for i in range(flat.num_nodes):
        costs = flat.cost_flat[flat.offsets[i]:flat.offsets[i + 1]]
        lits = {int(k): solver.NumVar(0.0, 1.0, "") for k in np.flatnonzero(np.isfinite(costs))}
        row = solver.Constraint(1.0, 1.0)
        for k, v in lits.items():
            row.SetCoefficient(v, 1.0)
            if costs[k]:
                objective.SetCoefficient(v, float(costs[k]))
        out.append(lits)
    return out


def _edge_rows(flat: Flat, solver: pywraplp.Solver, objective: pywraplp.Objective,
               lits: list[dict[int, pywraplp.Variable]], e: int) -> None:
    a, b = int(flat.edge_a[e]), int(flat.edge_b[e])
    m = flat.edge_flat[flat.edge_off[e]:flat.edge_off[e] + flat.sizes[a] * flat.sizes[b]]
    ra, rb = np.fromiter(lits[a], int), np.fromiter(lits[b], int)
    sub = m.reshape(flat.sizes[a], flat.sizes[b])[np.ix_(ra, rb)]
    rows = [solver.Constraint(0.0, 0.0) for _ in ra]
    cols = [solver.Constraint(0.0, 0.0) for _ in rb]
    for row, k in zip(rows, ra):
        row.SetCoefficient(lits[a][int(k)], -1.0)
    for col, k in zip(cols, rb):
        col.SetCoefficient(lits[b][int(k)], -1.0)
    for r, c in zip(*np.nonzero(np.isfinite(sub))):
        y = solver.NumVar(0.0, 1.0, "")
        rows[r].SetCoefficient(y, 1.0)
        cols[c].SetCoefficient(y, 1.0)
        if sub[r, c]:
            objective.SetCoefficient(y, float(sub[r, c]))


def _memory_rows(flat: Flat, solver: pywraplp.Solver,
                 lits: list[dict[int, pywraplp.Variable]], segments: np.ndarray) -> None:
    for s in segments:
        s = int(s)
        row = solver.Constraint(-math.inf, flat.limit - float(flat.problem.base[s]))
        per_node: dict[int, np.ndarray] = {}
        for t in np.flatnonzero((flat.term_lo <= s) & (s < flat.term_hi)):
            i = int(flat.term_node[t])
            vec = flat.term_flat[flat.term_off[t]:flat.term_off[t] + flat.sizes[i]]
            per_node[i] = per_node[i] + vec if i in per_node else vec
        for i, vec in per_node.items():
            for k, v in lits[i].items():
                if vec[k]:
                    row.SetCoefficient(v, float(vec[k]))


def lp_bound(flat: Flat, segments: np.ndarray, seconds: float) -> float:
    """Optimum of the relaxation with memory rows on `segments`, or -inf when HiGHS did
    not finish with an optimum (a timeout, or an infeasible relaxation, which CP-SAT is
    left to prove exactly)."""
    solver = pywraplp.Solver.CreateSolver("HIGHS")
    assert solver is not None, "OR-Tools ships HiGHS"
    solver.SuppressOutput()
    objective = solver.Objective()
    lits = _node_rows(flat, solver, objective)
    for e in range(flat.edge_a.size):
        _edge_rows(flat, solver, objective, lits, e)
    if math.isfinite(flat.limit):
        _memory_rows(flat, solver, lits, segments)
    objective.SetMinimization()
    solver.SetTimeLimit(max(int(seconds * 1000), 1))
    with _quiet_stdout():
        status = solver.Solve()
    if status != pywraplp.Solver.OPTIMAL:
        return -math.inf
    return flat.problem.offset + objective.Value()
