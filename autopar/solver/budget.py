"""How a time limit is spent, decided from problem sizes only (so runs are repeatable).

The phases get work budgets, not deadlines: a number of Lagrangian iterations, a CP-SAT
deterministic-time budget, a number of LNS rounds. They are derived from the time limit
with a per-operation cost model measured on a 2-core machine; the wall clock is only a
safety cap that stops a phase early if the machine is slower than the model assumes
(only then can two runs of the same input differ).
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.solver.flat import Flat
from autopar.solver.problem import ShardingProblem

# A whole-problem CP-SAT model is built when it has at most this many booleans.
EXACT_CELLS = 400_000
# CP-SAT deterministic time per wall-clock second, measured here (2 workers, interleaved).
DET_PER_SECOND = 0.5
# CP-SAT deterministic time of one LNS round.
LNS_ROUND_DETERMINISTIC = 1.0


def estimate_reduce_seconds(problem: ShardingProblem) -> float:
    """Rough wall time of `reduce_problem` on the problem."""
    cells = sum(c.size for c in problem.edge_costs)
    return 0.5 + 1.5e-4 * problem.num_nodes + 1e-4 * problem.num_edges + 3e-7 * cells


def iteration_seconds(flat: Flat) -> float:
    """Rough wall time of one Lagrangian iteration."""
    return (0.01 + 2.5e-4 * flat.num_nodes + 8e-5 * flat.edge_a.size
            + 2e-7 * flat.edge_flat.size + 5e-6 * flat.term_node.size)


def lns_round_seconds(flat: Flat) -> float:
    """Rough wall time of one LNS round (model building, CP-SAT, checks)."""
    return 0.4 + 3.2e-4 * flat.num_nodes + 1e-5 * flat.term_node.size


def finish_seconds(problem: ShardingProblem) -> float:
    """Rough wall time of expanding and checking the answer on the original problem."""
    return 0.2 + 1e-5 * (problem.num_nodes + problem.num_edges)


def model_cells(flat: Flat) -> int:
    """Booleans of a whole-problem CP-SAT model: strategies plus edge pairs."""
    return int(flat.sizes.sum() + flat.edge_flat.size)


@dataclass(frozen=True)
class Plan:
    """Work budgets of the phases of one solve."""

    lagrange_iterations: int
    patience: int
    exact: bool
    deterministic: float
    lns_rounds: int

    @staticmethod
    def of(flat: Flat, seconds: float) -> Plan:
        """Split `seconds` (what is left after reductions) between the phases."""
        seconds = max(seconds, 0.1)
        exact = model_cells(flat) <= EXACT_CELLS
        share = 0.15 if exact else 0.45
        iterations = int(share * seconds / iteration_seconds(flat))
        iterations = max(min(iterations, 400), 3)
        rest = max(seconds - iterations * iteration_seconds(flat), 0.1 * seconds)
        if exact:
            return Plan(iterations, 15, True, rest * DET_PER_SECOND, 0)
        return Plan(iterations, 60, False, LNS_ROUND_DETERMINISTIC,
                    int(rest / lns_round_seconds(flat)))
