"""`ShardingProblem`: the generic strategy-selection problem the solver works on.

Pick one strategy per node to minimise the sum of the chosen node costs and of the edge costs
of the chosen pairs, such that at every time step the summed memory usage of the nodes live
at that step stays within `usage_limit`. It is the problem of the IOPDDL contest; the torch
planner builds the same object from a model. Forbidden choices cost `math.inf`.

Beyond the contest's, a problem may carry usage that depends on the choices of two nodes
(`EdgeUsage`: a tensor one op makes for another, whose size depends on both ends); the
solve turns each into a node of its own (`autopar.solver.edge_usage`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from autopar.errors import ProblemFormatError

# Values checked per numpy call when validating (`_first_bad`): one call per batch of
# arrays, not per array, on problems of thousands of small vectors and matrices.
CHECKED_PER_CALL = 1 << 22


def _vector(value: object, what: str) -> np.ndarray:
    """`value` as a float64 vector; its values are checked by the caller (`_first_bad`)."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ProblemFormatError(f"{what} is not numeric", expected="a list of numbers",
                                 got=repr(value)[:80], fix="give numbers only") from exc
    if array.ndim != 1 or array.size == 0:
        raise ProblemFormatError(f"{what} is not a non-empty list of numbers",
                                 expected="a 1-d array without NaN",
                                 got=f"shape {array.shape}", fix="give one value per strategy")
    return array


def _first_bad(arrays: Sequence[np.ndarray], bad: Callable[[np.ndarray], np.ndarray]
               ) -> int | None:
    """The index of the first of `arrays` where the elementwise test `bad` holds somewhere,
    or None: tested over batches of up to `CHECKED_PER_CALL` values, then, in a batch where
    it holds, array by array."""
    start, size = 0, 0
    for end, array in enumerate([*arrays, None]):
        if array is not None and size + array.size <= CHECKED_PER_CALL:
            size += array.size
            continue
        batch = arrays[start:end]
        if batch and bad(np.concatenate([a.ravel() for a in batch])).any():
            return start + next(k for k, a in enumerate(batch) if bad(a).any())
        start, size = end, 0 if array is None else array.size
    return None


@dataclass(frozen=True, eq=False)
class _LiveTerms:
    """A problem's usage terms live at some step, as arrays: the profile's `start` (the
    earliest lo, 0 when none is live), each term's steps [lo, hi) from it (nodes' terms
    first, then edge usages'); the live nodes with their usage vectors concatenated
    (`node_usage`, each from `node_offset`); the live edge usages' ends with their matrices
    concatenated row-major (`pair_usage`, each from `pair_offset`, rows `pair_stride`
    long)."""

    start: int
    lo: np.ndarray
    hi: np.ndarray
    node: np.ndarray
    node_usage: np.ndarray
    node_offset: np.ndarray
    pair_a: np.ndarray
    pair_b: np.ndarray
    pair_usage: np.ndarray
    pair_offset: np.ndarray
    pair_stride: np.ndarray


@dataclass(frozen=True, eq=False)
class EdgeUsage:
    """Usage `usages[ka, kb]` at the time steps `interval[0] <= t < interval[1]` when nodes
    `nodes = (a, b)` pick strategies ka and kb (a != b). An entry may be negative when it
    is part of a sum of edge usages of the same ends and interval that is not, on every
    pair of finite cost (a usage of one end alone taken back by another's): the reductions
    take what a time step adds for non-negative."""

    nodes: tuple[int, int]
    usages: np.ndarray
    interval: tuple[int, int]


