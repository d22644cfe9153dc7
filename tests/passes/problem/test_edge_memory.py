"""Memory per edge: the copies collectives make that consumers keep, in the problem the
solver bounds and in `predicted_memory`.

- `held_bytes` follows its table (edge_costs' docstring) case by case;
- `EdgeCache.held` equals `held_bytes` pair by pair, as the edge seconds do, and the
  problem's edge usages add up to it;
- an `EdgeUsage` solved as nodes of its own (`autopar.solver.edge_usage`) gives the
  brute-force optimum, with ties, and the expanded problem's profiles are the original's;
- a conversion's staging buffers are charged at its consumer's step;
- a context-parallel attention's ring holds two blocks of keys and values at its step;
- a plan made under a budget that binds charges copies, fits the budget with them, and
  `predicted_memory` splits its end of the forward.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import math

import numpy as np
import pytest
import torch

import autopar
from autopar import Mesh
from autopar.costs import formulas, staging
from autopar.passes.capturing.annotate import annotate, size_hints
from autopar.passes.capturing.capture import capture
from autopar.passes.capturing.find_saved import find_saved
from autopar.passes.problem import build_problem as bp
from autopar.passes.problem import edge_cache, edge_costs, op_costs
from autopar.passes.strategies.find_strategies import Strategy, find_strategies
from autopar.passes.strategies.offer_recompute import offer_recompute
from autopar.solver import EdgeUsage, ShardingProblem, edge_usage, solve
from autopar.solver.edge_usage import binding, with_usage_nodes
from autopar.tools.predicted_memory import graph_of, predicted_memory
from autopar.values.placement import Replicate, Shard
from autopar.values.specs import TensorSpec
from examples import gpt

# The module, which the package's `solve` (the function) hides.
phases = importlib.import_module("autopar.solver.edge_usage_phases")

R, S0 = Replicate(), Shard(0)
MESH = (2, 2)
SPEC = TensorSpec((8, 4), torch.float32)  # 128 bytes


def _ref(**flags) -> edge_costs.EdgeRef:
    fields = dict(requires_grad=True, saved=False, same_block=True, producer_is_parameter=False,
                  consumer_is_view=False, consumer_saves=True, keeps=True, owns=True)
    fields.update(flags)
    return edge_costs.EdgeRef("p", "c", 0, SPEC, **fields)


def _held(ref, output, read, *, recompute=False, producer_recompute=False):
    src = Strategy(inputs=(), output=output, recompute=producer_recompute)
    dst = Strategy(inputs=(read,), output=read, recompute=recompute)
    return edge_costs.held_bytes(ref, src, dst, SPEC.nbytes, MESH)


def test_held_bytes_case_by_case():
    # A conversion hands the consumer a new tensor (an all-gather's output, a slice copied
    # out): its copy is held, the output freed.
    assert _held(_ref(), (S0, R), (R, R)) == (128, 0)
    assert _held(_ref(), (R, S0), (R, R)) == (128, 0)
    assert _held(_ref(), (R, R), (S0, R)) == (64, 0)
    # None: the output is held, charged on the edge that owns it, else on its op.
    assert _held(_ref(), (R, R), (R, R)) == (0, 128)
    assert _held(_ref(owns=False), (R, R), (R, R)) == (0, 0)
    assert _held(_ref(owns=False), (S0, R), (R, R)) == (128, 0)
    # A recomputed consumer saves the copy and its recipe keeps the output.
    assert _held(_ref(), (S0, R), (R, R), recompute=True) == (128, 64)
    # A recomputed producer keeps no output (its backward rebuilds it).
    assert _held(_ref(), (R, R), (R, R), producer_recompute=True) == (0, 0)
    # A consumer that keeps nothing holds nothing.
    assert _held(_ref(keeps=False), (S0, R), (R, R)) == (0, 0)
    # A tensor off the gradient path cut along dim 0 over one axis is handed on as a view
    # (the runtime's input slices): no copy, the output kept through it; a cut along
    # another dim, or over two axes, is copied out.
    off_path = _ref(producer_off_path=True, requires_grad=False)
    assert _held(off_path, (R, R), (S0, R)) == (0, 128)
    assert _held(off_path, (R, R), (Shard(1), R)) == (64, 0)
    assert _held(off_path, (R, R), (S0, S0)) == (32, 0)
    assert _held(_ref(), (R, R), (S0, R)) == (64, 0)
    # An input nothing keeps is held by a recomputed consumer's recipe, before it converts,
    # unless its producer is recomputed too (the recipe keeps a handle).
    recipe = _ref(keeps=False, owns=False, consumer_saves=False, recipe=True)
    assert _held(recipe, (S0, R), (R, R), recompute=True) == (0, 64)
    assert _held(recipe, (R, R), (S0, R), recompute=True) == (0, 128)
    assert _held(recipe, (R, R), (R, R)) == (0, 0)
    assert _held(recipe, (R, R), (R, R), recompute=True, producer_recompute=True) == (0, 0)


@pytest.fixture(scope="module")
def gpt_graph():
    model, inputs = gpt.build(device="meta", layers=2)
    return annotate(capture(model, inputs))


def test_edge_cache_held_equals_held_bytes_pair_by_pair(gpt_graph):
    mesh = Mesh(MESH, ("a", "b"), hardware="h100-sxm")
    table = offer_recompute(gpt_graph, find_strategies(gpt_graph, mesh))
    build = bp.build_problem(gpt_graph, table, mesh, memory_budget=None,
                             hints=size_hints(gpt_graph), saved=find_saved(gpt_graph))
    cache = edge_cache.EdgeCache(mesh)
    kept = [ref for ref in build.edges if ref.keeps or ref.recipe]
    assert any(ref.owns for ref in kept) and any(not ref.owns for ref in kept)
    assert any(ref.recipe for ref in kept)  # a residual add's branch, read by nothing else
    assert any(ref.producer_off_path for ref in kept)  # token indices, masks
    checked = set()
    for ref in kept:
        src, dst = table.strategies[ref.producer], table.strategies[ref.consumer]
        key = (id(src), id(dst), dataclasses.replace(ref, producer="", consumer=""))
        if key in checked:
            continue
        checked.add(key)
        matrix = cache.held(ref, src, dst)
        for k, s in enumerate(src):
            for m, d in enumerate(dst):
                copy, own = edge_costs.held_bytes(ref, s, d, ref.tensor.nbytes, mesh.shape)
                assert matrix[k, m] == copy + own, (ref, s, d)
    # The problem's edge usages (an edge's split into a part of each end and the rest)
    # add up to what the edges hold, on every pair of strategies the edges allow.
    index = {name: i for i, name in enumerate(build.nodes)}
    expected, held, allowed = {}, {}, {}
    for ref, matrix in zip(build.edges, build.problem.edge_costs):
        pair = (index[ref.producer], index[ref.consumer])
        allowed[pair] = allowed.get(pair, True) & np.isfinite(matrix)
        if ref.keeps or ref.recipe:
            values = cache.held(ref, table.strategies[ref.producer],
                                table.strategies[ref.consumer])
            expected[pair] = expected.get(pair, 0) + values
    for usage in build.problem.edge_usages:
        consumer = usage.nodes[1]  # held from the consumer's step to its backward's end
        if usage.interval == (consumer, 2 * len(build.nodes) - consumer):
            held[usage.nodes] = held.get(usage.nodes, 0) + usage.usages
    assert held.keys() <= expected.keys()
    for pair, values in expected.items():
        assert np.array_equal(np.where(allowed[pair], held.get(pair, 0), 0),
                              np.where(allowed[pair], values, 0)), pair


@pytest.mark.parametrize("keeps", [False, True])
def test_a_conversion_stages_its_buffers_at_its_consumer_step(keeps):
    """Forward: a consumer that does not keep what it reads holds it at its step, and
    every conversion its staging buffers (`autopar.costs.staging`) beside it; backward:
    the gradient converted back, with its own."""
    mesh = Mesh(MESH, ("a", "b"), hardware="h100-sxm")
    cache = edge_cache.EdgeCache(mesh)
    ref = _ref(keeps=keeps)
    placements = [(Shard(1), R), (S0, Shard(1)), (R, R), (Shard(1), S0)]
    src = tuple(Strategy(inputs=(), output=p) for p in placements)
    dst = tuple(Strategy(inputs=(p,), output=p) for p in placements)
    forward, backward = cache.transients(ref, src, dst)
    for k, out in enumerate(placements):
        for m, read in enumerate(placements):
            read_bytes = 0 if out == read or keeps else formulas.local_bytes(
                SPEC.nbytes, read, MESH)
            staged = staging.staging_bytes(SPEC.nbytes, out, read, MESH)
            assert forward[k, m] == read_bytes + staged, (out, read)
    assert forward.max() > forward.min()  # some pairs stage more than others
    assert (backward > 0).any()


def test_a_ring_holds_two_blocks_of_keys_and_values_at_its_steps(gpt_graph):
    """Forward: the block in hand and the one arriving; backward: each with its gradients.
    What else the attention's steps hold (its inputs' conversions, the gradients it makes)
    is taken out by the edges' own figures."""
    mesh = Mesh(MESH, ("a", "b"), hardware="h100-sxm")
    table = find_strategies(gpt_graph, mesh)
    build = bp.build_problem(gpt_graph, table, mesh, memory_budget=None,
                             hints=size_hints(gpt_graph), saved=find_saved(gpt_graph))
    cache, steps = edge_cache.EdgeCache(mesh), 2 * len(build.nodes)
    attentions = [i for i, name in enumerate(build.nodes) if "attention" in name]
    assert len(attentions) == 2
    for i in attentions:
        name = build.nodes[i]
        attention = next(n for n in gpt_graph.graph.nodes if n.name == name)
        rings = [op_costs.op_ring(attention, strategy, mesh) for strategy in table.strategies[name]]
        assert any(ring is not None for ring in rings)
        forward = [(ref, cache.transients(ref, table.strategies[ref.producer],
                                          table.strategies[name])[0])
                   for ref in build.edges if ref.consumer == name]
        usages = [u for u in build.problem.edge_usages
                  if u.nodes[1] == i and u.interval == (i, i + 1)]
        for k, ring in enumerate(rings):
            held = sum(u.usages[:, k].min() for u in usages)
            converted = sum(matrix[:, k].min() for _, matrix in forward)
            assert held - converted == (0.0 if ring is None else 2.0 * ring.kv_bytes)
        back = [u for u in build.problem.edge_usages if u.nodes[1] == i
                and u.interval == (steps - 1 - i, steps - i)
                and (u.usages == u.usages[:1]).all()]  # one end: the ring's among them
        for k, ring in enumerate(rings):
            expected = 0.0 if ring is None else 2.0 * (ring.kv_bytes + ring.grad_bytes)
            assert any(u.usages[0, k] == expected for u in back) or expected == 0.0


