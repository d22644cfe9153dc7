"""Repair an answer of a problem with edge usages until it fits (`repair_to_fit`).

The relaxation of such a problem (`edge_usage.relaxation`) charges each edge usage at its
least over one end, so its answer is cheap and may overflow its true usages, by 20% to
80% on the pipeline stages of a 126-layer Llama over 8x8x8. Its later phases search other
problems (the usages around that answer, lower limits), whose answers that fit cost up to
three times the relaxation's. This repairs the answer itself, in the true problem: while
the usage profile exceeds the limit, at the step where it exceeds most, one group of tied
nodes (a node alone where untied) that holds usage there moves to another strategy: each
group's move with the least added cost per byte it frees at that step, taken in that order,
the first that lowers the profile's summed excess (ties broken by the lowest group then
strategy index: deterministic). Once it fits, a descent moves groups to cheaper strategies
that keep it within the limit, until a pass moves none.

Each group's added cost per strategy (its nodes' costs and its edges' costs with the
neighbours as they are) is kept and recomputed only when the group or a neighbour moves;
a move's usage change at one step is read off its nodes' usage vectors and the edge usages
live there. A move costs O(K (d + u)) for a group of K strategies, d edges and u edge
usages, plus one pass over the candidates.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from autopar.solver.problem import ShardingProblem

# Relative excess below which a profile fits (usage sums are float64 sums of bytes).
TOLERANCE = 1e-9
# A descent move tries at most this many of a group's cheapest strategies for one that fits.
DESCENT_TRIES = 8


class _Repair:
    """The assignment `x` of `problem` being repaired, with its usage profile."""

    def __init__(self, problem: ShardingProblem, choices: Sequence[int]) -> None:
        self.p = problem
        n = problem.num_nodes
        self.x = np.array(choices, dtype=np.int64)
        group_of = np.arange(n)
        for g, members in enumerate(problem.ties):
            group_of[list(members)] = n + g
        order = np.argsort(group_of, kind="stable")
        starts = np.flatnonzero(np.diff(group_of[order], prepend=-1))
        self.groups = np.split(order, starts[1:])
        self.group_of = np.empty(n, dtype=np.int64)
        for g, members in enumerate(self.groups):
            self.group_of[members] = g
        self.edges_of: list[list[int]] = [[] for _ in self.groups]
        for e, (a, b) in enumerate(problem.edges):
            for end in {int(self.group_of[a]), int(self.group_of[b])}:
                self.edges_of[end].append(e)
        self.usages_of: list[list[int]] = [[] for _ in self.groups]
        for u, usage in enumerate(problem.edge_usages):
            a, b = usage.nodes
            for end in {int(self.group_of[a]), int(self.group_of[b])}:
                self.usages_of[end].append(u)
        self.steps = max([hi for _, hi in problem.intervals]
                         + [u.interval[1] for u in problem.edge_usages] + [1])
        # `usage_profile` starts at `profile_start`; these steps count from 0.
        self.profile = np.zeros(self.steps)
        live, first = problem.usage_profile(self.x), problem.profile_start
        self.profile[first:first + live.size] = live
        self._costs: dict[int, np.ndarray] = {}  # group -> added cost per strategy

    def _pair(self, matrix: np.ndarray, a: int, b: int, g: int) -> np.ndarray:
        """`matrix[x_a, x_b]` per strategy of group `g` (which holds a, b or both)."""
        ga, gb = self.group_of[a] == g, self.group_of[b] == g
        if ga and gb:
            return np.diagonal(matrix)
        return matrix[:, self.x[b]] if ga else matrix[self.x[a], :]

    def added_cost(self, g: int) -> np.ndarray:
        """Cost of each strategy of group `g` minus its current one's, neighbours kept."""
        found = self._costs.get(g)
        if found is not None:
            return found
        members = self.groups[g]
        total = sum(self.p.node_costs[i] for i in members)
        for e in self.edges_of[g]:
            a, b = self.p.edges[e]
            total = total + self._pair(self.p.edge_costs[e], a, b, g)
        cost = total - total[self.x[members[0]]]
        self._costs[g] = cost
        return cost

    def added_usage(self, g: int, t: int) -> np.ndarray:
        """Usage at step `t` of each strategy of group `g` minus its current one's."""
        members = self.groups[g]
        total = np.zeros(self.p.node_costs[members[0]].size)
        for i in members:
            lo, hi = self.p.intervals[i]
            if lo <= t < hi:
                total = total + self.p.node_usages[i]
        for u in self.usages_of[g]:
            usage = self.p.edge_usages[u]
            if usage.interval[0] <= t < usage.interval[1]:
                total = total + self._pair(usage.usages, *usage.nodes, g)
        return total - total[self.x[members[0]]]

    def delta(self, g: int, k: int) -> np.ndarray:
        """The change of the usage profile were group `g` at strategy `k`."""
        diff = np.zeros(self.steps + 1)
        for i in self.groups[g]:
            lo, hi = self.p.intervals[i]
            if lo < hi:
                change = self.p.node_usages[i][k] - self.p.node_usages[i][self.x[i]]
                diff[lo] += change
                diff[hi] -= change
        for u in self.usages_of[g]:
            usage = self.p.edge_usages[u]
            lo, hi = usage.interval
            if lo < hi:
                pair = self._pair(usage.usages, *usage.nodes, g)
                change = pair[k] - pair[self.x[self.groups[g][0]]]
                diff[lo] += change
                diff[hi] -= change
        return np.cumsum(diff)[:-1]

    def move(self, g: int, k: int, delta: np.ndarray) -> None:
        """Group `g` to strategy `k`, the profile changed by `delta` (`self.delta`): its
        and its neighbours' added costs forgotten."""
        self.x[self.groups[g]] = k
        self.profile = self.profile + delta
        for e in self.edges_of[g]:
            for end in self.p.edges[e]:
                self._costs.pop(int(self.group_of[end]), None)
        for u in self.usages_of[g]:
            for end in self.p.edge_usages[u].nodes:
                self._costs.pop(int(self.group_of[end]), None)


