"""The lowering pass on its own: rank programs read as graphs, no processes needed."""

from __future__ import annotations

import operator

import pytest
import torch

import autopar
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.passes.lowering.lower import lower
from autopar.rules.embedding import masked_embedding
from autopar.runtime.collectives import Collective, RankContext
from examples import gpt, mlp

aten = torch.ops.aten


def _graph(module, inputs):
    return annotate(capture(module, inputs))


def _calls(program, target):
    return [n for n in program.module.graph.nodes if n.op == "call_function"
            and n.target is target]


def test_a_mesh_of_one_device_yields_no_collective():
    model, inputs = gpt.build()
    mesh = autopar.Mesh((1,), ("x",), hardware="cpu")
    gm = _graph(model, inputs)
    program = lower(gm, autopar.plan(model, mesh, inputs), (0,), None)
    assert program.collectives == ()
    assert not any(isinstance(m, Collective) for m in program.module.modules())
    ops = [n.target for n in program.module.graph.nodes if n.op == "call_function"]
    captured = [n.target for n in gm.graph.nodes if n.op == "call_function"
                and n.target is not aten._assert_tensor_metadata.default]
    assert len(ops) == len(captured)


def test_megatron_mlp_has_one_forward_all_reduce_and_local_shapes():
    model, inputs = mlp.build(hidden=32, ffn=128)
    mesh = autopar.Mesh((2,), ("tp",), hardware="cpu")
    plan = autopar.plan(model, mesh, inputs,
                        constraints={"fc1.weight": "S(0)", "fc2.weight": "S(1)"})
    program = lower(_graph(model, inputs), plan, (1,), RankContext(mesh=None))
    forward = [s.kind for _, r in program.collectives for s in r.forward_steps if s.kind]
    assert forward == ["all_reduce"]
    shapes = {slot.names[0]: slot for slot in program.state}
    assert shapes["fc1.weight"].shape == (128, 32)  # global; the slot's placements cut it
    assert str(shapes["fc1.weight"].placements[0]) == "S(0)"


def test_head_split_attention_views_use_local_sizes():
    model, inputs = gpt.build(heads=4, hidden=64, seq=32)
    mesh = autopar.Mesh((2,), ("tp",), hardware="cpu")
    gm = _graph(model, inputs)
    # The views that split the hidden dim into (heads, head_dim), pinned split by heads.
    heads = [n.name for n in gm.graph.nodes
             if n.target is aten.view.default and len(n.args[1]) == 4]
    plan = autopar.plan(model, mesh, inputs, constraints=dict.fromkeys(heads, "S(2)"))
    program = lower(gm, plan, (0,), RankContext(mesh=None))
    global_views = {tuple(n.args[1]) for n in gm.graph.nodes if n.target is aten.view.default}
    local_views = {tuple(n.args[1]) for n in program.module.graph.nodes
                   if n.target is aten.reshape.default}
    assert (2, 32, 2, 16) in local_views - global_views, (global_views, local_views)


@pytest.mark.parametrize("coordinate, start", [((0,), 0), ((1,), 128)])
def test_vocab_split_embedding_looks_up_from_the_ranks_first_row(coordinate, start):
    model, inputs = gpt.build(vocab=256)
    mesh = autopar.Mesh((2,), ("tp",), hardware="cpu")
    plan = autopar.plan(model, mesh, inputs, constraints={"wte.weight": "S(0)", "embedding": "P"})
    program = lower(_graph(model, inputs), plan, coordinate, RankContext(mesh=None))
    (lookup,) = _calls(program, masked_embedding)
    assert lookup.args[2] == start


def test_a_plan_of_another_model_is_refused():
    model, inputs = mlp.build()
    other, other_inputs = gpt.build()
    mesh = autopar.Mesh((1,), ("x",), hardware="cpu")
    with pytest.raises(autopar.PlanFormatError, match="does not match the model"):
        lower(_graph(model, inputs), autopar.plan(other, mesh, other_inputs), (0,), None)


def test_getitem_nodes_are_kept():
    model, inputs = gpt.build()
    mesh = autopar.Mesh((1,), ("x",), hardware="cpu")
    program = lower(_graph(model, inputs), autopar.plan(model, mesh, inputs), (0,), None)
    assert _calls(program, operator.getitem)
