"""Context-parallel plans train exactly like the single-process model, with the bytes the
plan predicts.

Each case is planned in the parent under the "cp" role (`passes/strategies/restrict.py`: the inputs
split along the sequence, every attention on the ring of that axis, parameters sharded
over it), alone (cp=2) or next to Megatron on a second axis (cp x tp = 2 x 2), and trained
3 AdamW steps on gloo ranks next to the plain model (`equivalence_cases`): the loss and
every gradient within `TOLERANCE` at every step, and every rank's measured bytes per
(kind, axis, direction), the ring's sends included, equal to the plan's. The models cover
causal attention balanced over the ring (`is_causal`: GPT, Llama with grouped key/value
heads), a boolean padding mask (BERT, not causal) and a causal mask built in the graph
(transformers' GPT-2).
"""

from __future__ import annotations

import equivalence_cases as cases
import pytest
from equivalence_cases import Case

import autopar
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.passes.strategies.find_strategies import find_strategies
from autopar.passes.strategies.restrict import restrict
from autopar.planning.graph import plan_table
from autopar.runtime.launch import launch

MODELS = (Case("examples.gpt"), Case("examples.llama"), Case("examples.bert"),
          Case("hf_models", build=(("name", "gpt2"),)))
LAYOUTS = {"cp2": ((2,), ("cp",), ("cp",)), "cp2xtp2": ((2, 2), ("cp", "tp"), ("cp", "tp"))}


def _planned(case: Case, shape, names, roles) -> Case:
    model, inputs = case.model()
    gm = annotate(capture(model, inputs))
    mesh = autopar.Mesh(shape, names, hardware="cpu")
    table = restrict(gm, find_strategies(gm, mesh), mesh, roles).table
    plan = plan_table(gm, table, mesh, model_name=type(model).__name__, memory_budget=None,
                      time_limit=3.0, fold_layers=True, seed=0)
    return Case(case.example, case.build, plan=plan.to_dict())


@pytest.fixture(scope="module", params=list(LAYOUTS))
def trained(request):
    shape, names, roles = LAYOUTS[request.param]
    planned = tuple(_planned(case, shape, names, roles) for case in MODELS)
    results = launch(cases.train_all, len(names) * 2 if len(shape) > 1 else shape[0],
                     planned, shape, names, timeout=900.0)
    return planned, results


def test_every_attention_runs_on_the_ring(trained):
    planned, _ = trained
    for case in planned:
        plan = autopar.Plan.from_dict(case.plan)
        attention = [n for n in plan.nodes if "scaled_dot_product" in n.op]
        assert attention, case.example
        for node in attention:
            sends = [t for t in node.transfers if t.kind == "send"]
            assert sends and {t.axis for t in sends} == {"cp"}, (case.example, node.name)


def test_loss_and_every_gradient_match_the_single_process_model(trained):
    planned, results = trained
    cases.check_equivalence(planned, results)


def test_measured_bytes_equal_the_plan_on_every_rank(trained):
    planned, results = trained
    for per_rank in results:
        for case, outcome in zip(planned, per_rank):
            predicted = {key: nbytes * case.steps for key, nbytes in outcome.predicted.items()}
            assert outcome.measured == predicted, case.example
            assert outcome.measured.get(("send", "cp", "backward")), case.example