def repair_to_fit(problem: ShardingProblem, choices: Sequence[int], *,
                  seconds: float) -> tuple[int, ...] | None:
    """`choices` moved group by group until they fit `problem`'s limit, then descended
    (`_descend`) within it (module docstring); None when no move lowers the excess any
    more or `seconds` ran out first. The answer respects the ties and forbidden
    (infinite-cost) strategies."""
    if problem.usage_limit is None or len(choices) != problem.num_nodes:
        return None
    deadline = time.monotonic() + seconds
    state = _Repair(problem, choices)
    if not _repair(state, problem.usage_limit, deadline):
        return None
    _descend(state, problem.usage_limit, deadline)
    picked = tuple(int(k) for k in state.x)
    return picked if problem.is_feasible(picked) else None


def _movable(state: _Repair) -> list[int]:
    """The groups with more than one strategy."""
    return [g for g, members in enumerate(state.groups)
            if state.p.node_costs[members[0]].size > 1]


def _repair(state: _Repair, limit: float, deadline: float) -> bool:
    """Whether moves by the least added cost per byte freed at the step that exceeds the
    limit most (the first, in that order, that lowers the summed excess) brought the
    profile within it before `deadline`."""
    movable = _movable(state)
    tolerance = TOLERANCE * max(1.0, abs(limit))
    while time.monotonic() < deadline:
        excess = state.profile - limit
        t = int(np.argmax(excess))
        if excess[t] <= tolerance:
            return True
        candidates = []
        for g in movable:  # a group with nothing live at t frees nothing there
            freed = -state.added_usage(g, t)
            cost = state.added_cost(g)
            ratio = np.where((freed > 0) & np.isfinite(cost),
                             cost / np.maximum(freed, 1e-300), math.inf)
            k = int(np.argmin(ratio))
            if math.isfinite(ratio[k]):
                candidates.append((float(ratio[k]), g, k))
        before = np.maximum(excess, 0).sum()
        for _, g, k in sorted(candidates):  # the first that lowers the excess overall
            delta = state.delta(g, k)
            if np.maximum(excess + delta, 0).sum() < before:
                state.move(g, k, delta)
                break
        else:
            return False
    return False


def _descend(state: _Repair, limit: float, deadline: float) -> None:
    """Moves that lower the cost and keep the profile within `limit`, group by group in
    index order, each to its cheapest strategy that fits (of the `DESCENT_TRIES` cheapest),
    until a pass moves nothing or `deadline` passes."""
    movable = _movable(state)
    tolerance = TOLERANCE * max(1.0, abs(limit))
    moved = True
    while moved and time.monotonic() < deadline:
        moved = False
        for g in movable:
            cost = state.added_cost(g)
            gain = TOLERANCE * max(1.0, float(np.abs(cost[np.isfinite(cost)]).max()))
            for k in np.argsort(cost, kind="stable")[:DESCENT_TRIES]:
                if not cost[k] < -gain:
                    break
                delta = state.delta(g, int(k))
                if (state.profile + delta).max(initial=-math.inf) <= limit + tolerance:
                    state.move(g, int(k), delta)
                    moved = True
                    break
            if time.monotonic() >= deadline:
                return
