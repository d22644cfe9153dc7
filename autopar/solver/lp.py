"""The reduced problem as a linear program for HiGHS: its relaxation's bound, and branch
and bound from an incumbent.

Same linearisation as the CP-SAT model (`cpsat.py`): a column x[i, k] per finite strategy,
a column y[e, k, l] per finite strategy pair of every edge, `sum_k x[i, k] = 1` per node,
`sum_l y[e, k, l] = x[a, k]` and `sum_k y[e, k, l] = x[b, l]` per edge, one memory row per
requested segment. With every column continuous in [0, 1] this is the local-polytope
relaxation: its optimum is a lower bound on the reduced cost (memory rows for only some
segments relax it further), and on our torch graphs it usually equals the best cost the
heuristics find, which proves that cost optimal in about a second where CP-SAT's search
needs many. Where it does not, the gap comes from memory (a knapsack over strategies),
which LP-based branch and bound closes in a few nodes: making the x columns integral (the
y columns follow) and starting from the incumbent, HiGHS's MIP proved a 46-node planner
problem whose LP gap is 3.5% optimal in 3 s, where CP-SAT found no better assignment in
60 s. The matrix is built column-wise from numpy arrays, in milliseconds; presolve is
off, since these models have nothing it removes but its own time. HiGHS works to
floating-point tolerances, so its bounds are trusted to about 1e-9 relative, and its
assignments are checked by the caller (`Best.offer`).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import highspy
import numpy as np

from autopar.solver.flat import Flat


@dataclass(frozen=True)
class Relaxed:
    """What one HiGHS run proved: a lower bound on the reduced cost (-inf: none), the best
    assignment it found (None: none, or none better than the incumbent it was given), and
    whether the bound meets that assignment's cost within the gap asked for; the simplex
    iterations it ran (a count, the same on every machine)."""

    bound: float
    x: np.ndarray | None = None
    closed: bool = False
    iterations: int = 0


class LinearModel:
    """The linear model of `flat` with memory rows on `segments`, ready for HiGHS.

    `relax` solves it with continuous columns, `branch` with integral strategy columns,
    starting from an assignment. Each call runs a fresh HiGHS instance.
    """

    def __init__(self, flat: Flat, segments: np.ndarray) -> None:
        self.flat = flat
        finite = np.isfinite(flat.cost_flat)
        # Column of each strategy cell (offsets[i] + k); -1 where the strategy is forbidden.
        self.column = np.where(finite, np.cumsum(finite) - 1, -1)
        self.node_columns = int(finite.sum())
        # Per edge: the column of each strategy pair (-1: forbidden or infinite).
        self.pair_columns: list[np.ndarray] = []
        self._lp = self._build(np.asarray(segments, dtype=np.int64))

    def _allowed(self, i: int) -> np.ndarray:
        """Node i's strategies that have a column."""
        return np.flatnonzero(self.column[self.flat.offsets[i]:self.flat.offsets[i + 1]] >= 0)

    def _build(self, segments: np.ndarray) -> highspy.HighsLp:
        flat, column = self.flat, self.column
        cells = np.flatnonzero(column >= 0)
        node_of_cell = np.repeat(np.arange(flat.num_nodes), flat.sizes)
        costs = [flat.cost_flat[cells]]
        rows, cols, values = [node_of_cell[cells]], [column[cells]], [np.ones(cells.size)]
        lower, upper = [np.ones(flat.num_nodes)], [np.ones(flat.num_nodes)]
        next_row, next_col = flat.num_nodes, self.node_columns
        for e in range(flat.edge_a.size):
            a, b = int(flat.edge_a[e]), int(flat.edge_b[e])
            ra, rb = self._allowed(a), self._allowed(b)
            size = flat.sizes[a] * flat.sizes[b]
            block = flat.edge_flat[flat.edge_off[e]:flat.edge_off[e] + size]
            sub = block.reshape(flat.sizes[a], flat.sizes[b])[np.ix_(ra, rb)]
            pr, pc = np.nonzero(np.isfinite(sub))
            pairs = next_col + np.arange(pr.size)
            pair_column = np.full((flat.sizes[a], flat.sizes[b]), -1)
            pair_column[ra[pr], rb[pc]] = pairs
            self.pair_columns.append(pair_column)
            row_a = next_row + np.arange(ra.size)
            row_b = next_row + ra.size + np.arange(rb.size)
            # y[k, l] once in row (a, k) and once in row (b, l); x[a, k], x[b, l] at -1.
            rows += [row_a[pr], row_b[pc], row_a, row_b]
            cols += [pairs, pairs, column[flat.offsets[a] + ra], column[flat.offsets[b] + rb]]
            values += [np.ones(pr.size), np.ones(pr.size), -np.ones(ra.size), -np.ones(rb.size)]
            costs.append(sub[pr, pc])
            lower.append(np.zeros(ra.size + rb.size))
            upper.append(np.zeros(ra.size + rb.size))
            next_row += ra.size + rb.size
            next_col += pr.size
        if math.isfinite(flat.limit):
            row, col, value = self._memory_rows(segments)
            rows.append(next_row + row)
            cols.append(col)
            values.append(value)
            lower.append(np.full(segments.size, -highspy.kHighsInf))
            upper.append(flat.limit - flat.problem.base[segments])
            next_row += segments.size
        return _column_wise(np.concatenate(rows), np.concatenate(cols),
                            np.concatenate(values), np.concatenate(costs),
                            np.concatenate(lower), np.concatenate(upper),
                            num_rows=next_row, offset=flat.problem.offset)

    def _memory_rows(self, segments: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Entries (row within the memory rows, column, usage) of the memory row of each of
        `segments` (row q for segments[q]): every nonzero usage of a strategy with a column,
        in the rows of the segments its term is live on (term_lo <= s < term_hi)."""
        flat = self.flat
        order = np.argsort(segments, kind="stable")
        ordered = segments[order]
        first = np.searchsorted(ordered, flat.term_lo)
        covered = np.searchsorted(ordered, flat.term_hi) - first
        term_of_entry = np.repeat(np.arange(flat.term_node.size), flat.sizes[flat.term_node])
        entry_column = self.column[flat.term_pos]
        entries = np.flatnonzero((entry_column >= 0) & (flat.term_flat != 0))
        repeats = covered[term_of_entry[entries]]
        entry = np.repeat(entries, repeats)
        starts = np.cumsum(repeats) - repeats
        within = np.arange(entry.size) - np.repeat(starts, repeats)
        segment = np.repeat(first[term_of_entry[entries]], repeats) + within
        return order[segment], entry_column[entry], flat.term_flat[entry]

    def relax(self, seconds: float, iterations: int | None = None) -> Relaxed:
        """The relaxation's optimum as a bound (-inf when HiGHS did not finish with one
        within `seconds` or `iterations` simplex iterations, or the relaxation is
        infeasible, which CP-SAT is left to prove exactly)."""
        highs = _highs(self._lp, seconds)
        if iterations is not None:
            highs.setOptionValue("simplex_iteration_limit", max(int(iterations), 1))
        highs.run()
        info = highs.getInfo()
        if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return Relaxed(-math.inf, iterations=info.simplex_iteration_count)
        return Relaxed(info.objective_function_value, iterations=info.simplex_iteration_count)

    def branch(self, incumbent: np.ndarray, gap: float, seconds: float) -> Relaxed:
        """Branch and bound on the strategy columns from `incumbent` (a feasible
        assignment), until the best assignment is within `gap` (relative) of the bound or
        `seconds` pass. The bound holds whenever HiGHS reports one; `x` is its best
        assignment when that is not the incumbent."""
        flat = self.flat
        highs = _highs(self._lp, seconds)
        highs.setOptionValue("mip_rel_gap", max(gap, 1e-9))
        strategy_columns = np.arange(self.node_columns, dtype=np.int32)
        highs.changeColsIntegrality(self.node_columns, strategy_columns,
                                    np.full(self.node_columns, highspy.HighsVarType.kInteger))
        start = highspy.HighsSolution()
        start.col_value = self._columns_of(incumbent)
        start.value_valid = True
        highs.setSolution(start)
        highs.run()
        info = highs.getInfo()
        status = highs.getModelStatus()
        if status == highspy.HighsModelStatus.kInfeasible:
            return Relaxed(-math.inf)  # the incumbent fits: only tolerances say otherwise
        bound = info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else -math.inf
        values = np.asarray(highs.getSolution().col_value)[:self.node_columns]
        if values.size < self.node_columns:
            return Relaxed(bound)
        taken = np.zeros(flat.cost_flat.size)
        cells = np.flatnonzero(self.column >= 0)
        taken[cells] = values[self.column[cells]]
        x = np.array([int(np.argmax(v)) for v in flat.split(taken)], dtype=np.int64)
        return Relaxed(bound, None if np.array_equal(x, incumbent) else x,
                       status == highspy.HighsModelStatus.kOptimal)

    def _columns_of(self, x: np.ndarray) -> np.ndarray:
        """Column values of assignment `x`: its strategies and its edges' pairs at 1."""
        flat = self.flat
        values = np.zeros(self._lp.num_col_)
        values[self.column[flat.offsets[:-1] + x]] = 1.0
        for e, pair_column in enumerate(self.pair_columns):
            values[pair_column[x[flat.edge_a[e]], x[flat.edge_b[e]]]] = 1.0
        return values


