"""Generated sharding problems with the statistics of the IOPDDL contest's instances.

`generate` reproduces the structure of the contest's public instances (A, G, M, S: XLA's
auto-sharding on 32 or 64 devices, 816 to 34,932 nodes):

- A node is an op; a strategy lays its output tensor out: per mesh axis, the dim split
  over it or none. A spec is valid when each dim divides by the product of the axes split
  over it: (r+1)^2 for a rank-r tensor of large dims (1, 4, 9, 16, 25: the contest's
  common counts), fewer for small ones; a few ops (`big`) pair each spec with 6 to 36
  operand layouts. Usage = bytes / shards (the product of the split axes' sizes).
- An edge joins an operand to its reader: a follow edge (the reader keeps the operand's
  layout: identity, forbidden elsewhere), a resharding one (`reshard_costs`) or a zero
  one. Node costs are compute costs (`_costs`), zero on the leanest spec.
- The graph (`build_graph`): hubs (parameters, constants; Zipf popularity, so one may feed
  thousands), a chain of trunk nodes with skip connections, leaves; training graphs add a
  backward half reading the forward one (saved activations). Time follows node order.

Measured on the four (G; A, M, S) and on `family(20, 0)`'s instances:

    statistic                      contest G / A, M, S       family(20, 0)
    edges per node                 1.25 / 1.57 1.43 1.36     1.13 to 1.61
    strategies per node: mean      12.3 / 6.1 8.1 8.7        5.2 to 9.3
      largest                      39 / 129 30 872           23 to 759
      share of nodes with one      0.06 / 0.03 0.32 0.03     0.02 to 0.39
      share with at most 4         0.23 / 0.64 0.45 0.51     0.25 to 0.63
    share of edges of span <= 8    0.52 / 0.08 0.25 0.31     0.14 to 0.53
    share of follow edges          0.41 / 0.61 0.36 0.53     0.23 to 0.58
    share of nodes never live      0.19 / 0.14 0.10 0.06     0.06 to 0.18
    least possible peak / limit    0.909 (a lower bound)     0.909 (exact)

The usage limit is `slack` (1.1, the contest's: its limits are 1.1 times the peak of the
per-node least usages) times the least possible peak, known without a solve: the peak of
the per-node least usages bounds every assignment's from below, and the assignment of
each node's leanest spec (`lean_choices`) has a finite cost by construction (follow edges
join equal spec lists, resharding is finite, the leanest spec is never forbidden), so it
reaches it. `solve.min_peak_usage` agrees (tests/tools/test_instances.py).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from autopar.errors import ProblemFormatError
from autopar.solver.problem import ShardingProblem

# The contest's meshes: 2x16 (G, S), 4x8 (A), 8x8 (M); and a smaller one.
MESHES = ((2, 16), (4, 8), (8, 8), (2, 8))
# Resharding cost per byte moved over each mesh axis: the first, between hosts, slower.
AXIS_WEIGHTS = (4.0, 1.0)


@dataclass(frozen=True)
class Traits:
    """The knobs of a generated instance (defaults inside the spans `draw_traits` draws
    from); shares are probabilities per node, edge or strategy, as named."""

    mesh: tuple[int, int] = (2, 16)
    training: bool = True          # a backward half mirroring the forward
    hubs: float = 0.02             # share of nodes that are hubs
    hub_skew: float = 1.0          # Zipf exponent of a hub's popularity
    hub_live: float = 0.5          # share of hubs live until their last reader
    hub_reads: float = 0.5         # share of operands that are hubs
    extra: float = 0.2             # mean operands per node beyond the first
    trunk: float = 0.3             # share of body nodes read by later ones
    skip_span: float = 12.0        # mean distance of a skip connection, in trunk nodes
    saved: float = 0.35            # share of backward nodes reading their forward mirror
    follow: float = 0.75           # share of one-operand nodes that follow it
    multi_follow: float = 0.15     # share of other nodes that follow their first operand
    zero: float = 0.05             # share of other edges costing nothing
    ranks: tuple[float, ...] = (0.04, 0.3, 0.36, 0.2, 0.1)  # tensor rank 0..4
    big: float = 0.001             # share of nodes with spec x layout strategies
    compute: float = 0.15          # share of nodes with compute costs
    compute_scale: float = 0.05    # median compute cost of replicating, per byte
    forbidden: float = 0.03        # share of strategies forbidden (never the leanest)
    empty: float = 0.1             # share of leaves never live
    slack: float = 1.1             # usage limit / least possible peak


@dataclass(frozen=True)
class Graph:
    """Node roles and edges of an instance. Every edge (a, b) has a < b; `follow[b]` is
    the source whose layout node b takes, or -1."""

    hub: np.ndarray
    big: np.ndarray
    edges: tuple[tuple[int, int], ...]
    follow: np.ndarray


@dataclass(frozen=True)
class Tensor:
    """A node's output: its shape and bytes, and per strategy its spec (k x 2: the
    dimension split over each mesh axis, -1 for none), usage and compute cost."""

    shape: tuple[int, ...]
    nbytes: int
    specs: np.ndarray
    usages: np.ndarray
    costs: np.ndarray


@dataclass(frozen=True)
class Instance:
    """One member of a family: `generate(seed, nodes, traits)`, solved within `timeout`."""

    name: str
    seed: int
    nodes: int
    traits: Traits
    timeout: float

    def build(self) -> ShardingProblem:
        """The member's problem (the same on every call)."""
        return generate(self.seed, self.nodes, self.traits, name=self.name)


