"""Planning one captured graph: `strategy_tables` (fold, find, offer, constrain),
`plan_graph` (those, then `plan_table`) and `plan_table` (the problem, the solve and the
plan, estimating the overlap round by round); `screened` options for comparing many
candidates quickly. The hand strategies planned beside a graph's plan are
`autopar.planning.hand_strategies.plan_compared`'s.

**The overlap rounds.** Gradient reductions the runtime overlaps with the backward cost
only what the backward's compute does not hide, max(0, G - B), and parameter gathers it
starts ahead only what the forward's does not, max(0, G' - F): functions of the whole plan
that a sum of per-op costs can't express. The first solve charges them at `plan_table`'s
`charges` (by default `FIRST_CHARGES`, or in full for a single round; a refinement starts
from the fractions its screening plan left exposed), each next one at the fractions the
previous plan left exposed (`Background`; at most `overlap_rounds` solves, the later ones
with half the time limit). The rounds before the last only estimate those fractions: they
are screening solves, and the last, by count, once a plan leaves exposed what it was
charged (`_settled`), or once the call's deadline has passed, is solved in full (so is a
round whose screening found no plan, unless it proved none fits), except where the
settled screening's plan is within `SCREENED_GAP` of its bound: it is the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.fx as fx

from autopar.costs.optimizer_state import ADAMW, OptimizerState, optimizer_state
from autopar.errors import InfeasiblePlanError, PlanningError
from autopar.passes.capturing.annotate import DATA_MOVEMENT, FORMULA, flop_source, size_hints
from autopar.passes.capturing.find_saved import Saved, find_saved
from autopar.passes.capturing.trace_kernels import ensure_traced
from autopar.passes.capturing.write_back import written_buffers
from autopar.passes.problem.build_problem import ProblemBuild, build_problem
from autopar.passes.problem.edge_cache import EdgeCache, EdgeCaches
from autopar.passes.problem.edge_costs import Background
from autopar.passes.problem.extract_plan import extract_plan
from autopar.passes.problem.fold_depth import fold_depth
from autopar.passes.strategies.constrain import constrain
from autopar.passes.strategies.find_strategies import StrategyTable, find_strategies
from autopar.passes.strategies.offer_compression import offer_compression
from autopar.passes.strategies.offer_recompute import offer_recompute, searched
from autopar.passes.strategies.offer_whole_gradient import offer_whole_gradient
from autopar.planning.deadline import Deadline, expired
from autopar.solver import Solution, min_peak_usage, solve
from autopar.values.compression import Compression
from autopar.values.mesh import Mesh
from autopar.values.plan import Plan
from autopar.values.specs import FOLD, TENSOR

# Solves at most, re-estimating how much of the background collectives stays exposed.
OVERLAP_ROUNDS = 3
# The fraction of the time limit a candidate's screening solve has (`screened`).
SCREENING_TIME = 0.25
# What the first of several rounds charges the background collectives (`plan_table`):
# nothing, as if compute hid them all, which the runtime overlaps them for; the next round
# charges what the plan left exposed. Where compute hides them (the Llama shapes on 8x8:
# the 8B's, the 70B's at 64 x 4096) the first round's fractions are already the plan's,
# and a round is saved against charging them in full first, which left the first plan
# avoiding them and the next moving to them. A single round charges them in full: with no
# round after it to correct them, its objective is then the plan's step or more.
FIRST_CHARGES = Background(0.0, 0.0)
# A screened round's plan within this of its proven bound, charged as it leaves exposed,
# is the answer: the full solve of the same problem could gain no more than that (on the
# 8B shape on 8x8, a second of solving to gain nothing over the screening's 0.5%).
SCREENED_GAP = 0.01


# Prefix of the progress messages that start a pass (benchmarks time the passes by them);
# the hand strategies' solves are announced the same way.
STAGE = "[stage]"


def _gib(nbytes: float) -> str:
    """Bytes in GiB, or in bytes where two decimals of a GiB would read 0.00."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 / 100 else f"{nbytes:,.0f} B"


NO_RULE = "no sharding rule for "


def _unruled_warnings(gm: fx.GraphModule, table: StrategyTable) -> tuple[str, ...]:
    """One warning per op the strategy pass replicated for want of a rule, with how its
    FLOPs were counted when no formula knows it (`annotate.flop_source`)."""
    sources = {str(node.target): flop_source(node) for node in gm.graph.nodes
               if node.op == "call_function"}
    warned = []
    for op in table.unsupported:
        source = sources.get(op, FORMULA)
        guess = "" if source in (FORMULA, DATA_MOVEMENT) else (
            f"; no FLOP formula either ({source} of its largest tensor)")
        warned.append(f"{NO_RULE}{op}: kept replicated{guess}")
    return tuple(warned)


