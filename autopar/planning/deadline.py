"""The time of one planning call: `time_limit` bounds the whole of `plan` or `compile`.

A call solves many problems (the step, each overlap round, micro-batch counts, pipeline
candidates, hand strategies), each worth less than the one before: the first solve
finds the plan, later ones refine it or screen alternatives. `Deadline` holds when the
call must end; each solve is given what it asks for (the whole limit for a plan, the
fractions `graph.screened` and `graph.plan_table` take of it for screening and later
rounds) but no more than its part of what is left, and optional work (another overlap
round, another candidate) is skipped once nothing is left. A solve the call cannot do
without (the first plan, a search that has no plan that fits yet) still gets `LATE_SHARE`
of what it asked for once the deadline has passed, and never less than `LEAST_SOLVE_S`:
a solve too short to find a plan that fits would only turn a late plan into an error.
What runs outside the solver (capture, building problems, the solver's exact reductions)
is not cut short either: a call can end after its deadline, and its plan says when it
did (`SolverReport.planning_s`, `.time_limit_s`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

LATE_SHARE = 0.5
LEAST_SOLVE_S = 0.5


@dataclass(frozen=True)
class Deadline:
    """A planning call that started at `start` (time.monotonic) and should end `seconds`
    later."""

    start: float
    seconds: float

    @staticmethod
    def after(seconds: float) -> Deadline:
        return Deadline(time.monotonic(), float(seconds))

    def spent(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return max(0.0, self.seconds - self.spent())

    def passed(self) -> bool:
        return self.left() <= 0.0

    def solve_seconds(self, wanted: float, share: float = 1.0) -> float:
        """The time limit of one solve that asks for `wanted` seconds: no more than its
        `share` of what is left, and at least `LATE_SHARE` of `wanted` and
        `LEAST_SOLVE_S` (module docstring)."""
        return max(LEAST_SOLVE_S, LATE_SHARE * wanted, min(wanted, share * self.left()))

    def describe(self) -> str:
        return f"{self.spent():.1f} of {self.seconds:g} s spent"
