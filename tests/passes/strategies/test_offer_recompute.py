"""Which ops are offered recomputation: from kept tensors, and inside a block also from
and through tensors nothing keeps (the recipe keeps them, as torch's checkpoint keeps a
region's inputs), which only hand strategies fix; outside blocks only from kept tensors."""

from __future__ import annotations

from autopar import Mesh
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.passes.capturing.find_saved import find_saved, kept_outputs
from autopar.passes.capturing.gradient_path import gradient_path
from autopar.passes.strategies.find_strategies import find_strategies
from autopar.passes.strategies.offer_recompute import (
    offer_recompute,
    recomputable,
    recompute_region,
    searched,
)
from autopar.passes.strategies.restrict import restrict
from examples import gpt


def test_a_block_recomputes_from_inputs_nothing_keeps_and_nothing_else_does():
    model, inputs = gpt.build(device="meta", layers=2)
    gm = annotate(capture(model, inputs))
    on_path, kept = gradient_path(gm), kept_outputs(gm, find_saved(gm))
    by_name = {node.name: node for node in gm.graph.nodes}
    # The residual adds read an attention or MLP branch's output projection, which no op
    # keeps (an add saves nothing); their own outputs are kept by the next layer norm.
    for name, branch in (("add_1", "linear_1"), ("add_2", "linear_3")):
        assert not kept[branch] and kept[name]
        assert by_name[branch] in by_name[name].all_input_nodes
        assert recomputable(by_name[name], on_path, kept, from_block_inputs=True), name
        assert not recomputable(by_name[name], on_path, kept), name
    # The embeddings' sum, outside any block, reads two embeddings nothing keeps: recomputing
    # it would only hold them instead.
    assert not kept["embedding"]
    assert not recomputable(by_name["add"], on_path, kept, from_block_inputs=True)
    mesh = Mesh((2,), ("x",), hardware="cpu")
    table = offer_recompute(gm, find_strategies(gm, mesh))
    assert any(s.recompute for s in table.strategies["add_1"])
    assert not any(s.recompute for s in table.strategies["add"])
    assert "add_1" in table.checkpointed and "gelu" not in table.checkpointed
    # The solver's search leaves checkpointing to hand strategies, which fix it.
    search = searched(table)
    assert not any(s.recompute for s in search.strategies["add_1"])
    assert any(s.recompute for s in search.strategies["gelu"])
    full = restrict(gm, table, mesh, ("dp",), "full").table
    assert all(s.recompute for s in full.strategies["add_1"])
    free = restrict(gm, table, mesh, ("dp",)).table
    assert not any(s.recompute for s in free.strategies["add_1"])
    assert any(s.recompute for s in free.strategies["gelu"])


def test_op_level_selective_recomputes_every_second_matmul_of_a_block():
    """torchtitan's "op" policy: a block keeps its matmuls but each second one (q kept, k
    recomputed, v kept, o recomputed, gate kept, up recomputed, down kept), attention kept,
    its cheap ops recomputed; "selective" keeps every matmul. The k projection is counted
    but stays kept: only the rotary embedding reads it, through views, and no op keeps it,
    so recomputing it is not offered (`recomputable`)."""
    from examples import llama

    # Wide enough that a matmul does more than selective's FLOPs per byte.
    model, inputs = llama.build(device="meta", layers=2, hidden=256, ffn=704, seq=64)
    gm = annotate(capture(model, inputs))
    mesh = Mesh((2,), ("x",), hardware="cpu")
    table = offer_recompute(gm, find_strategies(gm, mesh))
    op = restrict(gm, table, mesh, ("dp",), "op").table
    selective = restrict(gm, table, mesh, ("dp",), "selective").table

    def flags(restricted, names):
        return [all(s.recompute for s in restricted.strategies[name]) for name in names]

    for block in ("layers.0", "layers.1"):
        matmuls = [n.name for n in gm.graph.nodes if n.op == "call_function"
                   and str(n.target).startswith("aten.linear")
                   and recompute_region(n).endswith(block)]
        assert len(matmuls) == 7, matmuls
        assert flags(op, matmuls) == [False, False, False, True, False, True, False]
        assert not any(s.recompute for s in table.strategies[matmuls[1]])
        assert not any(flags(selective, matmuls))
    attention = [n.name for n in gm.graph.nodes if "scaled_dot_product" in str(n.target)]
    assert attention and not any(any(s.recompute for s in op.strategies[name])
                                 for name in attention)
