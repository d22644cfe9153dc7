"""A recomputed output that a consumer converts and keeps: the consumer keeps its own copy.

Megatron's hand strategy on transformers' GPT-2 (distributed optimizer over "dp", tensor
parallel over "tp", selective recomputation) recomputes each block's layer norms, and the
fused q, k, v projection that reads a norm's output splits it along the hidden dim (its
columns can't be split: q, k and v would not fall on whole ranks). Such a plan was
forbidden (`edge_costs.strategy_edge_transfers`): no plan of the strategy existed. On a
(2, 2) gloo mesh it now trains 3 AdamW steps as the single-process model does (losses and
every gradient within `TOLERANCE`), its collectives moving the bytes the plan says.
"""

from __future__ import annotations

import hf_models
import pytest
from equivalence_cases import Case, check_bytes, check_equivalence, train_all

import autopar
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.passes.capturing.find_saved import written_base
from autopar.passes.strategies.restrict import restrict
from autopar.planning.graph import plan_table, strategy_tables
from autopar.runtime.launch import launch

SHAPE, AXES = (2, 2), ("dp", "tp")


def _megatron_plan():
    model, inputs = hf_models.build("gpt2")
    mesh = autopar.Mesh(SHAPE, AXES, hardware="cpu")
    gm = annotate(capture(model, inputs))
    tables = strategy_tables(gm, mesh, microbatches=1)
    table = restrict(tables.gm, tables.found, mesh, ("dopt", "tp"), "selective").table
    return tables.gm, plan_table(tables.gm, table, mesh, model_name="GPT-2",
                                 memory_budget=None, time_limit=10.0, fold_layers=True,
                                 seed=0)


@pytest.fixture(scope="module")
def outcomes():
    gm, plan = _megatron_plan()
    chosen = (Case("hf_models", build=(("name", "gpt2"),), plan=plan.to_dict()),)
    return gm, plan, chosen, launch(train_all, 4, chosen, SHAPE, AXES, timeout=600.0)


def test_a_recomputed_norm_is_converted_by_the_projection_that_keeps_it(outcomes):
    gm, plan, _, _ = outcomes
    nodes = {node.name: node for node in plan.nodes}
    converted = [node.name for node in gm.graph.nodes if "addmm" in str(node.target)
                 and any(written_base(source) is not None
                         and nodes[written_base(source).name].recompute
                         and nodes[source.name].output != nodes[node.name].inputs[position]
                         for position, source in enumerate(node.all_input_nodes))]
    assert converted, "no projection reads a recomputed norm converted"


def test_loss_and_every_gradient_match_the_single_process_model(outcomes):
    _, _, chosen, results = outcomes
    check_equivalence(chosen, results)


def test_measured_bytes_equal_the_plan(outcomes):
    _, _, chosen, results = outcomes
    check_bytes(chosen, results)