def screened(options: dict) -> dict:
    """`plan_graph`'s `options` for screening one of many candidates (micro-batch counts,
    pipeline cuts and schedules): one solve with `SCREENING_TIME` of the time limit, no
    hand strategies, no least-memory search, the solver's quicker phases (`screening`);
    the chosen candidate is then planned with `refined`'s options."""
    return {**options, "time_limit": options.get("time_limit", 30.0) * SCREENING_TIME,
            "overlap_rounds": 1, "hand_strategies": False, "least_memory": False,
            "screening": True}


def refined(options: dict, screening: Plan) -> dict:
    """`plan_graph`'s `options` for planning in full the candidate whose screening solve
    (`screened`) gave `screening`: the overlap rounds after the first, whose solve the
    screening was, charged at the fractions it left exposed; no least-memory search (the
    candidate fits)."""
    report = screening.solver
    return {**options, "least_memory": False,
            "charges": Background(report.exposed_reductions, report.exposed_gathers),
            "overlap_rounds": max(1, options.get("overlap_rounds", OVERLAP_ROUNDS) - 1)}


@dataclass(frozen=True)
class Tables:
    """A graph ready to solve: `gm` (folded by depth when asked), `found` its strategies with
    the recompute and whole-gradient choices offered (what hand strategies restrict), `table`
    those the solver searches (`offer_recompute.searched`) under the constraints, `saved`
    what its ops save (`find_saved`)."""

    gm: fx.GraphModule
    found: StrategyTable
    table: StrategyTable
    saved: dict[str, Saved]  # `find_saved(gm)`


def strategy_tables(gm: fx.GraphModule, mesh: Mesh, *, fold_layers: bool = True,
                    constraints: Mapping[str, str] | None = None, recompute: bool = True,
                    microbatches: int = 1, compression: tuple[Compression, ...] = (),
                    progress: Callable[[str], None] | None = None) -> Tables:
    """The strategy passes of `plan_graph`: fold, find, offer, constrain."""
    say = progress or (lambda message: None)
    if mesh.hardware.device == "cpu":  # before folding: the traces read the whole graph
        ensure_traced(gm)
    if fold_layers:  # tied blocks: plan one of them for all (its plan is the whole graph's)
        say(f"{STAGE} fold_depth")
        gm = fold_depth(gm, keep=frozenset(constraints or ()))
    say(f"{STAGE} find_strategies")
    found, saved = find_strategies(gm, mesh), find_saved(gm)
    if recompute:
        found = offer_recompute(gm, found, saved)
    if microbatches > 1:
        found = offer_whole_gradient(found)
    if compression and mesh.size > 1:
        found = offer_compression(gm, found, compression, mesh.shape, mesh.shares)
    table = searched(found)
    table = constrain(gm, table, mesh, constraints) if constraints else table
    return Tables(gm, found, table, saved)


def plan_graph(gm: fx.GraphModule, mesh: Mesh, *, model_name: str,
               memory_budget: float | None = None, time_limit: float = 30.0,
               constraints: Mapping[str, str] | None = None, fold_layers: bool = True,
               seed: int = 0, optimizer: object = None,
               master_weights: torch.dtype | None = None, recompute: bool = True,
               microbatches: int = 1, in_flight: int = 1, least_memory: bool = True,
               overlap_rounds: int = OVERLAP_ROUNDS, charges: Background | None = None,
               edge_caches: EdgeCaches | None = None,
               progress: Callable[[str], None] | None = None,
               tables: Tables | None = None, deadline: Deadline | None = None,
               screening: bool = False, compression: tuple[Compression, ...] = ()) -> Plan:
    """`plan` from the strategy pass on, for a graph already captured and annotated (with
    `microbatches` > 1, one micro-batch's graph, run that many times a step, holding
    `in_flight` micro-batches' activations at once: see `build_problem`; `least_memory`,
    `overlap_rounds`, `charges`: see `plan_table`; `edge_caches`: the planning call's, to
    share edge costs with its other problems; `tables`: `strategy_tables` of the same
    arguments when the caller has made them; `deadline`: the planning call's;
    `screening`: see `plan_table`; `compression`: those the solver may choose)."""
    if tables is None:
        tables = strategy_tables(gm, mesh, fold_layers=fold_layers, constraints=constraints,
                                 recompute=recompute, microbatches=microbatches,
                                 compression=compression, progress=progress)
    return plan_table(tables.gm, tables.table, mesh, model_name=model_name,
                      memory_budget=default_budget(mesh, memory_budget),
                      time_limit=time_limit, fold_layers=fold_layers, seed=seed,
                      optimizer=optimizer_state(optimizer, master_weights=master_weights),
                      microbatches=microbatches, in_flight=in_flight,
                      least_memory=least_memory, overlap_rounds=overlap_rounds,
                      charges=charges,
                      edge_cache=edge_caches.of(mesh) if edge_caches else None,
                      progress=progress, deadline=deadline, screening=screening,
                      saved=tables.saved)