def valid_specs(shape: tuple[int, ...], mesh: tuple[int, int]) -> np.ndarray:
    """All specs (k x 2) of a tensor of `shape` on `mesh`, the replicated one last: dim d
    may be split over a set of axes when shape[d] divides by the product of their sizes."""
    choices = range(-1, len(shape))
    specs = [spec for spec in itertools.product(choices, choices)
             if all(shape[d] % math.prod(m for s, m in zip(spec, mesh) if s == d) == 0
                    for d in range(len(shape)))]
    specs.sort(key=lambda spec: spec == (-1, -1))
    return np.array(specs, dtype=np.int64).reshape(-1, 2)


def shards(specs: np.ndarray, mesh: tuple[int, int]) -> np.ndarray:
    """Per spec, the number of pieces the tensor is cut into: prod of split axes' sizes."""
    return np.prod(np.where(specs >= 0, np.array(mesh), 1), axis=1)


def reshard_costs(have: np.ndarray, need: np.ndarray, nbytes: int,
                  mesh: tuple[int, int]) -> np.ndarray:
    """Cost (len(have) x len(need)) of turning a tensor of `nbytes` from each spec of
    `have` into each of `need`, summed over mesh axes i of size m_i, weight w_i
    (`AXIS_WEIGHTS`), S the shards of a spec:

        have_i = need_i or have_i = none: 0          (already there, or a local slice)
        need_i = none:   w_i (1 - 1/m_i) B / S_need  (all-gather into the needed pieces)
        otherwise:       w_i (1 - 1/m_i) B / S_have  (all-to-all of the held pieces)

    rounded to integers; zero where the specs match, the replicated row all zero."""
    s_have = shards(have, mesh)[:, None].astype(np.float64)
    s_need = shards(need, mesh)[None, :].astype(np.float64)
    total = np.zeros((len(have), len(need)))
    for i, (m, w) in enumerate(zip(mesh, AXIS_WEIGHTS)):
        h, n = have[:, i][:, None], need[:, i][None, :]
        moves = (h >= 0) & (h != n)
        whole = w * (1 - 1 / m) * nbytes  # the cost of moving the whole tensor
        total += np.where(moves & (n < 0), whole / s_need, 0.0)
        total += np.where(moves & (n >= 0), whole / s_have, 0.0)
    return np.round(total)


def _shape(rng: np.random.Generator, rank: int) -> tuple[int, ...]:
    """A rank-`rank` shape of 2^E elements, E uniform in [2 rank, 8 + 5 rank] (at most
    2^29), split at random over the dims, one dim sometimes times 3."""
    if rank == 0:
        return ()
    exponent = int(rng.integers(2 * rank, min(8 + 5 * rank, 29) + 1))
    dims = 2 ** rng.multinomial(exponent, np.full(rank, 1 / rank))
    if rng.random() < 0.25:
        dims[rng.integers(rank)] *= 3
    return tuple(int(d) for d in dims)


