"""`autopar.plan` end to end on small models: the Plan value, JSON, summary, determinism."""

import pytest
import torch

import autopar
from examples import gpt, mlp


@pytest.fixture(scope="module")
def gpt_plan():
    model, inputs = gpt.build(layers=3)
    return autopar.plan(model, autopar.Mesh((2, 2), ("dp", "tp"), hardware="a100-sxm"), inputs)


def test_plan_covers_every_op_and_predicts_the_objective(gpt_plan):
    assert gpt_plan.step_time_s == pytest.approx(gpt_plan.solver.objective, rel=1e-9)
    assert gpt_plan.solver.status == "optimal"
    assert gpt_plan.solver.tied > 0  # identical blocks folded
    roles = {n.role for n in gpt_plan.nodes}
    assert {"parameter", "input", "op", "output"} <= roles
    assert all(len(n.output.split(",")) == 2 for n in gpt_plan.nodes)


def test_identical_blocks_get_identical_placements(gpt_plan):
    def block(i):
        return [(n.op, n.inputs, n.output) for n in gpt_plan.nodes
                if n.module.startswith(f"layers.{i}.")]
    assert block(0) == block(1) == block(2)


def test_json_round_trip(gpt_plan, tmp_path):
    path = tmp_path / "plan.json"
    gpt_plan.save(path)
    loaded = autopar.Plan.load(path)
    assert loaded == gpt_plan


def test_summary_lists_groups_totals_and_collectives(gpt_plan):
    text = autopar.summary(gpt_plan)
    for expected in ("layers.*.attn", "predicted step time", "peak memory", "solver",
                     "Bytes moved per device"):
        assert expected in text
    assert "\x1b[" not in text  # plain text, no colour codes


def test_same_inputs_same_plan():
    model, inputs = gpt.build(layers=2)
    mesh = autopar.Mesh((2, 2), ("dp", "tp"), hardware="h100-sxm")
    first = autopar.plan(model, mesh, inputs)
    second = autopar.plan(model, mesh, inputs)
    assert [(n.inputs, n.output) for n in first.nodes] == [
        (n.inputs, n.output) for n in second.nodes]


def test_dynamic_batch_keeps_cost_formulas():
    model, inputs = mlp.build(batch=64, hidden=256, ffn=1024)
    batch = torch.export.Dim("batch", min=2, max=1 << 20)
    plan = autopar.plan(model, autopar.Mesh((4,), ("dp",), hardware="h100-sxm"), inputs,
                        dynamic_shapes=({0: batch}, {0: batch}))
    assert plan.sizes  # the symbolic batch and its example value
    (symbol, value), = plan.sizes
    assert value == 64
    assert plan.step_time() == pytest.approx(plan.step_time_s, rel=1e-6)
    # A larger batch costs more, and matches re-planning at that batch with the same placements.
    assert plan.step_time(**{symbol: 4096}) > plan.step_time_s