def _random_problem(rng, limit_fraction: float | None, tied: bool) -> ShardingProblem:
    sizes = [2, 3, 2, 3] if tied else [int(k) for k in rng.integers(1, 4, 4)]
    costs = [rng.uniform(0, 5, k) for k in sizes]
    if tied:  # nodes 0, 1 and 2, 3: two blocks of two, alike
        costs[2], costs[3] = costs[0].copy(), costs[1].copy()
    usages = [rng.integers(0, 5, k).astype(float) for k in sizes]
    edges = [(0, 1), (1, 2), (2, 3), (0, 2)]
    matrices = [np.where(rng.random((sizes[a], sizes[b])) < 0.15, math.inf,
                         rng.uniform(0, 3, (sizes[a], sizes[b]))) for a, b in edges]
    held = rng.integers(0, 4, (sizes[0], sizes[1])).astype(float)
    edge_usages = (EdgeUsage((0, 1), held, (1, 4)),
                   EdgeUsage((2, 3), held if tied else rng.integers(0, 4, (sizes[2], sizes[3]))
                             .astype(float), (3, 4)),
                   EdgeUsage((3, 0), rng.integers(0, 3, (sizes[3], sizes[0])).astype(float),
                             (0, 4)))
    free = ShardingProblem(tuple(costs), tuple(usages), tuple((i, 4) for i in range(4)),
                           tuple(edges), tuple(matrices), None, ((0, 2), (1, 3)) if tied else (),
                           "random", edge_usages)
    if limit_fraction is None:
        return free
    peak = max(free.peak_usage(c) for c in itertools.product(*map(range, sizes)))
    return dataclasses.replace(free, usage_limit=limit_fraction * peak)