def device_budget(memory_budget: object, mesh: Mesh) -> float | None:
    """The budget a plan holds every device to: `memory_budget` itself (None: the
    default), or of a list of one budget per device (row-major) the least, since an even
    split puts as much on every device; `PlanningError` for a list of another length or
    a budget that is not a positive number."""
    if not isinstance(memory_budget, (list, tuple)):
        return memory_budget
    if len(memory_budget) != mesh.size or not all(
            isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0
            for b in memory_budget):
        raise PlanningError("a list of memory budgets gives one per device",
                            expected=f"{mesh.size} positive byte counts (mesh "
                                     f"{mesh.describe()})",
                            got=f"{len(memory_budget)} values: {list(memory_budget)[:8]}",
                            fix="one budget per device in row-major order, or one number")
    return float(min(memory_budget))


def default_budget(mesh: Mesh, memory_budget: float | None) -> float:
    """The memory budget per device: `memory_budget`, or the hardware's memory less its
    reserve (`HardwareProfile.reserve_bytes`: context, communicators, fragmentation)."""
    if memory_budget is not None:
        return float(memory_budget)
    hardware = mesh.hardware
    return float(hardware.memory_bytes - hardware.reserve_bytes)


def plan_table(gm: fx.GraphModule, table: StrategyTable, mesh: Mesh, *, model_name: str,
               memory_budget: float | None, time_limit: float, fold_layers: bool, seed: int,
               optimizer: OptimizerState = ADAMW, microbatches: int = 1, in_flight: int = 1,
               least_memory: bool = True, overlap_rounds: int = OVERLAP_ROUNDS,
               charges: Background | None = None, edge_cache: EdgeCache | None = None,
               progress: Callable[[str], None] | None = None, screening: bool = False,
               deadline: Deadline | None = None, fallback: bool | None = None,
               saved: dict[str, Saved] | None = None) -> Plan:
    """The cheapest plan choosing among `table`'s strategies (the problem, solve and
    extract passes), within `memory_budget` bytes per device (None: no limit), for a step
    of `microbatches` runs of `gm`, `in_flight` of them holding activations at once. Raises
    `InfeasiblePlanError` when none fits, with the least memory any plan of the table needs
    when `least_memory` (a search of its own, which a caller trying many candidates skips).
    `fallback`, `screening`: its solves' (`solve`'s; `fallback` by default when
    `least_memory`). `edge_cache`: an `EdgeCache` of `mesh` (default: its own).
    `deadline`: the call's, capping each solve and the rounds; `saved`: `find_saved(gm)`.
    The overlap is estimated round by round (module docstring): the fastest is returned."""
    say, hints = progress or (lambda message: None), size_hints(gm)
    sizes = {str(k): v for k, v in hints.items()}  # the plan's, by name
    warnings = _unruled_warnings(gm, table)
    saved = find_saved(gm) if saved is None else saved  # the same for every round
    edges = edge_cache if edge_cache is not None else EdgeCache(mesh)
    best, chosen, limit = None, None, time_limit  # the best plan and its choices
    full, built = overlap_rounds == 1, None  # a solve in full; the last problem's charges
    charges = charges or (Background() if overlap_rounds == 1 else FIRST_CHARGES)
    for done in range(overlap_rounds):
        full = full or done == overlap_rounds - 1 or expired(deadline)  # the last round
        if charges != built:
            say(f"{STAGE} build_problem (background gradient reductions charged at "
                f"{charges.reductions:.0%}, parameter gathers at {charges.gathers:.0%})")
            build, built = build_problem(
                gm, table, mesh, memory_budget=memory_budget, hints=hints,
                optimizer=optimizer, fold_layers=fold_layers, charges=charges, saved=saved,
                edge_cache=edges, microbatches=microbatches, in_flight=in_flight,
                unfit_early=not least_memory), charges
        solution = _solved(build, limit, seed=seed, progress=progress, deadline=deadline,
                           rounds=overlap_rounds - done, reference=chosen,
                           fallback=least_memory if fallback is None else fallback,
                           screening=screening or not full)
        if not solution.choices:
            if not full and solution.status != "infeasible":  # none found, none proven:
                full = True  # the next round solves in full
                continue
            if best is not None:  # the charges change no memory: only time can run out
                break
            # The least memory within the solve's own limit, not the deadline's last seconds.
            _infeasible(build, solution, model_name, memory_budget,
                        time_limit if least_memory else None, cache_bytes(gm))
        say(f"{STAGE} extract_plan")
        plan = extract_plan(gm, build, solution, model_name=model_name, sizes=sizes,
                            warnings=warnings)
        if best is None or plan.step_time_s < best.step_time_s:
            best, chosen = plan, solution.choices
        exposed = Background(plan.solver.exposed_reductions, plan.solver.exposed_gathers)
        if expired(deadline) or ((settled := _settled(exposed, charges))
                                 and (full or solution.gap <= SCREENED_GAP)):
            break
        full, charges, limit = settled, exposed, time_limit / 2
    assert best is not None
    return best


