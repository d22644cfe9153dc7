"""Two problems as one: two programs that share some decisions (the weights both read, a
cache both write), each run on its own timeline, weighed by how often each runs.

    combined = weights[0] x first + weights[1] x second,   shared pairs chosen alike

The second problem's nodes follow the first's, and its time steps follow the first's last
one: the programs never run at once, so each step's usage is one program's alone, and a
state both hold counts in each timeline once (each program's own nodes count it there).
A shared pair (i of the first, j of the second) gets an edge whose cost is 0 where the two
strategies are the same decision (`same[k, l]`) and inf elsewhere, so the solve chooses
it once, for both. `split` maps an answer back to each problem.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from autopar.solver.problem import EdgeUsage, ShardingProblem
from autopar.solver.solution import Solution


def horizon(problem: ShardingProblem) -> int:
    """The first time step after every usage of `problem`."""
    ends = [hi for _, hi in problem.intervals] + [u.interval[1] for u in problem.edge_usages]
    return max(ends, default=0)


def combined(first: ShardingProblem, second: ShardingProblem, *,
             weights: tuple[float, float] = (1.0, 1.0),
             shared: Sequence[tuple[int, int, np.ndarray]] = ()) -> ShardingProblem:
    """The problem choosing for both (module docstring); `shared` lists (i, j, same):
    node i of `first` and node j of `second`, and which of their strategy pairs agree."""
    n, shift = first.num_nodes, horizon(first)
    a, b = weights

    def moved(interval: tuple[int, int]) -> tuple[int, int]:
        lo, hi = interval
        return (lo + shift, hi + shift) if lo < hi else (lo, hi)

    equal = [np.where(same, 0.0, math.inf) for _, _, same in shared]
    return ShardingProblem(
        node_costs=tuple(_scaled(c, a) for c in first.node_costs)
        + tuple(_scaled(c, b) for c in second.node_costs),
        node_usages=first.node_usages + second.node_usages,
        intervals=first.intervals + tuple(moved(iv) for iv in second.intervals),
        edges=first.edges + tuple((i + n, j + n) for i, j in second.edges)
        + tuple((i, j + n) for i, j, _ in shared),
        edge_costs=tuple(_scaled(m, a) for m in first.edge_costs)
        + tuple(_scaled(m, b) for m in second.edge_costs) + tuple(equal),
        usage_limit=first.usage_limit,
        ties=first.ties + tuple(tuple(i + n for i in group) for group in second.ties),
        name=f"{first.name} + {second.name}",
        edge_usages=first.edge_usages + tuple(
            EdgeUsage((u.nodes[0] + n, u.nodes[1] + n), u.usages, moved(u.interval))
            for u in second.edge_usages))


def _scaled(costs: np.ndarray, weight: float) -> np.ndarray:
    """`costs` times `weight`, forbidden (inf) entries kept forbidden even at weight 0 (a
    program that does not run: its choices cost nothing, but stay allowed or not)."""
    with np.errstate(invalid="ignore"):  # 0 x inf, computed and then not taken
        return np.where(np.isinf(costs), costs, weight * costs)


def split(solution: Solution, first: ShardingProblem, second: ShardingProblem
          ) -> tuple[Solution, Solution]:
    """`solution` of `combined(first, second, ...)` as one of each: its choices for each
    problem's nodes, at each one's own cost, with the combination's status and relative
    gap (a bound of each part alone was not proven)."""
    n = first.num_nodes
    ratio = solution.bound / solution.cost if solution.cost > 0 and math.isfinite(
        solution.cost) else 1.0

    def part(choices: tuple[int, ...], problem: ShardingProblem) -> Solution:
        cost = problem.cost(choices) if choices else math.inf
        return Solution(choices, cost, cost * ratio if choices else solution.bound,
                        solution.status, solution.wall_time)

    return part(solution.choices[:n], first), part(solution.choices[n:], second)
