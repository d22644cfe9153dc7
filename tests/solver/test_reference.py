"""A solve's `reference`: an answer the caller already has, ended on once a bound proves
it within the tolerance (`Best.settle`), and handed from one overlap round to the next."""

from __future__ import annotations

import importlib

import numpy as np
from solver_cases import enumerate_all, random_problem

import autopar
from autopar.solver.flat import Flat
from autopar.solver.lagrange import Best
from autopar.solver.reductions import Infeasible, reduce_problem
from examples import gpt


def test_the_reference_is_taken_only_within_the_tolerance_of_a_bound_and_when_cheaper():
    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(40):
        problem = random_problem(rng)
        try:
            reduced = reduce_problem(problem)
        except Infeasible:
            continue
        flat = Flat.build(reduced)
        table = enumerate_all(problem)
        fitting = [tuple(int(k) for k in c) for c, cost in zip(table.choices, table.costs)
                   if np.isfinite(cost) and problem.is_feasible(tuple(int(k) for k in c))]
        restricted = (reduced.restrict(c) for c in fitting)
        x = next((r for r in restricted if r is not None), None)
        if x is None or not (flat.profile(x) <= flat.limit).all():
            continue
        cost = flat.objective(x)
        far = Best(reference=x)
        assert not far.settle(flat, cost * 0.5 - 1.0, 1e-3) and far.x is None
        near = Best(reference=x)
        assert near.settle(flat, cost - 1e-4 * abs(cost), 1e-3) and near.cost == cost
        cheaper = Best(x=x.copy(), cost=cost - 1.0, reference=x)  # a better one is kept
        assert not cheaper.settle(flat, cost, 1e-3) and cheaper.cost == cost - 1.0
        checked += 1
    assert checked >= 10


def test_each_overlap_round_after_the_first_is_given_the_best_plan_so_far(monkeypatch):
    graph = importlib.import_module("autopar.planning.graph")
    calls = []

    def recording(problem, **options):
        solution = solve(problem, **options)
        calls.append((options.get("reference"), solution.choices))
        return solution

    solve = graph.solve
    monkeypatch.setattr(graph, "solve", recording)
    # Too little compute to hide its parameter gathers, which the first round charges at
    # nothing (`FIRST_CHARGES`): the next round charges what its plan left exposed.
    model, inputs = gpt.build(batch=4, seq=32, hidden=2048, heads=8, layers=2, vocab=2048,
                              device="meta")
    autopar.plan(model, autopar.Mesh((4,), ("dp",), hardware="h100-sxm"), inputs,
                 microbatches=1, time_limit=10)
    assert len(calls) >= 2, "the data-parallel GPT plans a second overlap round"
    assert calls[0][0] is None
    assert all(reference is not None for reference, _ in calls[1:])
    assert calls[1][0] == calls[0][1]
