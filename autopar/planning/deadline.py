"""The time of one planning call: `time_limit` bounds the whole of `plan` or `compile`.

A call solves many problems (the step, each overlap round, micro-batch counts, pipeline
candidates, hand strategies), each worth less than the one before: the first solve
finds the plan, later ones refine it or screen alternatives. `Deadline` holds when the
call must end; each solve is given at most `SOLVE_SHARE` of the whole limit (the later
ones the fractions `graph.screened` and `graph.plan_table` take of that) and never more
than what is left, and optional work (another overlap round, another candidate) is
skipped once nothing is left. A solve the call cannot do without (the first plan, a
search that has no plan that fits yet) still gets `LATE_SHARE` of its time once the
deadline has passed, and never less than `LEAST_SOLVE_S`: a solve too short to find a
plan that fits would only turn a late plan into an error. What runs outside the solver
(capture, building problems, the solver's exact reductions) is not cut short either: a
call can end after its deadline, and its plan says when it did
(`SolverReport.planning_s`, `.time_limit_s`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# The most of the whole time limit one solve is given: about the first solve, one
# overlap round at half of it, and the screening of two candidates at a quarter each.
SOLVE_SHARE = 0.4
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

    def solve_seconds(self, wanted: float) -> float:
        """The time limit of one solve that would take `wanted` seconds: no more than
        `SOLVE_SHARE` of the call's limit or what is left of it, and at least `LATE_SHARE`
        of that share and `LEAST_SOLVE_S` (module docstring)."""
        share = min(wanted, SOLVE_SHARE * self.seconds)
        return max(LEAST_SOLVE_S, LATE_SHARE * share, min(share, self.left()))

    def describe(self) -> str:
        return f"{self.spent():.1f} of {self.seconds:g} s spent"
