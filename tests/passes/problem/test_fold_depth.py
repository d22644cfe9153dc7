"""fold_depth: a run of alike blocks planned as four stands for the whole graph, exactly.

The folded problem must give every tied assignment the unfolded problem's cost and peak
memory, and the plan it yields, expanded, must be the unfolded plan node by node."""

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

import autopar
import autopar.planning.graph as graph_planning
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.passes.problem.build_problem import build_problem
from autopar.passes.problem.fold_depth import fold_depth
from autopar.passes.strategies.find_strategies import find_strategies
from autopar.passes.strategies.offer_recompute import offer_recompute
from autopar.passes.strategies.offer_whole_gradient import offer_whole_gradient
from autopar.solver import solve
from autopar.values.mesh import Mesh
from autopar.values.specs import FOLD, MODULE
from examples import bert, gpt, llama

MESH = Mesh((2, 4), ("dp", "tp"))


def _graph(module, layers: int = 8, batch: int = 8):
    model, inputs = module.build(layers=layers, batch=batch)
    return model, inputs, annotate(capture(model, inputs))


def _blocks(gm) -> list[str]:
    return sorted({m.split(".")[1] for n in gm.graph.nodes
                   if (m := n.meta.get(MODULE, "")).startswith("layers.")}, key=int)


@pytest.mark.parametrize("module", [gpt, llama, bert], ids=["gpt", "llama", "bert"])
def test_keeps_four_blocks_of_the_run(module):
    """Block 0 reads the embeddings, not a block: the run is 1..7, kept as 1, 2, 3 and 7,
    block 3 standing for 3..6; the folded graph is a valid graph."""
    _, _, gm = _graph(module)
    folded = fold_depth(gm)
    folded.graph.lint()
    assert _blocks(folded) == ["0", "1", "2", "3", "7"]
    fold = folded.meta[FOLD]
    assert {len(names) for names in fold.copies.values()} == {4}
    assert all(modules[0].startswith("layers.3") and modules[-1].startswith("layers.6")
               for modules in fold.modules.values())
    assert len(gm.graph.nodes) > len(folded.graph.nodes)


def test_short_runs_and_kept_nodes_do_not_fold():
    _, _, short = _graph(llama, layers=5)  # blocks 1..4: a run of four
    assert fold_depth(short) is short
    _, _, gm = _graph(llama)
    assert fold_depth(gm, keep=frozenset({"layers.4.ffn.up.weight"})) is gm
    assert fold_depth(gm, keep=frozenset({"layers.0.ffn.up.weight"})) is not gm


class _Stack(nn.Module):
    """Eight linear blocks; `loss(stack, x)` is its forward."""

    def __init__(self, loss) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(8))
        self.loss = loss

    def forward(self, x):
        return self.loss(self, x)


def _every_block(stack: _Stack, x):
    outputs = []
    for layer in stack.layers:
        x = torch.relu(layer(x))
        outputs.append(x)
    return torch.stack(outputs).square().mean()


def _weights_only(stack: _Stack, x):
    for layer in stack.layers:
        x = torch.relu(torch.nn.functional.linear(x, layer.weight, layer.bias))
    return x.square().mean()


@pytest.mark.parametrize("loss", [_every_block, _weights_only],
                         ids=["read-from-outside", "weights-used-by-the-parent"])
def test_stacks_whose_blocks_are_not_alone_do_not_fold(loss):
    """A loss over every block's output reads each copy: nothing stands for another. A
    parent that reads the list's weights itself leaves the blocks without ops."""
    gm = annotate(capture(_Stack(loss), (torch.randn(4, 16),), repeat_blocks=False))
    assert fold_depth(gm) is gm


def _problems(gm, microbatches: int, budget: float):
    folded = fold_depth(gm)
    assert folded is not gm
    built = []
    for graph in (gm, folded):
        table = offer_recompute(graph, find_strategies(graph, MESH))
        if microbatches > 1:
            table = offer_whole_gradient(table)
        built.append(build_problem(graph, table, MESH, memory_budget=budget,
                                   microbatches=microbatches, in_flight=2))
    return folded, built