@pytest.mark.parametrize("tied", [False, True])
def test_edge_usages_solve_to_the_brute_force_optimum(tied):
    rng = np.random.default_rng(1)
    for _ in range(15):
        for fraction in (None, 0.9, 0.7):
            problem = _random_problem(rng, fraction, tied)
            fits = [c for c in itertools.product(*(range(c.size) for c in problem.node_costs))
                    if problem.is_feasible(c)]
            best = min((problem.cost(c) for c in fits), default=math.inf)
            solution = solve(problem, time_limit=2.0)
            if not fits:
                assert not solution.choices
                continue
            assert problem.is_feasible(solution.choices)
            assert solution.cost == pytest.approx(best, rel=1e-12)


def test_usage_nodes_keep_every_assignment_and_its_profile():
    rng = np.random.default_rng(2)
    problem = _random_problem(rng, 0.5, tied=True)
    expanded = with_usage_nodes(problem)
    assert binding(problem) == problem.edge_usages  # all can overflow: all are nodes
    assert expanded.num_nodes == problem.num_nodes + len(problem.edge_usages)
    assert len(expanded.ties) == len(problem.ties) + 1  # those of the two tied blocks
    n = problem.num_nodes
    for choices in itertools.product(*(range(c.size) for c in problem.node_costs)):
        completions = [extra for extra in itertools.product(
            *(range(c.size) for c in expanded.node_costs[n:]))
            if math.isfinite(expanded.cost(choices + extra))]
        if not math.isfinite(problem.cost(choices)):
            assert not completions
            continue
        assert len(completions) == 1  # the usage nodes follow their ends
        full = choices + completions[0]
        assert expanded.cost(full) == pytest.approx(problem.cost(choices), rel=1e-12)
        assert np.array_equal(expanded.usage_profile(full), problem.usage_profile(choices))


