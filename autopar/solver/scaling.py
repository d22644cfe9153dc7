"""Integer scales for CP-SAT, which only takes integer coefficients.

Costs that are already integers (IOPDDL's) keep scale 1, so CP-SAT optimises them exactly.
Fractional costs (seconds, from the torch cost model) are multiplied so the largest finite
cost becomes about 2**40 and rounded: relative error about 1e-12 per term. Usages are
scaled the same way but rounded *up*, and capacities down, so that any assignment CP-SAT
accepts truly fits in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autopar.solver.flat import Flat

TARGET = 2.0**40


def _scale(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return 1.0
    biggest = float(np.abs(finite).max())
    if np.array_equal(finite, np.round(finite)) and biggest * finite.size < 2.0**62:
        return 1.0
    return TARGET / biggest if biggest > 0 else 1.0


@dataclass(frozen=True)
class Scales:
    """Multipliers from float costs/usages to CP-SAT integers."""

    cost: float
    usage: float

    @staticmethod
    def of(flat: Flat) -> Scales:
        costs = np.concatenate([flat.cost_flat, flat.edge_flat])
        return Scales(cost=_scale(costs), usage=_scale(flat.term_flat))

    def cost_int(self, values: np.ndarray) -> np.ndarray:
        return np.round(values * self.cost).astype(np.int64)

    def usage_int(self, values: np.ndarray) -> np.ndarray:
        return np.ceil(values * self.usage).astype(np.int64)

    def capacity_int(self, value: float) -> int:
        if not math.isfinite(value):
            return 2**62
        return int(math.floor(value * self.usage))
