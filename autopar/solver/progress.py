"""`Progress`: a running solve's objective, bound and gap over time, as lines of text.

Every line a phase reports is prefixed with the seconds since the solve began, the best
feasible cost so far (the objective), the best proven lower bound and the gap between
them, so a log shows where the time went and what each phase bought:

      41.3 s  objective 1.66109e+09  bound 2.56429e+08  gap 84.56%  lns round 12: ...

Long phases also call `tick` once per unit of work; it writes a line only when nothing
was written for `every` seconds, so a quiet stretch of search still shows its clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol

from autopar.solver.bounds import gap


class Incumbent(Protocol):
    """What a progress line reads of the search: the best feasible cost so far."""

    cost: float


class _Nothing:
    cost = math.inf


class Progress:
    """Reports of one solve: the objective is read from `best`, the bound is raised by
    `proved` as phases prove better ones."""

    def __init__(self, emit: Callable[[str], None] | None, best: Incumbent | None = None,
                 *, every: float = 5.0, started: float | None = None) -> None:
        self.emit = emit
        self.best = best if best is not None else _Nothing()
        self.every = every
        self.started = time.monotonic() if started is None else started
        self.bound = -math.inf
        self._last = self.started

    @staticmethod
    def silent() -> Progress:
        return Progress(None)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def proved(self, bound: float) -> None:
        """Record a proven lower bound (kept if better than the one known)."""
        self.bound = max(self.bound, bound)

    def __call__(self, message: str) -> None:
        """Write `message` with the clock, objective, bound and gap."""
        if self.emit is None:
            return
        self._last = time.monotonic()
        share = gap(self.best.cost, self.bound)
        shown = f"{share:.2%}" if math.isfinite(share) else "-"
        self.emit(f"{self.elapsed():7.1f} s  objective {self.best.cost:.6g}  "
                  f"bound {self.bound:.6g}  gap {shown}  {message}")

    def tick(self, message: str) -> None:
        """Write `message` only if nothing was written for `every` seconds."""
        if self.emit is not None and time.monotonic() - self._last >= self.every:
            self(message)