def test_usages_around_an_answer_are_that_answers_own():
    """`edge_usage.around(problem, c)` charges each edge usage as `c` pays it: the same
    profile as the true usages for `c` and for any assignment that moves only the second
    ends, and the relaxation's least nowhere above it where `c` costs finitely."""
    rng = np.random.default_rng(6)
    for _ in range(10):
        problem = _random_problem(rng, None, tied=False)
        relaxed = edge_usage.relaxation(problem)
        everything = list(itertools.product(*(range(c.size) for c in problem.node_costs)))
        first_ends = {u.nodes[0] for u in problem.edge_usages}
        for choices in everything:
            near = edge_usage.around(problem, choices)
            assert np.array_equal(near.usage_profile(choices), problem.usage_profile(choices))
            for other in everything:
                if all(other[a] == choices[a] for a in first_ends):
                    assert np.array_equal(near.usage_profile(other),
                                          problem.usage_profile(other))
            if math.isfinite(problem.cost(choices)):  # the least is over allowed pairs
                assert (relaxed.usage_profile(choices) <= near.usage_profile(choices)).all()


def test_a_binding_budget_charges_copies_and_predicted_memory_splits_the_peak():
    model, inputs = gpt.build()
    mesh = autopar.Mesh(MESH, ("dp", "tp"), hardware="cpu")
    budget = 0.32 * 2181888.0  # test_memory_fidelity's GPT case
    plan = autopar.plan(model, mesh, inputs, memory_budget=budget, time_limit=6.0,
                        microbatches=1)
    assert plan.peak_memory_bytes <= budget
    predicted = predicted_memory(plan, graph_of(model, inputs))
    assert predicted.copies > 0
    # The breakdown splits the end of the forward; the step's peak lies in the backward,
    # above it by the gradients made and held there.
    assert predicted.gradients_later
    assert predicted.total < plan.peak_memory_bytes


def test_usage_matrices_group_as_numpy_unique_groups_them():
    """`_distinct_rows` (rows keyed by their bytes, only the distinct ones sorted) is
    `np.unique(axis=0, return_inverse=True)`, negative zero included."""
    rng = np.random.default_rng(4)
    for _ in range(100):
        matrix = rng.integers(-1, 3, (int(rng.integers(1, 9)), int(rng.integers(1, 6)))) * 1.0
        matrix[0, 0] = -0.0 if rng.random() < 0.3 else matrix[0, 0]
        rows, inverse = np.unique(matrix, axis=0, return_inverse=True)
        got_rows, got_inverse = edge_usage._distinct_rows(matrix)
        assert np.array_equal(got_rows, rows) and np.array_equal(got_inverse, inverse.ravel())