@dataclass(frozen=True, eq=False)
class ShardingProblem:
    """Pick one strategy per node to minimise node costs + edge costs s.t. memory.

    Contract: `node_costs[i]` and `node_usages[i]` are float64 vectors of the same length
    (the strategies of node i; cost `inf` forbids one). Node i's usage counts at the time
    steps `intervals[i][0] <= t < intervals[i][1]` (none when lo >= hi). `edge_costs[e]` has
    shape `(len(node_costs[a]), len(node_costs[b]))` for `edges[e] == (a, b)`; several edges
    may join the same pair and their costs add. `ties` lists groups of nodes that must pick
    the same strategy index. `edge_usages` add usage that depends on two nodes' choices
    (`EdgeUsage`, finite). Inputs are converted to read-only float64 arrays; malformed data
    raises `ProblemFormatError`.
    """

    node_costs: tuple[np.ndarray, ...]
    node_usages: tuple[np.ndarray, ...]
    intervals: tuple[tuple[int, int], ...]
    edges: tuple[tuple[int, int], ...]
    edge_costs: tuple[np.ndarray, ...]
    usage_limit: float | None = None
    ties: tuple[tuple[int, ...], ...] = ()
    name: str = ""
    edge_usages: tuple[EdgeUsage, ...] = ()

    def __post_init__(self) -> None:
        costs, usages = self._nodes()
        intervals = tuple(self._interval(i, iv) for i, iv in enumerate(self.intervals))
        edges, matrices = self._edges(costs)
        limit = self.usage_limit
        if limit is not None:
            limit = float(limit)
            if math.isnan(limit):
                raise ProblemFormatError("usage_limit is NaN", expected="a number or None",
                                         got="nan", fix="give a number or None")
        ties = self._ties(costs)
        edge_usages = tuple(self._edge_usage(e, usage, costs)
                            for e, usage in enumerate(self.edge_usages))
        e = _first_bad([u.usages for u in edge_usages], lambda v: ~np.isfinite(v))
        if e is not None:
            raise ProblemFormatError(f"usages of edge usage {e} are malformed",
                                     expected="finite numbers", got="NaN or inf",
                                     fix="one finite usage per pair")
        for name, value in (("node_costs", costs), ("node_usages", usages),
                            ("intervals", intervals), ("edges", edges),
                            ("edge_costs", matrices), ("usage_limit", limit), ("ties", ties),
                            ("edge_usages", edge_usages)):
            object.__setattr__(self, name, value)
        for array in (*costs, *usages, *matrices, *(u.usages for u in edge_usages)):
            array.flags.writeable = False

    def _nodes(self) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        """The nodes' cost and usage vectors, checked: numeric, one usage per cost, no NaN,
        no -inf cost, no infinite usage."""
        costs = tuple(_vector(c, f"cost vector of node {i}")
                      for i, c in enumerate(self.node_costs))
        usages = tuple(_vector(u, f"usage vector of node {i}")
                       for i, u in enumerate(self.node_usages))
        for what, vectors in (("cost", costs), ("usage", usages)):
            i = _first_bad(vectors, np.isnan)
            if i is not None:
                raise ProblemFormatError(f"{what} vector of node {i} is not a non-empty list "
                                         "of numbers", expected="a 1-d array without NaN",
                                         got="NaN", fix="give one value per strategy")
        n = len(costs)
        if len(usages) != n or len(self.intervals) != n:
            raise ProblemFormatError("nodes are described inconsistently",
                                     expected=f"{n} usage vectors and {n} intervals",
                                     got=f"{len(usages)} and {len(self.intervals)}",
                                     fix="give costs, usages and an interval for every node")
        for i, (c, u) in enumerate(zip(costs, usages)):
            if c.shape != u.shape:
                raise ProblemFormatError(f"node {i} has {c.size} costs but {u.size} usages",
                                         expected="one usage per strategy", got=f"{u.size}",
                                         fix="make both lists the same length")
        infinite = [i for i in (_first_bad(costs, lambda c: c == -math.inf),
                                _first_bad(usages, np.isinf)) if i is not None]
        if infinite:
            raise ProblemFormatError(f"node {min(infinite)} has an infinite usage or -inf cost",
                                     expected="finite usages, costs > -inf",
                                     got="inf", fix="use inf costs to forbid a strategy")
        return costs, usages

    @staticmethod
    def _interval(i: int, interval: object) -> tuple[int, int]:
        try:
            lo, hi = interval  # type: ignore[misc]
            if int(lo) != lo or int(hi) != hi:
                raise ValueError
            return int(lo), int(hi)
        except (TypeError, ValueError) as exc:
            raise ProblemFormatError(f"interval of node {i} is malformed",
                                     expected="a pair of integers [lo, hi)",
                                     got=repr(interval)[:80], fix="give [lo, hi]") from exc

    def _edges(self, costs: tuple[np.ndarray, ...]) -> tuple[tuple, tuple]:
        if len(self.edges) != len(self.edge_costs):
            raise ProblemFormatError("edges and edge costs differ in number",
                                     expected=f"{len(self.edges)} cost matrices",
                                     got=f"{len(self.edge_costs)}",
                                     fix="give one cost matrix per edge")
        edges, matrices = [], []
        for e, (pair, matrix) in enumerate(zip(self.edges, self.edge_costs)):
            try:
                a, b = (int(x) for x in pair)
            except (TypeError, ValueError) as exc:
                raise ProblemFormatError(f"edge {e} is not a pair of node indices",
                                         expected="(a, b)", got=repr(pair)[:80],
                                         fix="give two node indices") from exc
            if not (0 <= a < len(costs) and 0 <= b < len(costs)) or a == b:
                raise ProblemFormatError(f"edge {e} joins invalid nodes",
                                         expected=f"two distinct nodes in [0, {len(costs)})",
                                         got=f"({a}, {b})", fix="fix the node indices")
            shape = (costs[a].size, costs[b].size)
            try:
                m = np.asarray(matrix, dtype=np.float64).reshape(shape)
            except (TypeError, ValueError) as exc:
                raise ProblemFormatError(f"cost matrix of edge {e} has the wrong size",
                                         expected=f"{shape[0]} x {shape[1]} numbers",
                                         got=f"{np.size(matrix)} values",
                                         fix="one cost per strategy pair, row-major") from exc
            edges.append((a, b))
            matrices.append(m)
        e = _first_bad(matrices, lambda m: np.isnan(m) | (m == -math.inf))
        if e is not None:
            raise ProblemFormatError(f"cost matrix of edge {e} has NaN or -inf",
                                     expected="numbers or inf", got="NaN/-inf",
                                     fix="use inf to forbid a pair")
        return tuple(edges), tuple(matrices)

    def _edge_usage(self, e: int, usage: object, costs: tuple[np.ndarray, ...]) -> EdgeUsage:
        try:
            a, b = (int(x) for x in usage.nodes)  # type: ignore[attr-defined]
            interval = self._interval(e, usage.interval)  # type: ignore[attr-defined]
            values = np.asarray(usage.usages, dtype=np.float64)  # type: ignore[attr-defined]
        except (AttributeError, TypeError, ValueError, ProblemFormatError) as exc:
            raise ProblemFormatError(f"edge usage {e} is malformed",
                                     expected="EdgeUsage((a, b), usages, (lo, hi))",
                                     got=repr(usage)[:80], fix="give an EdgeUsage") from exc
        if not (0 <= a < len(costs) and 0 <= b < len(costs)) or a == b:
            raise ProblemFormatError(f"edge usage {e} joins invalid nodes",
                                     expected=f"two distinct nodes in [0, {len(costs)})",
                                     got=f"({a}, {b})", fix="fix the node indices")
        if values.shape != (costs[a].size, costs[b].size):
            raise ProblemFormatError(f"usages of edge usage {e} are malformed",
                                     expected=f"{costs[a].size} x {costs[b].size} finite numbers",
                                     got=f"shape {values.shape}", fix="one usage per pair")
        return EdgeUsage((a, b), values, interval)

    def _ties(self, costs: tuple[np.ndarray, ...]) -> tuple[tuple[int, ...], ...]:
        ties = []
        for group in self.ties:
            members = tuple(int(i) for i in group)
            if any(not 0 <= i < len(costs) for i in members):
                raise ProblemFormatError("a tie group names an unknown node",
                                         expected=f"node indices in [0, {len(costs)})",
                                         got=repr(members), fix="fix the tie group")
            if len({costs[i].size for i in members}) > 1:
                raise ProblemFormatError("tied nodes have different strategy counts",
                                         expected="equal strategy counts within a group",
                                         got=repr([costs[i].size for i in members]),
                                         fix="tie only identical layers")
            ties.append(members)
        return tuple(ties)

    @property
    def num_nodes(self) -> int:
        """Number of nodes."""
        return len(self.node_costs)

    @property
    def num_edges(self) -> int:
        """Number of edges (parallel edges counted separately)."""
        return len(self.edges)

    def _check(self, choices: Sequence[int]) -> list[int]:
        picked = [int(k) for k in choices]
        if len(picked) != self.num_nodes or any(
                not 0 <= k < c.size for k, c in zip(picked, self.node_costs)):
            raise ProblemFormatError("an assignment does not fit the problem",
                                     expected=f"{self.num_nodes} valid strategy indices",
                                     got=f"{len(picked)} indices",
                                     fix="give one strategy index per node")
        return picked

    def cost(self, choices: Sequence[int]) -> float:
        """Node plus edge cost of a full assignment; `inf` if it uses a forbidden choice."""
        picked = self._check(choices)
        total = math.fsum(float(c[k]) for c, k in zip(self.node_costs, picked))
        total += math.fsum(float(m[picked[a], picked[b]])
                           for (a, b), m in zip(self.edges, self.edge_costs))
        return total

    @property
    def profile_start(self) -> int:
        """The step `usage_profile` starts at: the earliest `lo` of a usage live at any
        step (0 when none is)."""
        return self._live_terms.start

    def usage_profile(self, choices: Sequence[int]) -> np.ndarray:
        """Summed usage (nodes' and edge usages') at every time step from `profile_start`
        to the latest `hi` - 1."""
        picked = np.asarray(self._check(choices), dtype=np.int64)
        terms = self._live_terms
        if terms.lo.size == 0:
            return np.zeros(0)
        usage = terms.node_usage[terms.node_offset + picked[terms.node]]
        if terms.pair_a.size:
            pairs = terms.pair_usage[terms.pair_offset + picked[terms.pair_a] * terms.pair_stride
                                     + picked[terms.pair_b]]
            usage = np.concatenate([usage, pairs])
        # Each term added at its lo and taken back at its hi, term after term, then summed:
        # the same additions in the same order as a loop over the terms.
        steps = np.stack([terms.lo, terms.hi], axis=1).ravel()
        deltas = np.stack([usage, -usage], axis=1).ravel()
        return np.cumsum(np.bincount(steps, weights=deltas))[:-1]  # to the latest hi - 1

    @functools.cached_property
    def _live_terms(self) -> _LiveTerms:
        """The usage terms live at some step, flattened for `usage_profile`."""
        live = [i for i, (lo, hi) in enumerate(self.intervals) if lo < hi]
        pairs = [u for u in self.edge_usages if u.interval[0] < u.interval[1]]
        sizes = [self.node_usages[i].size for i in live]
        pair_sizes = [u.usages.size for u in pairs]
        spans = [self.intervals[i] for i in live] + [u.interval for u in pairs]
        start = min((a for a, _ in spans), default=0)
        lo = np.array([a for a, _ in spans], dtype=np.int64) - start
        hi = np.array([b for _, b in spans], dtype=np.int64) - start

        def flat(arrays: list[np.ndarray]) -> np.ndarray:
            return np.concatenate([a.ravel() for a in arrays]) if arrays else np.zeros(0)

        return _LiveTerms(
            start, lo, hi, np.array(live, dtype=np.int64),
            flat([self.node_usages[i] for i in live]), np.cumsum([0, *sizes[:-1]], dtype=np.int64),
            np.array([u.nodes[0] for u in pairs], dtype=np.int64),
            np.array([u.nodes[1] for u in pairs], dtype=np.int64),
            flat([u.usages for u in pairs]), np.cumsum([0, *pair_sizes[:-1]], dtype=np.int64),
            np.array([u.usages.shape[1] for u in pairs], dtype=np.int64))

    def peak_usage(self, choices: Sequence[int]) -> float:
        """Largest summed usage over all time steps (0 when no node has an interval)."""
        profile = self.usage_profile(choices)
        return float(profile.max()) if profile.size else 0.0

    def is_feasible(self, choices: Sequence[int]) -> bool:
        """Finite cost, peak usage within the limit, and every tie group respected."""
        picked = self._check(choices)
        if any(len({picked[i] for i in group}) > 1 for group in self.ties):
            return False
        if not math.isfinite(self.cost(picked)):
            return False
        return self.usage_limit is None or self.peak_usage(picked) <= self.usage_limit
