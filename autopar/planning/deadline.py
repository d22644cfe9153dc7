"""The time of one planning call: `time_limit` bounds the whole of `plan` or `compile`.

A call solves many problems (the step, each overlap round, micro-batch counts, pipeline
candidates, hand strategies), each worth less than the one before: the first solve
finds the plan, later ones refine it or screen alternatives. `Deadline` holds when the
call must end; each solve is given at most `SOLVE_SHARE` of the whole limit (the later
ones the fractions `graph.screened` and `graph.plan_table` take of that) and never more
than what is left, and optional work (another overlap round, another candidate) is
skipped once nothing is left. A solve is never given less than `LEAST_SOLVE_S`, and what
runs outside the solver (capture, building problems, the solver's exact reductions) is
not cut short: a call can end a little after its deadline, and its plan says when it did
(`SolverReport.planning_s`, `.time_limit_s`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# The most of the whole time limit one solve is given: about the first solve, one
# overlap round at half of it, and the screening of two candidates at a quarter each.
SOLVE_SHARE = 0.4
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
        `SOLVE_SHARE` of the call's limit or what is left of it, at least `LEAST_SOLVE_S`."""
        return max(LEAST_SOLVE_S, min(wanted, SOLVE_SHARE * self.seconds, self.left()))

    def describe(self) -> str:
        return f"{self.spent():.1f} of {self.seconds:g} s spent"
