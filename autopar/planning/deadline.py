"""The time of one planning call: `time_limit` bounds the solving of all of `plan` or
`compile`, as a budget of solver seconds.

A call solves many problems (the step, each overlap round, micro-batch counts, pipeline
candidates, hand strategies), each worth less than the one before: the first solve finds
the plan, later ones refine it or screen alternatives. `Deadline` keeps the call's
budget: each solve is given what it asks for (the whole limit for a plan, the fractions
`graph.screened` and `graph.plan_table` take of it for screening and later rounds) but no
more than its part of what is left, and is charged that limit (`charge`; one that proves
its plan optimal ends early and is charged `LEAST_SOLVE_S`); optional work (another
overlap round, another candidate) is skipped once nothing is left. A solve the call
cannot do without (the first plan, a search that has no plan that fits yet) still gets
`LATE_SHARE` of what it asked for once the budget is spent, and never less than
`LEAST_SOLVE_S`: a solve too short to find a plan that fits would only turn a late plan
into an error.

The budget counts limits, not the wall clock, so that a plan stays reproducible: the same
model, mesh, options and seed give the same plan on any machine (the solves are
repeatable, `autopar.solver.solve`), whatever else the machine runs. Capture and building
problems are not charged, and a solve can end a little after its limit: the call's wall
time is recorded beside the limit (`SolverReport.planning_s`, `.time_limit_s`).
"""

from __future__ import annotations

import time

LATE_SHARE = 0.5
LEAST_SOLVE_S = 0.5


class Deadline:
    """The solver seconds a planning call may still hand out, of `seconds` (`allotted`
    handed out so far), and the wall clock since it started (`spent`, reported only). A
    plain object owned by the call."""

    def __init__(self, seconds: float, allotted: float = 0.0) -> None:
        self.seconds, self.allotted = float(seconds), float(allotted)
        self._start = time.monotonic()

    def spent(self) -> float:
        """Wall seconds since the call started."""
        return time.monotonic() - self._start

    def left(self) -> float:
        return max(0.0, self.seconds - self.allotted)

    def passed(self) -> bool:
        return self.left() <= 0.0

    def solve_seconds(self, wanted: float, share: float = 1.0) -> float:
        """The time limit of one solve that asks for `wanted` seconds: no more than its
        `share` of what is left, and at least `LATE_SHARE` of `wanted` and
        `LEAST_SOLVE_S` (module docstring)."""
        return max(LEAST_SOLVE_S, LATE_SHARE * wanted, min(wanted, share * self.left()))

    def charge(self, seconds: float, *, optimal: bool) -> None:
        """Count a solve given `seconds`; one that proved its plan `optimal` ended early."""
        self.allotted += LEAST_SOLVE_S if optimal else seconds

    def describe(self) -> str:
        return f"{self.allotted:.1f} of {self.seconds:g} solver s allotted"


def expired(deadline: Deadline | None) -> bool:
    """Whether a call's `deadline` has no seconds left (never without one)."""
    return deadline is not None and deadline.passed()
