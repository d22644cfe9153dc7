"""The problem pass's fast paths against the per-entry computation they replace.

`build_problem` computes an edge's cost matrix once per distinct signature of its pairs of
strategies (`EdgeCache`), keeps it apart from the charges for the next build, and computes
a node's costs once for the nodes alike in all they read. Here every entry is computed the
straightforward way, through `strategy_edge_transfers` and the charging functions, and every
node's arrays strategy by strategy, and the problems must be equal to the bit.
"""

import dataclasses
import math

import numpy as np
import pytest

from autopar import Mesh
from autopar.passes.capturing.annotate import annotate, size_hints
from autopar.passes.capturing.capture import capture
from autopar.passes.capturing.find_saved import find_saved
from autopar.passes.problem import build_problem as bp
from autopar.passes.problem import edge_cache, edge_costs
from autopar.passes.strategies.find_strategies import find_strategies
from autopar.passes.strategies.offer_recompute import offer_recompute
from autopar.passes.strategies.offer_whole_gradient import offer_whole_gradient
from examples import gpt, llama

CHARGES = (edge_costs.Background(), edge_costs.Background(reductions=0.3, gathers=0.65))
SQUARE = Mesh((2, 2), ("a", "b"), hardware="h100-sxm")
CUBE = Mesh((2, 2, 2), ("a", "b", "c"), hardware="h100-sxm")
# A batch of one sample leaves fewer ways to split over a 2x2x2 mesh, which keeps the
# per-entry reference short.
TINY = dict(vocab=8, seq=4, hidden=8, heads=2, layers=2, batch=1)


@pytest.fixture(scope="module")
def graphs():
    built = {"gpt": gpt.build(device="meta", layers=2),
             "llama": llama.build(device="meta", layers=2),
             "gpt-tiny": gpt.build(device="meta", **TINY),
             "llama-tiny": llama.build(device="meta", kv_heads=1, ffn=8, **TINY)}
    return {name: annotate(capture(model, inputs)) for name, (model, inputs) in built.items()}


def reference_edges(build: bp.ProblemBuild, table, microbatches: int) -> list[list]:
    """Per charges of `CHARGES`, every edge's matrix entry by entry: inf where
    `strategy_edge_transfers` forbids the pair, else the step seconds of its transfers less
    the hidden fractions (1 - charges) of the background ones. Edges that differ only by
    the names of their ends (the same strategy tuples: repeated blocks) are computed once:
    those functions do not read the names."""
    hidden = [edge_costs.Background(1 - c.reductions, 1 - c.gathers) for c in CHARGES]
    matrices: list[list] = [[] for _ in CHARGES]
    computed: dict[tuple, np.ndarray] = {}
    for ref in build.edges:
        src, dst = table.strategies[ref.producer], table.strategies[ref.consumer]
        key = (id(src), id(dst), dataclasses.replace(ref, producer="", consumer=""))
        if key in computed:
            for c in range(len(CHARGES)):
                matrices[c].append(computed[key][c])
            continue
        entries = computed[key] = np.empty((len(CHARGES), len(src), len(dst)))
        for k, s in enumerate(src):
            for m, d in enumerate(dst):
                transfers = edge_costs.strategy_edge_transfers(ref, s, d, ref.tensor.nbytes,
                                                               build.mesh.shape)
                for c, fractions in enumerate(hidden):
                    entries[c, k, m] = math.inf if transfers is None else float(
                        sum(edge_costs.step_seconds(ref, s, transfers, microbatches, build.mesh))
                        - edge_costs.hidden_seconds(ref, s, transfers, microbatches, build.mesh,
                                                    fractions))
        for c in range(len(CHARGES)):
            matrices[c].append(entries[c])
    return matrices


# Each model with and without recompute offers, and one or two micro-batches, on both meshes.
CASES = [("gpt", SQUARE, True, 1), ("gpt", SQUARE, False, 2), ("llama", SQUARE, False, 1),
         ("llama", SQUARE, True, 2), ("gpt-tiny", CUBE, True, 2), ("llama-tiny", CUBE, False, 1)]


@pytest.mark.parametrize(("model", "mesh", "recompute", "microbatches"), CASES,
                         ids=[f"{m}-{'x'.join(map(str, mesh.shape))}-"
                              f"{'recompute' if r else 'keep'}-mb{n}"
                              for m, mesh, r, n in CASES])
def test_edge_matrices_equal_the_per_entry_computation(graphs, model, mesh, recompute,
                                                       microbatches):
    gm = graphs[model]
    table = find_strategies(gm, mesh)
    if recompute:
        table = offer_recompute(gm, table)
    if microbatches > 1:
        table = offer_whole_gradient(table)
    hints, saved = size_hints(gm), find_saved(gm)
    cache = edge_cache.EdgeCache(mesh)  # shared by both builds, as plan_table's rounds share it
    builds = [bp.build_problem(gm, table, mesh, memory_budget=None, hints=hints,
                               charges=charges, saved=saved, microbatches=microbatches,
                               edge_cache=cache) for charges in CHARGES]
    expected = reference_edges(builds[0], table, microbatches)
    for build, matrices in zip(builds, expected):
        assert len(build.problem.edge_costs) == len(matrices)
        for edge, (fast, slow) in enumerate(zip(build.problem.edge_costs, matrices)):
            assert np.array_equal(fast, slow), (model, edge, build.edges[edge])
    assert any(np.isinf(m).any() for m in expected[0])  # some pairs are forbidden
    assert any(not np.array_equal(a, b) for a, b in zip(*expected))  # charges matter
    # A fresh cache computes the same matrices.
    again = bp.build_problem(gm, table, mesh, memory_budget=None, hints=hints,
                             charges=CHARGES[1], saved=saved, microbatches=microbatches)
    assert all(np.array_equal(a, b) for a, b in zip(again.problem.edge_costs, expected[1]))


@pytest.mark.parametrize("microbatches", [1, 2])
def test_node_arrays_equal_the_per_node_computation(graphs, monkeypatch, microbatches):
    gm, mesh = graphs["llama"], SQUARE
    table = offer_recompute(gm, find_strategies(gm, mesh))
    if microbatches > 1:
        table = offer_whole_gradient(table)
    options = dict(memory_budget=None, hints=size_hints(gm), saved=find_saved(gm),
                   microbatches=microbatches, in_flight=microbatches)
    fast = bp.build_problem(gm, table, mesh, **options).problem
    assert fast.ties  # tied blocks: nodes alike share their arrays
    # Each node's arrays, strategy by strategy.
    monkeypatch.setattr(bp._Builder, "_array",
                        lambda self, key, values: np.array(values(), dtype=float))
    slow = bp.build_problem(gm, table, mesh, **options).problem
    for name in ("node_costs", "node_usages"):
        assert all(np.array_equal(a, b)
                   for a, b in zip(getattr(fast, name), getattr(slow, name), strict=True))


def test_an_edge_cache_serves_one_mesh(graphs):
    gm = graphs["gpt"]
    with pytest.raises(ValueError, match="EdgeCache"):
        bp.build_problem(gm, find_strategies(gm, SQUARE), SQUARE, memory_budget=None,
                         edge_cache=edge_cache.EdgeCache(Mesh((4,), ("a",), hardware="h100-sxm")))
