"""`memory_prices`: a problem's usage limit priced instead of imposed, and the answers a
search over one price finds; the memory-free answer `solve` reports beside its own."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from solver_cases import halfway_limited

from autopar.solver.memory_prices import PRICED_SOLVES, memory_free, priced, priced_answers
from autopar.solver.problem import ShardingProblem
from autopar.solver.solve import solve


def test_a_priced_problem_charges_every_assignment_its_usage_at_the_prices():
    # cost' (x) = cost(x) + sum_t price_t usage_t(x), whatever the assignment: the priced
    # problem is the Lagrangian relaxation of the limit, exactly, with an edge per pair of
    # ends that edge usages join.
    rng = np.random.default_rng(3)
    checked = 0
    for problem, table, _ in halfway_limited(np.random.default_rng(5), 60):
        start = problem.profile_start
        for choices in table.choices[:: max(1, len(table.choices) // 7)]:
            x = tuple(int(k) for k in choices)
            if not math.isfinite(problem.cost(x)):
                continue
            profile = problem.usage_profile(x)
            prices = rng.uniform(0.0, 2.0, size=profile.size + 2)
            charged = priced(problem, prices, start)
            assert charged.usage_limit is None and not charged.edge_usages
            # The edge usages of one pair of ends are paid on one edge.
            assert len(charged.edges) <= len(problem.edges) + len(
                {u.nodes for u in problem.edge_usages})
            expected = problem.cost(x) + float(prices[:profile.size] @ profile)
            assert math.isclose(charged.cost(x), expected, rel_tol=1e-9, abs_tol=1e-9)
            checked += 1
    assert checked >= 50


def test_the_memory_free_answer_is_the_optimum_without_the_limit_and_bounds_the_solve():
    run = functools.partial(solve, repeatable=True)
    for problem, table, _ in halfway_limited(np.random.default_rng(7), 40):
        free = memory_free(problem, 5.0, run)
        finite = np.isfinite(table.costs)
        assert math.isclose(free.cost, table.costs[finite].min(), rel_tol=1e-9)
        solved = solve(problem, time_limit=5.0)
        if solved.choices:
            assert solved.memory_free is not None
            assert solved.memory_free <= solved.cost + 1e-9
            assert solved.bound <= solved.cost + 1e-9


def test_a_memory_free_optimum_that_fits_ends_the_solve(monkeypatch):
    # Proven optimal without the limit and within it: optimal with it, whatever the phases
    # after it would find, so none of them runs.
    import autopar.solver.edge_usage_phases as phases

    def relaxed(problem):
        raise AssertionError("the relaxation ran after a fitting memory-free optimum")

    monkeypatch.setattr(phases, "relaxation", relaxed)
    checked = 0
    for problem, table, _ in halfway_limited(np.random.default_rng(13), 40):
        finite = np.isfinite(table.costs)
        least = table.costs[finite].min()
        optimal = finite & np.isclose(table.costs, least, rtol=1e-12, atol=0.0)
        peak = max(problem.peak_usage(tuple(int(k) for k in choices))
                   for choices in table.choices[optimal])
        roomy = dataclasses.replace(problem, usage_limit=float(peak))
        for screening in (False, True):
            solved = solve(roomy, time_limit=5.0, repeatable=True, screening=screening)
            assert solved.status == "optimal" and roomy.is_feasible(solved.choices)
            assert math.isclose(solved.cost, least, rel_tol=1e-9)
            assert solved.memory_free == solved.cost
        checked += 1
    assert checked >= 10


def test_priced_answers_respect_ties_and_find_answers_that_fit():
    run = functools.partial(solve, repeatable=True)
    fitted = tried = 0
    for problem, table, _ in halfway_limited(np.random.default_rng(11), 150):
        start = solve(dataclasses.replace(problem, usage_limit=None), time_limit=5.0)
        answers = priced_answers(problem, start, 5.0, run)
        tried += 1
        for answer in answers:
            assert math.isfinite(answer.cost)
            assert all(len({answer.choices[i] for i in group}) == 1 for group in problem.ties)
            assert math.isclose(answer.cost, problem.cost(answer.choices))
        fits = [a.cost for a in answers if problem.is_feasible(a.choices)]
        if fits:
            fitted += 1
            optimum = min(cost for choices, cost in zip(table.choices, table.costs)
                          if math.isfinite(cost) and problem.is_feasible(tuple(choices)))
            assert min(fits) >= optimum - 1e-9  # no answer beats the true optimum
    assert tried >= 30 and fitted >= tried // 2


def test_a_screening_solve_fits_wherever_the_full_solve_does_and_never_beats_the_optimum():
    # Its quick phases (the memory priced, then repaired) answer when one of theirs fits;
    # otherwise the other phases run, so that screening never loses a fit.
    answered = 0
    for problem, table, _ in halfway_limited(np.random.default_rng(13), 80):
        full = solve(problem, time_limit=5.0, repeatable=True)
        quick = solve(problem, time_limit=5.0, repeatable=True, screening=True)
        assert bool(quick.choices) == bool(full.choices)
        if not quick.choices:
            continue
        answered += 1
        optimum = min(cost for choices, cost in zip(table.choices, table.costs)
                      if math.isfinite(cost) and problem.is_feasible(tuple(choices)))
        assert problem.is_feasible(quick.choices)
        assert quick.cost >= optimum - 1e-9 and quick.bound <= optimum + 1e-9
        assert quick.memory_free is not None and quick.memory_free <= quick.cost + 1e-9
    assert answered >= 20


def test_raising_the_price_stops_once_it_lowers_no_answer_s_peak():
    # No assignment fits (the least usage is 5 over a limit of 3): once the answers hold
    # the least, raising the price further buys nothing, and the search ends there.
    problem = ShardingProblem(node_costs=([1.0, 2.0, 4.0], [1.0, 2.0]),
                              node_usages=([10.0, 5.0, 5.0], [0.0, 0.0]),
                              intervals=((0, 2), (0, 2)), edges=((0, 1),),
                              edge_costs=(np.zeros((3, 2)),), usage_limit=3.0)
    calls = []

    def run(priced_problem, **options):
        calls.append(priced_problem)
        return solve(priced_problem, repeatable=True, **options)

    start = solve(dataclasses.replace(problem, usage_limit=None), time_limit=5.0)
    answers = priced_answers(problem, start, 5.0, run)
    assert answers and problem.peak_usage(answers[-1].choices) == 5.0
    assert not any(problem.is_feasible(a.choices) for a in answers)
    assert len(calls) < PRICED_SOLVES