def _settled(exposed: Background, charged: Background) -> bool:
    """Whether a plan solved under `charged` left about as much `exposed` (within two
    points of each fraction): charging what it exposes would change little."""
    return abs(exposed.reductions - charged.reductions) < 0.02 \
        and abs(exposed.gathers - charged.gathers) < 0.02


def _solved(build: ProblemBuild, seconds: float, *, seed: int,
            progress: Callable[[str], None] | None, deadline: Deadline | None,
            rounds: int, reference: tuple[int, ...] | None, fallback: bool,
            screening: bool = False) -> Solution:
    """One round's solve, for `seconds` capped by `deadline`, where the `rounds` still to
    come share what is left (the later ones, charged closer to what the plan hides, tend
    to find the faster plans). `reference`: the best plan's choices so far, which the
    solve ends on when its bound shows no plan of the round much faster; `fallback`:
    whether a slow plan that fits beats none, `screening` (`solve`'s)."""
    say = progress or (lambda message: None)
    spent = "" if deadline is None else f"; {deadline.describe()}"
    say(f"{STAGE} solve ({build.problem.num_nodes} decisions, "
        f"{build.problem.num_edges} edges{spent})")
    if deadline is not None:
        seconds = deadline.solve_seconds(seconds, 1 / rounds)
    solution = solve(build.problem, time_limit=seconds, seed=seed, progress=progress,
                     repeatable=True, reference=reference, fallback=fallback,
                     screening=screening)
    if deadline is not None:
        deadline.charge(seconds, optimal=solution.status in ("optimal", "infeasible"))
    return solution


def cache_bytes(gm: fx.GraphModule) -> float:
    """Bytes of the buffers a forward-only graph writes in place (a KV cache), whole."""
    fold = gm.meta.get(FOLD)  # a folded block's buffer stands for its copies'
    return float(sum(n.meta[TENSOR].nbytes * (fold.repeats(n.name) if fold else 1)
                     for n in written_buffers(gm)))


def _infeasible(build: ProblemBuild, solution: Solution, model_name: str,
                memory_budget: float | None, time_limit: float | None,
                cache: float = 0.0) -> NoReturn:
    """Raise `InfeasiblePlanError`; with the least memory any plan needs, searched for
    within `time_limit` seconds, unless that is None; naming the `cache` bytes (a KV
    cache's, whole) when there is one."""
    if cache and memory_budget is not None:
        devices = build.mesh.size
        least = None if time_limit is None else min_peak_usage(build.problem,
                                                              time_limit=time_limit)
        raise InfeasiblePlanError(
            f"no plan of {model_name} fits in {_gib(memory_budget)} per device with its "
            f"KV cache of {_gib(cache)} ({_gib(cache / devices)} per device even when "
            f"split over all {devices})", min_bytes=least,
            expected="a memory budget that holds a share of the weights and of the cache "
                     "and one forward's activations" + (
                         f": at least {_gib(least)}" if least is not None else ""),
            got=f"{_gib(memory_budget)} per device for a cache of {_gib(cache)}",
            fix="shrink the cache (CachedLM's batch or max_len), use more devices, or raise "
                "memory_budget")
    if memory_budget is None:  # only forbidden strategy pairs can leave no plan
        raise InfeasiblePlanError(f"no plan of {model_name} among its allowed strategies",
                                  expected="a strategy table with a compatible choice "
                                  "for every node", got=f"solver status {solution.status}",
                                  fix="allow more strategies (fewer constraints)")
    if time_limit is None:
        raise InfeasiblePlanError(
            f"no plan of {model_name} fits in {_gib(memory_budget)} per device",
            expected="a plan within the memory budget", got=f"solver status {solution.status}",
            fix="raise memory_budget, use more devices, or shrink the batch or model")
    least = min_peak_usage(build.problem, time_limit=time_limit)
    raise InfeasiblePlanError(
        f"no plan of {model_name} fits in {_gib(memory_budget)} per device",
        min_bytes=least, expected=f"a memory budget of at least {_gib(least)}",
        got=_gib(memory_budget),
        fix="raise memory_budget, use more devices, or shrink the batch or model")
