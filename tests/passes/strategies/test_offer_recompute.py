"""Which ops are offered recomputation: from kept tensors, and inside a block also from
and through tensors nothing keeps (the recipe keeps them, as torch's checkpoint keeps a
region's inputs), which only hand strategies fix; outside blocks only from kept tensors."""

from __future__ import annotations

from autopar import Mesh
from autopar.passes.capturing.annotate import annotate, size_hints
from autopar.passes.capturing.capture import capture
from autopar.passes.capturing.find_saved import find_saved, kept_outputs
from autopar.passes.capturing.gradient_path import gradient_path
from autopar.passes.problem.build_problem import build_problem
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
    its cheap ops recomputed; "selective" keeps every matmul. The k projection is offered
    though only views of it are read (the rotary embedding's transpose and slices): the
    recipe of what reads them keeps the projection's output (`recomputable`)."""
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
        assert flags(op, matmuls) == [False, True, False, True, False, True, False]
        assert any(s.recompute for s in table.strategies[matmuls[1]])
        assert not any(flags(selective, matmuls))
    attention = [n.name for n in gm.graph.nodes if "scaled_dot_product" in str(n.target)]
    assert attention and not any(any(s.recompute for s in op.strategies[name])
                                 for name in attention)


def _hf_llama_graph(dtype):
    """A 2-layer transformers Llama in `dtype` on the meta device, captured and annotated
    (its RMSNorm converts a bfloat16 input to float32: the norm then keeps the copy, not
    the block's input)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    class Loss(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, ids, labels):
            return self.lm(input_ids=ids, labels=labels).loss

    with torch.device("meta"):
        lm = LlamaForCausalLM(LlamaConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, use_cache=False,
            attn_implementation="sdpa")).to(dtype)
    lm.loss_type = "ForCausalLM"
    ids = torch.zeros(2, 16, dtype=torch.long, device="meta")
    return annotate(capture(Loss(lm), (ids, ids)))


def _full(gm):
    mesh = Mesh((2,), ("x",), hardware="cpu")
    table = offer_recompute(gm, find_strategies(gm, mesh))
    return mesh, table, restrict(gm, table, mesh, ("dp",), "full").table


def test_full_recomputes_a_transformers_block_through_views_and_attention():
    """Checkpointing a transformers Llama block keeps its input alone: the projections read
    only through views (q and k by the rotary embedding's transpose and slices, k and v
    by `repeat_kv`'s expand), the rotary ops and attention (`scaled_dot_product_attention`
    is tagged random for its dropout, 0 here) are all recomputed from it; before, 5 tensors
    of a block's hidden size were kept for each one its input needs."""
    import torch

    gm = _hf_llama_graph(torch.float32)
    _, _, full = _full(gm)
    on_path = gradient_path(gm)
    block = [n for n in gm.graph.nodes if n.op == "call_function" and on_path[n.name]
             and n.meta.get("autopar_bytes", 0) != 0 and recompute_region(n).endswith(
                 "layers.0")]
    kept = [n.name for n in block if not all(s.recompute for s in full.strategies[n.name])]
    # The block's output, the residual sum the next block reads, is all it keeps.
    by_name = {n.name: n for n in block}
    assert len(kept) == 1, kept
    assert any(recompute_region(user).endswith("layers.1") for user in by_name[kept[0]].users)
    assert any("scaled_dot_product" in str(n.target) for n in block)
    assert sum("linear" in str(n.target) for n in block) == 7


def test_a_checkpointed_block_holds_its_input_once():
    """A bfloat16 block's input, read by two recomputed ops that keep nothing (the norm's
    conversion to float32 and the residual add), is held by one recipe under "full": the
    problem's recipe edges name each tensor once. The solver's own table, where either
    reader may be kept, still charges both (`build_problem._one_recipe_each`)."""
    import torch

    gm = _hf_llama_graph(torch.bfloat16)
    mesh, table, full = _full(gm)
    saved, hints = find_saved(gm), size_hints(gm)

    def recipes(restricted):
        build = build_problem(gm, restricted, mesh, memory_budget=None, hints=hints,
                              saved=saved)
        return [ref.producer for ref in build.edges if ref.recipe]

    once, each = recipes(full), recipes(table)
    assert once and len(once) == len(set(once)), once
    assert len(each) > len(set(each)) and set(each) >= set(once), each
