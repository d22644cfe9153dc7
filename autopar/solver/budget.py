"""How a time limit is spent, decided from problem sizes only.

The phases get work budgets: a number of Lagrangian iterations, a CP-SAT
deterministic-time budget, an LNS deterministic-time budget. They are derived from the
time limit with a per-operation cost model measured on a 2-core machine (the IOPDDL
instances A, G, M, S: reduction, Lagrangian iteration and LNS round times within about
20%). A repeatable solve keeps to all of them, the wall clock being only a safety cap
that stops a phase early if the machine is slower than the model assumes (only then can
two runs of the same input differ; on a faster machine the solve ends before its limit).
Otherwise only the Lagrangian phase has a budget, and the search after it runs until
the limit: where the penalty search runs, a whole-problem model has at most
`EXACT_SHARE` of it, and the guided search the last `GUIDED_SHARE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autopar.solver.flat import Flat
from autopar.solver.problem import ShardingProblem

# A whole-problem CP-SAT model is built when it has at most this many booleans, and
# building it takes at most this share of the time after the reductions (the rest is
# CP-SAT's; a model that would leave it too little is searched by LNS, whose models are
# small).
EXACT_CELLS = 400_000
EXACT_BUILD_SHARE = 0.4
# CP-SAT deterministic time per wall-clock second on a 2-core machine (2 workers,
# interleaved): 0.5 to 0.8 depending on the model; above the middle, so that slow models
# end on the wall-clock cap rather than leave time unused.
DET_PER_SECOND = 0.75
# CP-SAT deterministic time of one LNS round.
LNS_ROUND_DETERMINISTIC = 1.0
# Shares of the time after the reductions for the Lagrangian warm start: before a whole-
# problem CP-SAT model, and before the guided search and LNS; they have the rest.
LAGRANGE_SHARE_EXACT = 0.15
LAGRANGE_SHARE = 0.2
# A repeatable solve (the planner's) stops once its gap is within this: a plan 0.1% from
# proven optimal is not worth the rest of the budget (the 70B shape on 8x8 spent 22 of its
# 24 s proving the last 0.015%), and the summary reports the gap.
PLANNER_GAP = 1e-3
# After the Lagrangian, guided-search runs until this many iterations in a row find
# nothing better than the run's own best (IOPDDL's S: about 25 s; runs there last found
# something 300 to 700 iterations in), each from the Lagrangian's prices shaken by
# lognormal noise of this sigma; after a run that found nothing, LNS rounds for this
# much deterministic time.
GUIDED_PATIENCE = 400
PRICE_NOISE = 0.5
LNS_SLICE = 10.0
# Where the penalty search runs, the guided search has this share of the time after the
# Lagrangian, at the end, from the incumbent the crossings made.
GUIDED_SHARE = 0.2
# Where the penalty search runs, a whole-problem CP-SAT model has at most this share of
# the time after the Lagrangian; the penalty search has the rest.
EXACT_SHARE = 0.5


def estimate_reduce_seconds(problem: ShardingProblem) -> float:
    """Rough wall time of `reduce_problem` on the problem: on 2 cores, IOPDDL's A, M and S
    (28,500 to 35,000 nodes) took 2.7 to 4.6 s, G (816) 0.19 s, and the planner's problems
    of a 32-layer Llama (2,219) 0.15 s; this is 0.16 s on G, 0.34 s on the Llama's, and
    within 20% on the large ones (S 16% under)."""
    return 0.05 + 1.3e-4 * problem.num_nodes


def iteration_seconds(flat: Flat) -> float:
    """Rough wall time of one Lagrangian iteration (IOPDDL's A, M, S and planner problems
    within 30%, G 1.7 times over)."""
    return (5e-4 + 9e-5 * flat.num_nodes + 5e-9 * flat.edge_flat.size
            + 5e-7 * flat.term_node.size)


def lns_round_overhead(flat: Flat, cells: int) -> float:
    """What one LNS round of a neighbourhood of `cells` booleans costs besides CP-SAT
    (choosing it, building its model, checking answers), in deterministic time."""
    seconds = 1.5e-4 * flat.num_nodes + 2e-5 * flat.term_node.size + 5e-6 * cells
    return seconds * DET_PER_SECOND


def finish_seconds(problem: ShardingProblem) -> float:
    """Rough wall time of expanding and checking the answer on the original problem."""
    return 0.2 + 1e-5 * (problem.num_nodes + problem.num_edges)


def model_cells(flat: Flat) -> int:
    """Booleans of a whole-problem CP-SAT model: strategies plus edge pairs."""
    return int(flat.sizes.sum() + flat.edge_flat.size)


def model_build_seconds(flat: Flat) -> float:
    """Rough wall time of building the whole-problem CP-SAT model (4-5 us a boolean)."""
    return 5e-6 * model_cells(flat)


@dataclass(frozen=True)
class PhaseBudgets:
    """Work budgets of the phases of one solve.

    The Lagrangian phase may stop early (no progress for `patience` iterations); the
    phases after it get the time the plan assigns to what is left, computed from the
    number of iterations actually run (a count, so still repeatable). Unless the plan is
    `repeatable`, they have no work budget: they run until the wall clock's limit.
    """

    lagrange_iterations: int
    patience: int
    exact: bool
    seconds: float
    iteration_seconds: float
    build_seconds: float
    repeatable: bool = True

    @staticmethod
    def of(flat: Flat, seconds: float, *, repeatable: bool = True) -> PhaseBudgets:
        """Split `seconds` (what is left after reductions) between the phases."""
        seconds = max(seconds, 0.1)
        build = model_build_seconds(flat)
        exact = model_cells(flat) <= EXACT_CELLS and build <= EXACT_BUILD_SHARE * seconds
        share = LAGRANGE_SHARE_EXACT if exact else LAGRANGE_SHARE
        each = iteration_seconds(flat)
        iterations = max(min(int(share * seconds / each), 400), 3)
        return PhaseBudgets(iterations, 15 if exact else 10, exact, seconds, each,
                            build if exact else 0.0, repeatable)

    def rest(self, lagrange_done: int) -> float:
        """Seconds left for the phases after that many Lagrangian iterations."""
        return max(self.seconds - lagrange_done * self.iteration_seconds,
                   0.1 * self.seconds)

    def deterministic(self, lagrange_done: int) -> float:
        """CP-SAT deterministic-time budget of the whole-problem phase: what is left after
        building its model."""
        if not self.repeatable:
            return math.inf
        return max(self.rest(lagrange_done) - self.build_seconds, 0.0) * DET_PER_SECOND

    def lns_deterministic(self, lagrange_done: int) -> float:
        """Deterministic-time budget of the LNS phase, its rounds' overheads included."""
        if not self.repeatable:
            return math.inf
        return self.rest(lagrange_done) * DET_PER_SECOND
