"""Usage that depends on two nodes' choices, as nodes of their own.

The reductions, the Lagrangian, CP-SAT and the local searches all price memory per node: a
node's usage is a vector over its strategies. An `EdgeUsage` (a, b) with usage U[ka, kb]
becomes a node u of the same problem, exactly:

- one side's strategies are grouped by their column of U (b's, or a's rows when that makes
  fewer): the strategies of a group g see the same usage for every choice of the other side;
- u has one strategy per group g and value v that g's column takes, (g, v), using v over the
  EdgeUsage's interval, at cost 0;
- an edge u - b costs 0 where b's strategy is in group g, else inf (omitted when one group
  covers all of b: U depends on a alone), and an edge a - u costs 0 where U[ka, g] = v,
  else inf (omitted when U depends on b alone).

Each pair (ka, kb) of finite cost then leaves u exactly one strategy, of usage U[ka, kb]:
the expanded problem's assignments are the original's, with the same costs and profiles.
u has as many strategies as the groups' distinct values (about 2 per group for a tensor
that is copied or not). Nodes u with equal usages whose ends are each the same node or
tied together are tied too, so that tied blocks stay one decision.

Edge usages that cannot make any assignment overflow (`binding`) are dropped first.

The nodes u tie the choices of their two ends with infinite costs, which the searches'
moves of one node at a time do not cross: alone, they rarely find an assignment that fits
where memory binds. So `autopar.solver.solve` first solves the problem where each edge
usage that depends on both ends is, per strategy of its second end, its least over the
first end's (`relaxation`: a leaf node u, which the reductions fold into that end as a
usage term of its own): a relaxation, whose optimum is the answer when it fits with the
true usages, and whose bound holds. Otherwise it solves the problem with the usages as
that answer pays them (`around`: exact for every assignment that keeps the first ends
where the answer put them), then, while no answer fits, the relaxation under lower
limits, and then the exact expansion, started from the cheapest answer that fits. Edge
usages of one end alone (which callers emit where they can: `build_problem` splits what an
edge that owns its producer's output holds so) are exact in the relaxation already.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from autopar.solver.problem import EdgeUsage, ShardingProblem


def _grouped(usages: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For U (Ka x Kb) grouped by columns: (each column's group, the group of each node
    strategy (g, v) in order, its value v)."""
    columns, group_of = _distinct_rows(usages.T)
    ordered = np.sort(columns, axis=1)
    # Each row's distinct values in increasing order: where a sorted row changes.
    distinct = np.ones(ordered.shape, dtype=bool)
    distinct[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    groups, _ = np.nonzero(distinct)
    return group_of.ravel(), groups.astype(np.int64), ordered[distinct].astype(float)


def _distinct_rows(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(matrix, axis=0, return_inverse=True)`: the distinct rows in lexicographic
    order and each row's index among them; found by their bytes first, so that only the
    distinct rows are sorted (np.unique sorts every row, as one opaque value each: seconds
    on the thousands of 432 x 432 usages of a 405B model's step)."""
    rows = np.ascontiguousarray(matrix) + 0.0  # -0.0 is 0.0, as np.unique has it
    seen: dict[bytes, int] = {}
    first = np.fromiter((seen.setdefault(row.tobytes(), len(seen)) for row in rows),
                        dtype=np.int64, count=rows.shape[0])
    distinct = rows[np.unique(first, return_index=True)[1]]
    order = np.lexsort(distinct.T[::-1])
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return distinct[order], rank[first]


def _node_of(usages: np.ndarray) -> tuple[tuple[tuple[int, int, np.ndarray], ...], np.ndarray]:
    """The node an edge usage of matrix `usages` becomes: its edges (which end of the edge
    usage it joins, 0 or 1; which end of the edge is first: 0 that end, 1 the node; the
    cost matrix, 0 where consistent, inf elsewhere) and its usage per strategy (see the
    module docstring)."""
    by_columns, by_rows = _grouped(usages), _grouped(usages.T)
    if by_rows[1].size < by_columns[1].size:  # group a's strategies instead
        (group_of, groups, values), (grouped, other) = by_rows, (0, 1)
        matrix = usages
    else:
        (group_of, groups, values), (grouped, other) = by_columns, (1, 0)
        matrix = usages.T
    # matrix[k_grouped, k_other]: the usage of each grouped strategy against the other side.
    first = np.unique(group_of, return_index=True)[1]  # a strategy of each group
    consistent = matrix[first[groups]].T == values[None, :]  # [k_other, node strategy]
    # An edge of zeros only says nothing (U depends on the grouped side alone): left out.
    edges = [] if consistent.all() else [(other, 0, np.where(consistent, 0.0, math.inf))]
    if groups.max() > 0:
        same = group_of[None, :] == groups[:, None]  # [node strategy, k_grouped]
        edges.append((grouped, 1, np.where(same, 0.0, math.inf)))
    return tuple(edges), values


def binding(problem: ShardingProblem) -> tuple[EdgeUsage, ...]:
    """The edge usages that can matter: those live at some time step where the most any
    assignment could use (every node's and edge usage's largest value) exceeds the limit.
    Dropping the others changes no assignment's feasibility: at their steps, every
    assignment fits."""
    if problem.usage_limit is None or not problem.edge_usages:
        return ()
    terms = [(lo, hi, float(u.max())) for (lo, hi), u in
             zip(problem.intervals, problem.node_usages) if lo < hi]
    terms += [(u.interval[0], u.interval[1], float(u.usages.max()))
              for u in problem.edge_usages if u.interval[0] < u.interval[1]]
    cuts, most = _profile(terms)
    over = most > problem.usage_limit  # on segment [cuts[s], cuts[s + 1])
    tight = np.concatenate([[0], np.cumsum(over)])
    return tuple(u for u in problem.edge_usages if u.interval[0] < u.interval[1]
                 and tight[np.searchsorted(cuts, u.interval[1])]
                 > tight[np.searchsorted(cuts, u.interval[0])])


def _profile(terms: list[tuple[int, int, float]]) -> tuple[np.ndarray, np.ndarray]:
    """The sum of `terms` (lo, hi, value: value over the steps lo <= t < hi) per segment:
    the steps where a term starts or ends, and the sum over [cuts[s], cuts[s + 1])."""
    cuts = np.unique([t for lo, hi, _ in terms for t in (lo, hi)])
    diff = np.zeros(cuts.size)
    for lo, hi, value in terms:
        diff[np.searchsorted(cuts, lo)] += value
        diff[np.searchsorted(cuts, hi)] -= value
    return cuts, np.cumsum(diff)


def with_usage_nodes(problem: ShardingProblem) -> ShardingProblem:
    """`problem` with each of its edge usages that can matter (`binding`) as a node of its
    own (module docstring), appended after its nodes, in order; without the others."""
    problem = dataclasses.replace(problem, edge_usages=binding(problem))
    if not problem.edge_usages:
        return problem
    n = problem.num_nodes
    costs, usages, intervals = list(problem.node_costs), list(problem.node_usages), \
        list(problem.intervals)
    edges, matrices = list(problem.edges), list(problem.edge_costs)
    nodes: dict[tuple, tuple] = {}  # by `_matrix_key`
    for u in problem.edge_usages:
        key = _matrix_key(u)
        if key not in nodes:
            nodes[key] = _node_of(u.usages)
        node_edges, values = nodes[key]
        index = len(costs)
        costs.append(np.zeros(values.size))
        usages.append(values)
        intervals.append(u.interval)
        for end, order, matrix in node_edges:
            other = u.nodes[end]
            edges.append((other, index) if order == 0 else (index, other))
            matrices.append(matrix)
    ties = problem.ties + _usage_ties(problem, n)
    return ShardingProblem(tuple(costs), tuple(usages), tuple(intervals), tuple(edges),
                           tuple(matrices), problem.usage_limit, ties, problem.name)


def _matrix_key(usage: EdgeUsage) -> tuple:
    """What identifies an edge usage's matrix: blocks repeat theirs, each grouped once."""
    return usage.usages.shape, usage.usages.tobytes()


def expansion_cells(problem: ShardingProblem) -> int:
    """At most the cells of the cost matrices `with_usage_nodes(problem)` adds: a node of
    V strategies per binding edge usage of ends with Ka and Kb strategies, V (Ka + Kb)
    (without building them: a 405B model's step expands to hundreds of millions)."""
    sizes: dict[tuple, int] = {}
    cells = 0
    for u in binding(problem):
        key = _matrix_key(u)
        if key not in sizes:
            sizes[key] = min(_grouped(u.usages)[1].size, _grouped(u.usages.T)[1].size)
        cells += sizes[key] * sum(u.usages.shape)
    return cells


def _usage_ties(problem: ShardingProblem, first: int) -> tuple[tuple[int, ...], ...]:
    """Tie groups of the usage nodes (numbered from `first` in edge-usage order): those of
    equal usages whose first ends pick alike (the same node, or tied) and so do their
    second ends, so that they pick alike too."""
    group_of: dict[int, int] = {}
    for g, group in enumerate(problem.ties):
        group_of.update(dict.fromkeys(group, g))

    def side(node: int) -> tuple[str, int]:
        return ("tied", group_of[node]) if node in group_of else ("node", node)

    alike: dict[tuple, list[int]] = {}
    for e, u in enumerate(problem.edge_usages):
        key = (side(u.nodes[0]), side(u.nodes[1]), u.usages.shape, u.usages.tobytes())
        alike.setdefault(key, []).append(first + e)
    return tuple(tuple(nodes) for nodes in alike.values() if len(nodes) > 1)



def _one_end(usage: EdgeUsage) -> bool:
    """Whether `usage` depends on one of its ends alone (its rows, or its columns, equal)."""
    u = usage.usages
    return bool((u == u[:1]).all() or (u == u[:, :1]).all())


def relaxation(problem: ShardingProblem) -> ShardingProblem:
    """`problem` with each edge usage (a, b) that depends on both ends replaced by one of
    b alone: per strategy of b, the least usage over the strategies of a it may be paired
    with (a finite cost on every edge joining them; all when none does). No assignment uses
    more than its true usage there: a relaxation. `with_usage_nodes` turns each edge usage
    into a leaf node that the reductions fold into its end."""
    allowed = _allowed_pairs(problem)

    def least(u: EdgeUsage) -> np.ndarray:
        paired = np.where(allowed(u), u.usages, math.inf).min(axis=0)
        return np.where(np.isfinite(paired), paired, 0.0)  # b strategies no a strategy allows

    return _of_second_end(problem, least)


def usage_floor(problem: ShardingProblem) -> float:
    """A lower bound of every assignment's peak usage (0 with no usage): the most, over the
    time steps, of each live node's least usage over its strategies of finite cost plus,
    per group of edge usages of the same two ends and interval, the least of their sum over
    the pairs the ends may take (`relaxation`'s). A group's sum is at least 0 there
    (`EdgeUsage`), one of its parts alone may not be: an owned output's negative part takes
    back what its consumer's part counts. O(edge usages' cells): a solve can skip a problem
    no assignment fits, which its relaxation, pricing each part alone, can't prove."""
    allowed = _allowed_pairs(problem)
    groups: dict[tuple, np.ndarray] = {}
    for u in problem.edge_usages:
        if u.interval[0] < u.interval[1]:
            paired = np.where(allowed(u), u.usages, math.inf)
            ends = u.nodes if u.nodes[0] < u.nodes[1] else u.nodes[::-1]
            key = (ends, u.interval)
            paired = paired if ends == u.nodes else paired.T
            groups[key] = paired + groups[key] if key in groups else paired
    terms = _node_terms(problem.node_costs, problem.node_usages, problem.intervals)
    return _most(terms + [(lo, hi, float(total.min()))
                          for (_, (lo, hi)), total in groups.items()])


def nodes_floor(costs: Sequence[np.ndarray], usages: Sequence[np.ndarray],
                intervals: Sequence[tuple[int, int]]) -> float:
    """`usage_floor` of nodes alone, from their cost and usage vectors and intervals (as
    `ShardingProblem` takes them): for a caller deciding whether to build the rest."""
    return _most(_node_terms(costs, usages, intervals))


def _node_terms(costs: Sequence[np.ndarray], usages: Sequence[np.ndarray],
                intervals: Sequence[tuple[int, int]]) -> list[tuple[int, int, float]]:
    """Each live node's (lo, hi, least usage over its strategies of finite cost)."""
    return [(lo, hi, float(u[np.isfinite(c)].min(initial=math.inf)))
            for (lo, hi), u, c in zip(intervals, usages, costs) if lo < hi]


def _most(terms: list[tuple[int, int, float]]) -> float:
    """The most `terms` sum to at a time step (`_profile`; 0 with none, inf where one
    term is: a node or a pair of ends with no strategy allowed)."""
    if any(value == math.inf for _, _, value in terms):
        return math.inf
    _, profile = _profile(terms)
    return float(profile.max(initial=0.0))


def _allowed_pairs(problem: ShardingProblem) -> Callable[[EdgeUsage], np.ndarray | bool]:
    """Per edge usage (a, b), the mask of its pairs (ka, kb) that every edge joining a and
    b gives a finite cost (True when no edge joins them)."""
    allowed: dict[tuple[int, int], np.ndarray] = {}
    for (a, b), matrix in zip(problem.edges, problem.edge_costs):
        pair = (a, b) if (a, b) in allowed or (b, a) not in allowed else (b, a)
        finite = np.isfinite(matrix) if pair == (a, b) else np.isfinite(matrix).T
        allowed[pair] = allowed.get(pair, True) & finite

    def mask(u: EdgeUsage) -> np.ndarray | bool:
        a, b = u.nodes
        found = allowed.get((a, b), allowed[(b, a)].T if (b, a) in allowed else True)
        return np.broadcast_to(found, u.usages.shape)

    return mask


def around(problem: ShardingProblem, choices: tuple[int, ...]) -> ShardingProblem:
    """`problem` with each edge usage (a, b) that depends on both ends replaced by one of
    b alone, a held at its strategy in `choices`: U[choices[a], kb] per strategy kb of b.
    Exact for the assignments that keep a's choice, not a relaxation: where the
    relaxation's answer overflows its true usages, the edge usages as that answer pays
    them (the next answer moves b with a where it was)."""
    return _of_second_end(problem, lambda u: u.usages[choices[u.nodes[0]]])


def _of_second_end(problem: ShardingProblem,
                   row: Callable[[EdgeUsage], np.ndarray]) -> ShardingProblem:
    """`problem` with each edge usage (a, b) that depends on both ends replaced by one of
    b alone, `row(usage)` per strategy of b; those of one end alone are kept (exact)."""
    usages = tuple(u if _one_end(u) else
                   EdgeUsage(u.nodes, np.broadcast_to(row(u), u.usages.shape), u.interval)
                   for u in problem.edge_usages)
    return dataclasses.replace(problem, edge_usages=usages)