def _unfolded_choices(full, folded_build, folded, choices):
    """The unfolded assignment a folded one stands for."""
    fold = folded.meta[FOLD]
    chosen = dict(zip(folded_build.nodes, choices))
    for name, copies in fold.copies.items():
        if name in chosen:  # a decision node (not a getitem)
            chosen.update({copy: chosen[name] for copy in copies})
    # Tied blocks share one choice: the folded-away blocks took the representative's.
    return tuple(chosen[name] for name in full.nodes)


@pytest.mark.parametrize("module,microbatches", [(gpt, 1), (llama, 4), (bert, 2)],
                         ids=["gpt", "llama-4mb", "bert-2mb"])
def test_tied_assignments_cost_and_peak_the_same(module, microbatches):
    _, _, gm = _graph(module)
    folded, (full, small) = _problems(gm, microbatches, budget=1e9)
    assert small.problem.num_nodes < full.problem.num_nodes
    rng = np.random.default_rng(0)
    for trial in range(6):
        # Diverse feasible tied assignments: optima of randomly reweighted costs.
        scaled = dataclasses.replace(
            small.problem, usage_limit=None,
            node_costs=tuple(c * rng.uniform(0, 3, c.shape) for c in small.problem.node_costs),
            edge_costs=tuple(m * rng.uniform(0, 3, m.shape) for m in small.problem.edge_costs))
        choices = solve(scaled, time_limit=5, seed=trial).choices
        unfolded = _unfolded_choices(full, small, folded, choices)
        assert np.isfinite(full.problem.cost(unfolded))
        assert small.problem.cost(choices) == pytest.approx(full.problem.cost(unfolded),
                                                            rel=1e-12)
        assert small.problem.peak_usage(choices) == pytest.approx(
            full.problem.peak_usage(unfolded), rel=1e-12)


def _node_view(node):
    return (node.name, node.module, node.role, node.op, node.inputs, node.output,
            node.recompute, node.gathered, node.whole_gradient, node.stage,
            tuple(dataclasses.astuple(t)[:5] + (round(t.seconds, 15), t.calls)
                  for t in node.transfers),
            round(node.compute_s, 15), round(node.comm_s, 15), round(node.memory_bytes, 3))


CASES = {
    "gpt": (gpt, {"pipeline": False}),
    "llama-microbatches": (llama, {"microbatches": 4, "pipeline": False}),
    "llama-pipeline": (llama, {"pipeline": autopar.Pipeline(microbatches=4, schedule="1F1B")}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_is_the_unfolded_plan(case, monkeypatch):
    module, options = CASES[case]
    model, inputs = module.build(layers=12 if "pipeline" in case else 8, batch=8)
    mesh = Mesh((2, 2, 2), ("pp", "dp", "tp")) if "pipeline" in case else MESH
    folded = autopar.plan(model, mesh, inputs, time_limit=10, **options)
    monkeypatch.setattr(graph_planning, "fold_depth", lambda gm, keep=frozenset(): gm)
    unfolded = autopar.plan(model, mesh, inputs, time_limit=10, **options)
    assert folded.solver.status == unfolded.solver.status == "optimal"
    assert [_node_view(n) for n in folded.nodes] == [_node_view(n) for n in unfolded.nodes]
    assert folded.step_time_s == pytest.approx(unfolded.step_time_s, rel=1e-12)
    assert folded.peak_memory_bytes == pytest.approx(unfolded.peak_memory_bytes, rel=1e-12)
    assert folded.model_flops == pytest.approx(unfolded.model_flops, rel=1e-12)
    assert folded.solver.decisions < unfolded.solver.decisions


@pytest.mark.slow
def test_a_t5_whose_first_block_differs_plans_as_unfolded(monkeypatch):
    """T5's first block holds the position bias: the run starts at block 1, and the blocks
    after it are tied among themselves (not to block 0) for the representative to stand
    for them."""
    from test_repeat_blocks import _hf_t5

    model, inputs = _hf_t5()  # 7 layers
    mesh = Mesh((2, 2), ("dp", "tp"))
    folded = autopar.plan(model, mesh, inputs, time_limit=10, pipeline=False)
    monkeypatch.setattr(graph_planning, "fold_depth", lambda gm, keep=frozenset(): gm)
    unfolded = autopar.plan(model, mesh, inputs, time_limit=10, pipeline=False)
    assert folded.solver.status == unfolded.solver.status == "optimal"
    assert folded.solver.decisions < unfolded.solver.decisions
    assert [_node_view(n) for n in folded.nodes] == [_node_view(n) for n in unfolded.nodes]