def test_an_expansion_too_large_to_reduce_in_time_is_not_built(monkeypatch):
    """`expansion_cells` bounds what the usage nodes add; past the exact phase's share the
    solve answers from the relaxation alone, and what it answers still fits."""
    rng = np.random.default_rng(5)
    problems = [_random_problem(rng, 0.7, tied=False) for _ in range(12)]
    for problem in problems:
        added = sum(m.size for m in with_usage_nodes(problem).edge_costs) \
            - sum(m.size for m in problem.edge_costs)
        assert 0 < added <= edge_usage.expansion_cells(problem)
    expanded = []
    monkeypatch.setattr(phases, "REDUCE_SECONDS_PER_CELL", math.inf)
    monkeypatch.setattr(phases, "with_usage_nodes",
                        lambda p: expanded.append(p) or with_usage_nodes(p))
    for problem in problems:
        solution = solve(problem, time_limit=1.0)
        assert not solution.choices or problem.is_feasible(solution.choices)
        # Only relaxations were expanded: each usage of one end alone.
        assert all((u.usages == u.usages[:1]).all() or (u.usages == u.usages[:, :1]).all()
                   for p in expanded for u in p.edge_usages)
    assert expanded


def test_a_solve_given_an_answer_that_fits_keeps_it_when_nothing_beats_it(monkeypatch):
    # `solve(initial=...)` of a problem with edge usages: with the phases after the
    # relaxation switched off, only the answer given can make the solve return the optimum
    # where the relaxation's own answer does not fit.
    monkeypatch.setattr(phases, "LINEARIZED", 0)
    monkeypatch.setattr(phases, "LOWER_LIMITS", 0)
    monkeypatch.setattr(phases, "EXPANSION_SHARE", 0.0)
    rng = np.random.default_rng(4)
    started = 0
    for _ in range(40):
        problem = _random_problem(rng, 0.7, tied=False)
        fits = [c for c in itertools.product(*(range(c.size) for c in problem.node_costs))
                if problem.is_feasible(c)]
        if not fits:
            continue
        cheapest = min(fits, key=problem.cost)
        solution = solve(problem, time_limit=1.0, repeatable=True, initial=cheapest)
        assert problem.is_feasible(solution.choices)
        assert solution.cost == pytest.approx(problem.cost(cheapest), rel=1e-12)
        started += 1
    assert started > 5


def test_the_search_for_any_answer_that_fits_prices_the_memory_each_choice_holds():
    # When no answer of the relaxation fits, a solve looks for any that fits on the problem
    # costed by memory held over time: usage times live steps, an edge usage's too, and
    # forbidden choices still forbidden.
    rng = np.random.default_rng(5)
    problem = _random_problem(rng, 0.7, tied=False)
    weighted = phases._memory_weighted(problem)

    def steps(interval):
        return max(interval[1] - interval[0], 0)

    for choices in itertools.product(*(range(c.size) for c in problem.node_costs)):
        if not math.isfinite(problem.cost(choices)):
            assert not math.isfinite(weighted.cost(choices))
            continue
        held = sum(problem.node_usages[i][k] * steps(problem.intervals[i])
                   for i, k in enumerate(choices))
        held += sum(max(u.usages[choices[u.nodes[0]], choices[u.nodes[1]]], 0.0)
                    * steps(u.interval) for u in problem.edge_usages)
        assert weighted.cost(choices) == pytest.approx(held, rel=1e-12)
        assert np.array_equal(weighted.usage_profile(choices), problem.usage_profile(choices))


