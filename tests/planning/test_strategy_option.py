"""`autopar.plan(..., strategy=NAME)`: the plan of one standard hand strategy instead of the
solver's free choice, and names that are not one refused before planning."""

from __future__ import annotations

import pytest

import autopar
from examples import gpt


@pytest.fixture(scope="module")
def model_and_inputs():
    return gpt.build(batch=8, seq=64, hidden=64, heads=4, layers=2, device="meta")


def test_a_named_strategy_is_the_plan(model_and_inputs) -> None:
    """ZeRO-3 stores every weight split and gathers it at use; Megatron keeps the batch
    whole and splits the weight matrices; each plan carries its own record only."""
    model, inputs = model_and_inputs
    mesh = autopar.Mesh((2,), ("dp",), hardware="a100-sxm")
    zero = autopar.plan(model, mesh, inputs, strategy="fully sharded (ZeRO-3)", time_limit=5)
    weights = [n for n in zero.nodes if n.role == "parameter" and n.name.endswith("weight")]
    assert weights and all("S(" in n.output for n in weights)
    assert ("all_gather", "dp", "backward") in zero.comm_bytes()  # gathered again
    assert [r.name for r in zero.hand_strategies] == ["fully sharded (ZeRO-3)"]
    assert zero.step_time_s == pytest.approx(zero.hand_strategies[0].step_time_s)
    megatron = autopar.plan(model, mesh, inputs, strategy="Megatron tensor parallel",
                            time_limit=5)
    assert megatron.model == zero.model == "GPT"
    linears = [n for n in megatron.nodes if n.op == "aten.linear.default"]
    assert any("S(" in n.inputs[1] for n in linears)  # weights split
    assert all(not n.inputs[0].startswith("S(0)") for n in linears)  # the batch is not


def test_a_strategy_that_does_not_fit_is_refused(model_and_inputs) -> None:
    model, inputs = model_and_inputs
    mesh = autopar.Mesh((2,), ("dp",), hardware="a100-sxm")
    with pytest.raises(autopar.InfeasiblePlanError, match="data parallel"):
        autopar.plan(model, mesh, inputs, strategy="data parallel", memory_budget=1e5,
                     time_limit=5)


@pytest.mark.parametrize("name", ["zero-3", "data x tensor parallel"])
def test_an_unknown_or_inapplicable_strategy_is_refused(model_and_inputs, name) -> None:
    model, inputs = model_and_inputs
    with pytest.raises(autopar.ShardingError, match="no standard hand strategy") as error:
        autopar.plan(model, autopar.Mesh((2,), ("dp",)), inputs, strategy=name)
    assert "'data parallel'" in str(error.value)


def test_megatron_3d_by_name_is_its_pipelined_plan(model_and_inputs) -> None:
    """On a (pp, tp) mesh "Megatron 3D" is the hand strategy's own plan: pipelined over pp,
    its weights split over tp, its record the only one, its step the record's."""
    model, inputs = model_and_inputs
    mesh = autopar.Mesh((2, 2), ("pp", "tp"), hardware="h100-sxm")
    plan = autopar.plan(model, mesh, inputs, strategy="Megatron 3D", time_limit=5)
    assert plan.pipeline is not None and plan.pipeline.axis == "pp"
    assert [r.name for r in plan.hand_strategies] == ["Megatron 3D"]
    assert plan.step_time_s == pytest.approx(plan.hand_strategies[0].step_time_s)
    linears = [n for n in plan.nodes if n.op == "aten.linear.default"]
    assert linears and all("S(" in n.inputs[1].split(",")[1] for n in linears)
    assert plan.model == "GPT"


def test_megatron_3d_by_name_refuses_what_it_cannot_plan(model_and_inputs) -> None:
    model, inputs = model_and_inputs
    with pytest.raises(autopar.ShardingError, match="no standard hand strategy"):
        autopar.plan(model, autopar.Mesh((4,), ("dp",)), inputs, strategy="Megatron 3D")
    two_nvlink = autopar.Mesh((2, 2), ("a", "b"), hardware="h100-sxm")  # one node: no pp
    with pytest.raises(autopar.ShardingError, match="pp"):
        autopar.plan(model, two_nvlink, inputs, strategy="Megatron 3D", time_limit=5)
    pp = autopar.Mesh((2, 2), ("pp", "tp"), hardware="h100-sxm")
    for chosen in ({"pipeline": False}, {"microbatches": 4},
                   {"constraints": {"lm_head.weight": "R,R"}}):
        with pytest.raises(autopar.ShardingError, match="chooses its own micro-batches"):
            autopar.plan(model, pp, inputs, strategy="Megatron 3D", **chosen)


def test_a_named_strategy_holds_each_stage_s_micro_batches_in_flight(model_and_inputs) -> None:
    """Pipelined under a named strategy, a stage's memory counts the micro-batches its
    schedule holds at once: GPipe holds all four on the last stage, 1F1B one, so the same
    stage plans hold more activations under GPipe."""
    model, inputs = model_and_inputs
    mesh = autopar.Mesh((2, 2), ("pp", "dp"), hardware="h100-sxm")
    last = {}
    for schedule in ("GPipe", "1F1B"):
        plan = autopar.plan(model, mesh, inputs, strategy="data parallel", time_limit=5,
                            pipeline=autopar.Pipeline(schedule=schedule, microbatches=4))
        stage = plan.pipeline.stages[-1]
        last[schedule] = stage.in_flight, stage.memory_bytes
    assert last["GPipe"][0] == 4 and last["1F1B"][0] == 1
    assert last["GPipe"][1] > last["1F1B"][1]
