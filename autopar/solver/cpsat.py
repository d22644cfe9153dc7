"""CP-SAT on a reduced problem, or on the free part of it with the other nodes fixed.

Model: a boolean per (free node, strategy) with finite cost, exactly one per node; a
boolean per finite strategy pair of every edge between free nodes, tied to its endpoints by
`sum_l y[k, l] == x_a[k]` and `sum_k y[k, l] == x_b[l]` (the local-polytope linearisation,
whose LP relaxation is the tightest of the usual ones); edges to fixed nodes become node
costs. Memory: one linear constraint per requested segment over one integer usage variable
per piece of a free node (`pieces.py`), the fixed nodes' usage moved to the right-hand
side. Determinism: CP-SAT is run with `interleave_search` and a
deterministic-time limit, so the same input gives the same answer; the wall-clock limit is
only a safety net (a run that hits it may differ between machines).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from autopar.solver.flat import Flat
from autopar.solver.pieces import memory_pieces
from autopar.solver.scaling import Scales

STATUS = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
          cp_model.INFEASIBLE: "infeasible", cp_model.UNKNOWN: "unknown"}


@dataclass(frozen=True, eq=False)
class SubResult:
    """Outcome of one CP-SAT run: the new assignment (None if none found), CP-SAT's status,
    a lower bound on the reduced objective with the fixed nodes as given, the
    deterministic time the run used, and the left-out segments a solution broke (status
    "stopped" then: the search was cut short to add them)."""

    x: np.ndarray | None
    status: str
    bound: float
    deterministic: float = 0.0
    broken: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


@dataclass(frozen=True)
class Limits:
    """Search budget: deterministic time (the real limit) and a wall-clock safety cap;
    `probing` (CP-SAT's probing, in presolve and search) pays off on a whole problem whose
    optimum is to be proven, but on a small neighbourhood with large edge matrices it can
    take the whole budget before the search starts."""

    deterministic: float
    wall: float
    seed: int = 0
    workers: int = 1
    probing: bool = True


def _unaries(flat: Flat, x: np.ndarray, free: np.ndarray) -> dict[int, np.ndarray]:
    """Per free node, its costs plus its edges' to the fixed nodes as in x."""
    unary = flat.with_neighbours(x, flat.cost_flat, outside=~free)
    return {int(i): unary[flat.offsets[i]:flat.offsets[i + 1]] for i in np.flatnonzero(free)}


def _fixed_cost(flat: Flat, x: np.ndarray, free: np.ndarray) -> float:
    nodes = flat.cost_flat[flat.offsets[:-1] + x][~free].sum()
    both = ~free[flat.edge_a] & ~free[flat.edge_b]
    idx = flat.edge_off + x[flat.edge_a] * flat.edge_cols + x[flat.edge_b]
    return float(flat.problem.offset + nodes + flat.edge_flat[idx][both].sum())


class SubModel:
    """The CP-SAT model of the free nodes of `flat` given assignment x for the rest."""

    def __init__(self, flat: Flat, scales: Scales, x: np.ndarray, free: np.ndarray) -> None:
        self.flat, self.scales, self.x, self.free = flat, scales, x, free
        self.model = cp_model.CpModel()
        self.const = _fixed_cost(flat, x, free)
        self.infeasible = False
        self.lits: dict[int, dict[int, cp_model.IntVar]] = {}
        terms: list[tuple[int, cp_model.IntVar]] = []
        for i, u in _unaries(flat, x, free).items():
            ks = np.flatnonzero(np.isfinite(u))
            if ks.size == 0:
                self.infeasible = True
                return
            low = float(u[ks].min())
            self.const += low
            coef = scales.cost_int(u[ks] - low)
            self.lits[i] = {int(k): self.model.NewBoolVar("") for k in ks}
            self.model.AddExactlyOne(self.lits[i].values())
            terms += [(int(c), self.lits[i][int(k)]) for k, c in zip(ks, coef) if c]
        self.hint(x)
        for e in np.flatnonzero(free[flat.edge_a] & free[flat.edge_b]):
            terms += self._edge(int(e))
        self.model.Minimize(cp_model.LinearExpr.WeightedSum([v for _, v in terms],
                                                            [c for c, _ in terms]))

    def hint(self, x: np.ndarray) -> None:
        """Hint assignment `x` (replacing any hint before): each node's literals only,
        which fix the rest of the model by propagation."""
        self.model.clear_hints()
        for i, lits in self.lits.items():
            if int(x[i]) in lits:
                for k, v in lits.items():
                    self.model.add_hint(v, k == x[i])

    def _edge(self, e: int) -> list[tuple[int, cp_model.IntVar]]:
        flat = self.flat
        a, b = int(flat.edge_a[e]), int(flat.edge_b[e])
        la, lb = self.lits[a], self.lits[b]
        m = flat.edge_flat[flat.edge_off[e]:flat.edge_off[e] + flat.sizes[a] * flat.sizes[b]]
        m = m.reshape(flat.sizes[a], flat.sizes[b])
        rows, cols = np.fromiter(la, int), np.fromiter(lb, int)
        sub = m[np.ix_(rows, cols)]
        finite = np.isfinite(sub)
        if not finite.any():
            self.infeasible = True
            return []
        low = float(sub[finite].min())
        self.const += low
        coef = self.scales.cost_int(np.where(finite, sub - low, 0.0))
        by_row: list[list] = [[] for _ in rows]
        by_col: list[list] = [[] for _ in cols]
        out = []
        # No hints here: the two nodes' hinted literals fix every pair's by propagation
        # (a row and a column summing to one), and hinting 10^5 pairs costs more than the
        # solve on a short time limit.
        new_bool = self.model.new_bool_var
        for r, c in zip(*np.nonzero(finite)):
            y = new_bool("")
            by_row[r].append(y)
            by_col[c].append(y)
            if coef[r, c]:
                out.append((int(coef[r, c]), y))
        add, total = self.model.Add, cp_model.LinearExpr.Sum
        for r, ys in enumerate(by_row):
            add(total(ys) == la[int(rows[r])])
        for c, ys in enumerate(by_col):
            add(total(ys) == lb[int(cols[c])])
        return out

    def add_memory(self, segments: np.ndarray) -> None:
        """Constrain usage on the given segments (fixed nodes' usage as a constant); call
        again with other segments to add theirs.

        Each piece of a free node's usage (`pieces.py`) becomes one integer variable, so a
        segment's row has one entry per live free node, not one per strategy.
        """
        flat, scales, x = self.flat, self.scales, self.x
        if self.infeasible or not math.isfinite(flat.limit) or len(segments) == 0:
            return
        chosen = np.unique(np.asarray(segments, dtype=np.int64))
        fixed, pieces = memory_pieces(flat, x, self.free, chosen)
        rhs = np.array([scales.capacity_int(flat.limit - f) for f in fixed], dtype=np.int64)
        most = np.zeros(chosen.size, dtype=np.int64)
        rows: list[list[cp_model.IntVar]] = [[] for _ in chosen]
        for piece in pieces:
            lits = self.lits[piece.node]
            ks = np.fromiter(lits, int)
            coef = scales.usage_int(piece.usage[ks])
            low, top = int(coef.min()), int(coef.max())
            rhs[piece.first:piece.last] -= low
            if top == low:
                continue
            var = self.model.NewIntVar(0, top - low, "")
            self.model.Add(var == cp_model.LinearExpr.WeightedSum(
                [lits[int(k)] for k in ks], [int(c) - low for c in coef]))
            most[piece.first:piece.last] += top - low
            for q in range(piece.first, piece.last):
                rows[q].append(var)
        if (rhs < 0).any():
            self.infeasible = True
            return
        for q in np.flatnonzero(most > rhs):
            self.model.Add(sum(rows[q]) <= int(rhs[q]))

    def _read(self, value: Callable[[cp_model.IntVar], bool]) -> np.ndarray:
        y = self.x.copy()
        for i, lits in self.lits.items():
            y[i] = next(k for k, v in lits.items() if value(v))
        return y

    def solve(self, limits: Limits,
              check: Callable[[np.ndarray], np.ndarray] | None = None) -> SubResult:
        """Run CP-SAT. `check(y)` lists segments a solution y breaks (the model may lack
        some memory constraints); the search stops at the first solution that breaks any,
        and `SubResult.broken` reports them. `x` is the best solution that broke none."""
        if self.infeasible:
            return SubResult(None, "infeasible", math.inf, 0.0)
        solver = cp_model.CpSolver()
        params = solver.parameters
        params.max_time_in_seconds = max(limits.wall, 0.01)
        params.max_deterministic_time = max(limits.deterministic, 0.01)
        params.num_workers = limits.workers
        params.random_seed = limits.seed
        params.interleave_search = limits.workers > 1
        if not limits.probing:
            params.cp_model_probing_level = 0
        watch = _Watch(self, check)
        status = STATUS.get(solver.Solve(self.model, watch), "unknown")
        bound = self.const + solver.best_objective_bound / self.scales.cost
        used = solver.deterministic_time
        if status == "infeasible":
            return SubResult(None, status, math.inf, used)
        if watch.broken.size:
            status = "stopped"
        elif status in ("optimal", "feasible"):
            watch.last = self._read(solver.BooleanValue)
        return SubResult(watch.last, status if watch.last is not None else "unknown",
                         bound, used, watch.broken)


class _Watch(cp_model.CpSolverSolutionCallback):
    """Checks each solution against the memory constraints left out of the model."""

    def __init__(self, sub: SubModel, check: Callable[[np.ndarray], np.ndarray] | None):
        super().__init__()
        self.sub, self.check = sub, check
        self.last: np.ndarray | None = None
        self.broken = np.zeros(0, dtype=np.int64)

    def on_solution_callback(self) -> None:
        if self.check is None:
            return
        y = self.sub._read(self.BooleanValue)
        broken = self.check(y)
        if broken.size:
            self.broken = broken
            self.StopSearch()
        else:
            self.last = y