def _column_wise(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, costs: np.ndarray,
                 lower: np.ndarray, upper: np.ndarray, *, num_rows: int,
                 offset: float) -> highspy.HighsLp:
    """A HiGHS model (minimise, columns in [0, 1]) from coordinate entries, duplicates of a
    (row, column) summed."""
    num_cols = costs.size
    key = cols.astype(np.int64) * num_rows + rows
    unique, inverse = np.unique(key, return_inverse=True)
    summed = np.bincount(inverse, values, unique.size)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = num_cols, num_rows
    lp.offset_ = float(offset)
    lp.col_cost_ = costs.astype(np.float64)
    lp.col_lower_ = np.zeros(num_cols)
    lp.col_upper_ = np.ones(num_cols)
    lp.row_lower_ = lower.astype(np.float64)
    lp.row_upper_ = upper.astype(np.float64)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = num_cols, num_rows
    starts = np.searchsorted(unique // num_rows, np.arange(num_cols + 1))
    lp.a_matrix_.start_ = starts.astype(np.int32)
    lp.a_matrix_.index_ = (unique % num_rows).astype(np.int32)
    lp.a_matrix_.value_ = summed
    return lp


@contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Silence C-level stdout: HiGHS prints a banner as its first instance starts."""
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


def _highs(lp: highspy.HighsLp, seconds: float) -> highspy.Highs:
    """A quiet, single-threaded HiGHS instance holding `lp`, stopping after `seconds`."""
    with _quiet_stdout():
        highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("presolve", "off")
    highs.setOptionValue("threads", 1)
    highs.setOptionValue("time_limit", max(float(seconds), 0.01))
    highs.passModel(lp)
    return highs