def build_graph(rng: np.random.Generator, nodes: int, traits: Traits) -> Graph:
    """Roles and edges (module docstring): hubs 0 .. h-1, then the body, in training a
    forward half and a backward half; each body node reads `_operands`, and follows its
    first (unless either is big) with probability `follow` when it is the only one (an
    elementwise op keeps its operand's layout), `multi_follow` otherwise."""
    h = min(max(1, round(traits.hubs * nodes)), nodes - 1)
    hub = np.arange(nodes) < h
    trunk = ~hub & (rng.random(nodes) < traits.trunk)
    trunk[h] = True
    big = ~hub & (rng.random(nodes) < traits.big)
    halves = (h, h + (nodes - h) // 2 if traits.training else nodes, nodes)
    zipf = 1.0 / np.arange(1, h + 1) ** traits.hub_skew  # hub popularity, in random order
    popularity = np.cumsum(rng.permutation(zipf)) / zipf.sum()
    follow = np.full(nodes, -1)
    edges: list[tuple[int, int]] = []
    chain: list[int] = []
    for i in range(h, nodes):
        reads = _operands(rng, i, chain, popularity, halves, traits)
        share = traits.follow if len(reads) == 1 else traits.multi_follow
        if not big[reads[0]] and rng.random() < share:
            follow[i] = reads[0]
            big[i] = False
        edges.extend((source, i) for source in reads)
        if trunk[i]:
            chain.append(i)
    return Graph(hub, big, tuple(edges), follow)


def _operands(rng: np.random.Generator, i: int, chain: list[int], popularity: np.ndarray,
              halves: tuple[int, int, int], traits: Traits) -> list[int]:
    """Body node i's distinct operands: 1 + Poisson(extra) of them (before repeats go),
    each a hub with probability `hub_reads` (`popularity`: cumulative Zipf weights) or
    else, the first, the latest trunk node (`chain`; 3 times in 10 one of the few before),
    the others a skip to the trunk node 1 + Geometric(1 / skip_span) back; a node of the
    backward half [back, n) also reads, with probability `saved`, its forward mirror:

        mirror(i) = back - 1 - floor((i - back) (back - h) / (n - back))
    """
    h, back, n = halves
    reads = []
    for k in range(1 + rng.poisson(traits.extra)):
        if not chain or rng.random() < traits.hub_reads:
            reads.append(min(int(np.searchsorted(popularity, rng.random())), h - 1))
        elif k == 0:
            reads.append(chain[-min(int(rng.geometric(0.7)), len(chain))])
        else:
            distance = 1 + int(rng.geometric(1.0 / traits.skip_span))
            reads.append(chain[-min(distance, len(chain))])
    if i >= back > h and rng.random() < traits.saved:
        reads.append(back - 1 - (i - back) * (back - h) // (n - back))
    return list(dict.fromkeys(reads))


def _tensor(rng: np.random.Generator, traits: Traits, big: bool) -> Tensor:
    """A fresh node's tensor: a rank drawn from `ranks`, its valid specs (times 6 to 36
    operand layouts when `big`), and its costs (`_costs`)."""
    shape = _shape(rng, int(rng.choice(len(traits.ranks), p=traits.ranks)))
    layouts = int(rng.integers(6, 37)) if big else 1
    specs = np.repeat(valid_specs(shape, traits.mesh), layouts, axis=0)
    nbytes = 2 * math.prod(shape) if shape else 4
    usages = nbytes / shards(specs, traits.mesh)
    layout = np.arange(len(specs)) % layouts
    costs = _costs(rng, traits, usages, nbytes, layout, traits.forbidden)
    return Tensor(shape, nbytes, specs, usages, costs)


def _costs(rng: np.random.Generator, traits: Traits, usages: np.ndarray, nbytes: int,
           layout: np.ndarray, forbidden: float) -> np.ndarray:
    """Compute costs, for a share `compute` of nodes (and all with operand layouts): with
    F = B x LogNormal(log compute_scale, 2), cost_k = F (u_k - min u) / B, plus F x U(0, 1)
    for a `layout` other than 0; a share `forbidden` of strategies forbidden (inf), never
    the leanest (the first of least usage, of layout 0)."""
    costs = np.zeros(usages.size)
    if layout.any() or rng.random() < traits.compute:
        scale = nbytes * rng.lognormal(math.log(traits.compute_scale), 2.0)
        costs = scale * ((usages - usages.min()) / nbytes
                         + np.where(layout > 0, rng.random(usages.size), 0.0))
    forbid = rng.random(usages.size) < forbidden
    forbid[int(np.argmin(usages))] = False
    return np.where(forbid, math.inf, np.round(costs))


def _follower(rng: np.random.Generator, traits: Traits, parent: Tensor) -> Tensor:
    """A follow node's tensor: its operand's specs and forbidden strategies (the same
    shape), 1, 2 or 4 times its bytes (the same leanest spec), its own compute costs."""
    factor = int(rng.choice((1, 1, 1, 1, 2, 4)))
    usages = parent.usages * factor
    costs = _costs(rng, traits, usages, parent.nbytes * factor, np.zeros(usages.size), 0.0)
    costs[np.isinf(parent.costs)] = math.inf
    return Tensor(parent.shape, parent.nbytes * factor, parent.specs, usages, costs)


def _edge_costs(rng: np.random.Generator, traits: Traits, a: Tensor, b: Tensor,
                follow: bool) -> np.ndarray:
    """The matrix of edge (a, b): identity (forbidden elsewhere) for a follow edge; zero
    for a share `zero` and for scalar ends; else the resharding of a's tensor from each of
    its specs into the one each strategy of b needs: b's split dims mapped one-to-one onto
    a's (the same dims for half of equal-rank pairs, else at random; the dims of b beyond
    a's rank onto none: a dim a lacks is needed whole)."""
    if follow:
        return np.where(np.eye(len(a.specs), dtype=bool), 0.0, math.inf)
    if not a.shape or not b.shape or rng.random() < traits.zero:
        return np.zeros((len(a.specs), len(b.specs)))
    ra, rb = len(a.shape), len(b.shape)
    if ra == rb and rng.random() < 0.5:
        dims = np.arange(rb)
    else:
        dims = rng.permutation(np.r_[rng.permutation(ra), np.full(max(rb - ra, 0), -1)])[:rb]
    need = np.where(b.specs >= 0, dims[np.maximum(b.specs, 0)], -1)
    return reshard_costs(a.specs, need, a.nbytes, traits.mesh)


def _intervals(rng: np.random.Generator, graph: Graph, traits: Traits) -> np.ndarray:
    """[lo, hi) per node (n x 2): steps follow node order, skipping nodes never live (a
    share `empty` of leaves: [0, 0)); hi = max(lo + Geometric(0.6), last reader's lo + 1),
    lo + 2 for hubs not live until their last reader (a share 1 - `hub_live`)."""
    n = len(graph.hub)
    source, reader = np.array(graph.edges, dtype=np.int64).reshape(-1, 2).T
    read = np.bincount(source, minlength=n) > 0
    live = graph.hub | read | (rng.random(n) >= traits.empty)
    lo = np.cumsum(live) - live
    hi = lo + rng.geometric(0.6, n)
    np.maximum.at(hi, source, lo[reader] + 1)
    hi = np.where(graph.hub & (rng.random(n) >= traits.hub_live), lo + 2, hi)
    return np.where(live[:, None], np.stack([lo, hi], axis=1), 0)


def lean_choices(problem: ShardingProblem) -> tuple[int, ...]:
    """Per node, its first strategy of least usage among those of finite cost. Its usage
    profile is, step by step, the least any assignment can have: its peak bounds every
    assignment's from below (and is the least possible peak when its cost is finite)."""
    return _lean(problem.node_costs, problem.node_usages)


def _lean(costs: tuple[np.ndarray, ...], usages: tuple[np.ndarray, ...]) -> tuple[int, ...]:
    return tuple(int(np.argmin(np.where(np.isfinite(c), u, math.inf)))
                 for c, u in zip(costs, usages))


def generate(seed: int, nodes: int, traits: Traits = Traits(), *,
             name: str = "") -> ShardingProblem:
    """An instance of `nodes` nodes like the contest's (module docstring), a pure function
    of its arguments; usage limit = floor(slack x least possible peak)."""
    if not (isinstance(nodes, int) and nodes >= 2):
        raise ProblemFormatError("an instance needs at least 2 nodes", expected="nodes >= 2",
                                 got=repr(nodes), fix="ask for more nodes")
    rng = np.random.default_rng(seed)
    graph = build_graph(rng, nodes, traits)
    tensors: list[Tensor] = []
    for i in range(nodes):
        parent = int(graph.follow[i])
        tensors.append(_follower(rng, traits, tensors[parent]) if parent >= 0
                       else _tensor(rng, traits, bool(graph.big[i])))
    matrices = tuple(_edge_costs(rng, traits, tensors[a], tensors[b], graph.follow[b] == a)
                     for a, b in graph.edges)
    costs, usages = tuple(t.costs for t in tensors), tuple(t.usages for t in tensors)
    intervals = _intervals(rng, graph, traits)
    peak = _peak(intervals, [u[k] for u, k in zip(usages, _lean(costs, usages))])
    return ShardingProblem(costs, usages, tuple(map(tuple, intervals.tolist())), graph.edges,
                           matrices, usage_limit=float(math.floor(traits.slack * peak)),
                           name=name or f"generated-{seed}-{nodes}")


def _peak(intervals: np.ndarray, usages: list[float]) -> float:
    """Peak of the summed usages, usage i counting at the steps [lo_i, hi_i)."""
    change = np.zeros(int(intervals.max()) + 1)
    np.add.at(change, intervals[:, 0], usages)
    np.add.at(change, intervals[:, 1], np.negative(usages))
    return float(np.cumsum(change).max())


# A family's sizes run log-evenly from SMALLEST to LARGEST nodes (the contest's: 816 to
# 34,932).
SMALLEST, LARGEST = 200, 40_000


def timeout_for(nodes: int) -> float:
    """Seconds to solve an instance of `nodes` nodes: 10 + 240 (nodes / 40,000)^0.75, to
    5 s (15 s at 200 nodes, 60 at 5,000, 205 at 30,000, 250 at 40,000: the contest gave
    its instances of about 30,000 nodes 60 to 240 s, and G, of 816, 120 s)."""
    return float(5 * round((10 + 240 * (nodes / LARGEST) ** 0.75) / 5))


def draw_traits(rng: np.random.Generator) -> Traits:
    """Traits of one family member, each drawn over about the span the contest's four
    instances cover (module docstring); 3 in 4 are training graphs, like A, M and S."""
    rank0 = rng.uniform(0.02, 0.25)
    ranks = np.array([0.3, 0.36, 0.2, 0.1]) * rng.uniform(0.6, 1.4, 4)
    return Traits(
        mesh=MESHES[int(rng.integers(len(MESHES)))], training=bool(rng.random() < 0.75),
        hubs=rng.uniform(0.005, 0.03), hub_skew=rng.uniform(0.8, 1.3),
        hub_live=rng.uniform(0.2, 0.9), hub_reads=rng.uniform(0.1, 0.7),
        extra=rng.uniform(0.1, 0.45), trunk=rng.uniform(0.2, 0.4),
        skip_span=rng.uniform(4.0, 30.0), saved=rng.uniform(0.2, 0.5),
        follow=rng.uniform(0.65, 0.95), multi_follow=rng.uniform(0.05, 0.35),
        zero=rng.uniform(0.02, 0.1),
        ranks=tuple(float(r) for r in np.r_[rank0, (1 - rank0) * ranks / ranks.sum()]),
        big=rng.uniform(0.0, 0.004), compute=rng.uniform(0.1, 0.27),
        compute_scale=math.exp(rng.uniform(math.log(0.01), 0.0)),
        forbidden=rng.uniform(0.01, 0.2), empty=rng.uniform(0.08, 0.25))


def family_members(count: int = 20, seed: int = 0, *,
                   scale_timeout: float = 1.0) -> tuple[Instance, ...]:
    """`count` instances of log-evenly spaced sizes from SMALLEST to LARGEST nodes,
    each with its own traits (`draw_traits`) and seed, named "{seed}-{index}-{nodes}",
    with `timeout_for(nodes) x scale_timeout` seconds; built only when asked (`build`)."""
    rng = np.random.default_rng(seed)
    members = []
    for index in range(count):
        nodes = round(SMALLEST * (LARGEST / SMALLEST) ** (index / max(count - 1, 1)))
        traits, member_seed = draw_traits(rng), int(rng.integers(2**31))
        members.append(Instance(f"{seed}-{index:02d}-{nodes}", member_seed, nodes, traits,
                                timeout_for(nodes) * scale_timeout))
    return tuple(members)


def family(count: int = 20, seed: int = 0, *,
           scale_timeout: float = 1.0) -> list[tuple[str, ShardingProblem, float]]:
    """The instances of `family_members`, built: (name, problem, timeout) each."""
    return [(m.name, m.build(), m.timeout)
            for m in family_members(count, seed, scale_timeout=scale_timeout)]
