"""`Solution`: what a solve returns."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Solution:
    """A strategy index per node, its cost, a proven lower bound and how it ended.

    `status` is "optimal" (cost == bound), "feasible" (an assignment that fits, maybe not
    optimal), "infeasible" (proven: no assignment fits) or "unknown" (none found in time).
    `choices` is empty and `cost` infinite unless an assignment was found. `memory_free`:
    the cost of the best answer found for the problem without its usage limit (at least
    that problem's optimum; None where none was searched for): how far the limit moves
    the answer's cost from the memory-free one is `cost - memory_free`, at least.
    """

    choices: tuple[int, ...]
    cost: float
    bound: float
    status: str
    wall_time: float
    memory_free: float | None = None

    @property
    def gap(self) -> float:
        """(cost - bound) / |cost|: 0 when optimal, inf when there is no assignment."""
        if self.status == "optimal":
            return 0.0
        if not math.isfinite(self.cost) or not math.isfinite(self.bound):
            return math.inf
        return max(self.cost - self.bound, 0.0) / max(abs(self.cost), 1e-12)
