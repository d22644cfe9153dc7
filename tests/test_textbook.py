"""The solver rediscovers the textbook strategies under the h100-sxm profile.

Each case picks sizes where the answer is unambiguous under the cost model, with the
arithmetic in its docstring, and asserts the placements of the linear layers.
"""

import autopar
from examples import gpt, mlp


def linears(plan):
    return [n for n in plan.nodes if n.op == "aten.linear.default"]


def test_large_batch_small_layer_is_data_parallel():
    """Batch 16384 x hidden 512 on 8 GPUs: the activations (16384 x 2048 x 4 B = 128 MiB) dwarf
    the weights (512 x 2048 x 4 B = 4 MiB), so all-reducing weight gradients (data parallel)
    is far cheaper than any split of the activations."""
    model, inputs = mlp.build(batch=16384, hidden=512, ffn=2048, device="meta")
    plan = autopar.plan(model, autopar.Mesh((8,), ("dp",), hardware="h100-sxm"), inputs)
    for node in linears(plan):
        assert node.inputs[0] == "S(0)" and node.inputs[1] == "R" and node.output == "S(0)"
    kinds = {kind for kind, _, _ in plan.comm_bytes()}
    assert kinds == {"all_reduce"}  # the gradient all-reduce, nothing else


def test_small_batch_wide_layers_is_megatron_column_then_row():
    """Batch 8 x hidden 16384 x ffn 65536 on 8 GPUs: the weights (2 x 4 GiB) dwarf the
    activations (8 x 65536 x 4 B = 2 MiB). Megatron's column-then-row split moves only one
    activation all-reduce forward (8 x 16384 x 4 B = 512 KiB) and no weight gradients."""
    model, inputs = mlp.build(batch=8, hidden=16384, ffn=65536, device="meta")
    plan = autopar.plan(model, autopar.Mesh((8,), ("tp",), hardware="h100-sxm"), inputs)
    first, second = linears(plan)
    assert (first.inputs[:2], first.output) == (("R", "S(0)"), "S(1)")       # column split
    assert (second.inputs[:2], second.output) == (("S(1)", "S(1)"), "P")     # row split
    forward = {k: v for k, v in plan.comm_bytes().items() if k[2] == "forward"}
    assert forward == {("all_reduce", "tp", "forward"): 8 * 16384 * 4}


def test_13b_gpt_on_two_nodes_is_tensor_parallel_inside_data_parallel_across():
    """A GPT-3-13B-shaped decoder (hidden 5120, 40 heads, 40 layers, ~12.9 B parameters) with
    fp32 Adam needs ~206 GB for parameters, gradients and states: data parallelism alone can't
    hold it in 80 GiB, and the global batch of 8 sequences can't be split 16 ways. Inside a
    node (NVLink), Megatron's activation all-reduces (4 per layer of 4 x 2048 x 5120 x 4 B =
    168 MB per data-parallel rank) cost less than gathering and reducing the layer's 1.26 GB
    of weights (ZeRO-3) or cutting the 4-sequence batch further. Across nodes (InfiniBand, 50
    GB/s) data parallelism all-reduces each rank's eighth of the gradients once (6.5 GB),
    while any split of the activations there would move 335 MB tensors several times in
    each of the 40 layers. Which split each linear takes inside the node (Megatron's column
    and row splits, or a sequence split over weights kept gathered, ZeRO-2) is a matter of a
    percent under the cost model; that the node splits every block's work is not."""
    model, inputs = gpt.build(vocab=50304, seq=2048, hidden=5120, heads=40, layers=40, batch=8,
                              device="meta")
    mesh = autopar.Mesh((2, 8), ("dp", "tp"), hardware="h100-sxm")
    plan = autopar.plan(model, mesh, inputs)
    block = [n for n in linears(plan) if n.module.startswith("layers.")]
    # Every block linear splits its work over tp (the output is split or partial there).
    assert all(n.output.split(",")[1] != "R" for n in block)
    qkv = [n for n in block if n.module.endswith("attn.qkv")]
    assert all((n.inputs[1], n.output) == ("R,S(0)", "S(0),S(2)") for n in qkv)  # Megatron
    attention = [n for n in plan.nodes if "scaled_dot_product" in n.op]
    assert all(n.output == "S(0),S(1)" for n in attention)  # batch over dp, heads over tp
    assert plan.peak_memory_bytes <= mesh.hardware.memory_bytes