def _owned_parts_problem(rng) -> ShardingProblem:
    """Three nodes whose edge usages are split as `build_problem` splits an owned output's
    (its consumer's part, its producer's negative part, the rest), 0 on forbidden pairs."""
    sizes = [int(k) for k in rng.integers(2, 4, 3)]
    edges = [(0, 1), (1, 2)]
    matrices = [np.where(rng.random((sizes[a], sizes[b])) < 0.3, math.inf,
                         rng.uniform(0, 3, (sizes[a], sizes[b]))) for a, b in edges]
    usages = []
    for (a, b), cost in zip(edges, matrices):
        reads = rng.integers(0, 6, sizes[b]).astype(float)
        rest = np.where(np.isfinite(cost), rng.integers(0, 4, cost.shape), 0.0)
        least = np.where(np.isfinite(cost), reads[None, :] + rest, math.inf).min(axis=1)
        outputs = -np.floor(rng.random(sizes[a]) * np.where(np.isfinite(least), least, 0.0))
        lo = int(rng.integers(0, 3))
        usages += [EdgeUsage((a, b), np.broadcast_to(reads, cost.shape), (lo, lo + 2)),
                   EdgeUsage((a, b), np.broadcast_to(outputs[:, None], cost.shape), (lo, lo + 2)),
                   EdgeUsage((a, b), rest, (lo, lo + 2))]
    return ShardingProblem(tuple(rng.uniform(0, 5, k) for k in sizes),
                           tuple(rng.integers(0, 5, k).astype(float) for k in sizes),
                           ((0, 3), (1, 4), (2, 5)), tuple(edges), tuple(matrices), None, (),
                           "owned", tuple(usages))


def test_the_usage_floor_bounds_every_peak_and_ends_a_solve_over_it(monkeypatch):
    """`edge_usage.usage_floor` is at most the least peak of any assignment of finite cost,
    although an owned output's part alone is negative, and a solve whose limit is below it
    answers infeasible before any phase runs."""
    rng = np.random.default_rng(11)
    tight = above = 0
    for _ in range(40):
        problem = _owned_parts_problem(rng)
        peaks = [problem.peak_usage(c) for c in itertools.product(
            *(range(c.size) for c in problem.node_costs)) if math.isfinite(problem.cost(c))]
        if not peaks:
            continue
        floor = edge_usage.usage_floor(problem)
        assert floor <= min(peaks) + 1e-9
        tight += floor == min(peaks)
        nodes_alone = dataclasses.replace(problem, edge_usages=())
        assert edge_usage.usage_floor(nodes_alone) <= floor
        above += edge_usage.usage_floor(nodes_alone) < floor
    # Exact where one time step holds every assignment's peak; above what the nodes alone
    # hold where an edge usage's least sum over its parts is positive.
    assert tight and above

    problem = dataclasses.replace(_owned_parts_problem(np.random.default_rng(3)),
                                  usage_limit=0.5)
    assert edge_usage.usage_floor(problem) > 0.5
    monkeypatch.setattr(phases, "memory_free", lambda *a, **k: pytest.fail("a phase ran"))
    solution = solve(problem, time_limit=2.0)
    assert solution.status == "infeasible" and not solution.choices



def test_a_problem_whose_nodes_alone_overflow_is_built_without_its_edges(gpt_graph):
    """`build_problem(unfit_early=True)` under a budget below what the nodes alone hold:
    the nodes' problem, no edges, which the solve proves infeasible; above it, the whole
    problem, the same as without the option."""
    mesh = Mesh(MESH, ("a", "b"), hardware="h100-sxm")
    table = offer_recompute(gpt_graph, find_strategies(gpt_graph, mesh))
    options = dict(hints=size_hints(gpt_graph), saved=find_saved(gpt_graph))
    whole = bp.build_problem(gpt_graph, table, mesh, memory_budget=None, **options)
    alone = dataclasses.replace(whole.problem, edges=(), edge_costs=(), edge_usages=(),
                                ties=())
    floor = edge_usage.usage_floor(alone)
    assert 0 < floor <= edge_usage.usage_floor(whole.problem)
    low = bp.build_problem(gpt_graph, table, mesh, memory_budget=floor / 2,
                           unfit_early=True, **options)
    assert not low.problem.edges and not low.problem.edge_usages and not low.edges
    assert solve(low.problem, time_limit=1.0).status == "infeasible"
    high = bp.build_problem(gpt_graph, table, mesh, memory_budget=2 * floor,
                            unfit_early=True, **options)
    assert len(high.problem.edges) == len(whole.problem.edges)
    assert len(high.problem.edge_usages) == len(whole.problem.edge_usages)
