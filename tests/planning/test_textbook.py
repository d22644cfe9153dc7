"""The solver rediscovers the textbook strategies under the h100-sxm profile.

Each case picks sizes where the answer is unambiguous under the cost model, with the
arithmetic in its docstring, and asserts the placements of the linear layers.
"""

import pytest
import torch

import autopar
from autopar.costs import formulas
from examples import gpt, mlp


def linears(plan):
    return [n for n in plan.nodes if n.op == "aten.linear.default"]


def test_large_batch_small_layer_is_data_parallel():
    """Batch 16384 x hidden 512 on 8 GPUs: the activations (16384 x 2048 x 4 B = 128 MiB) dwarf
    the weights (512 x 2048 x 4 B = 4 MiB), so summing weight gradients (data parallel)
    is far cheaper than any split of the activations. The sum is an all-reduce, or a
    reduce-scatter and an all-gather of the stepped pieces (a distributed optimizer: the
    same bytes, and an eighth of the optimizer's step per rank)."""
    model, inputs = mlp.build(batch=16384, hidden=512, ffn=2048, device="meta")
    plan = autopar.plan(model, autopar.Mesh((8,), ("dp",), hardware="h100-sxm"), inputs)
    for node in linears(plan):
        assert node.inputs[0] == "S(0)" and node.inputs[1] == "R" and node.output == "S(0)"
    moved = plan.comm_bytes()
    assert {kind for kind, _, _ in moved} <= {"all_reduce", "reduce_scatter", "all_gather"}
    weights_bytes = 2 * 512 * 2048 * 4
    reduced = sum(b for (kind, _, _), b in moved.items() if kind != "all_gather")
    assert reduced == pytest.approx(weights_bytes, rel=0.01)  # and the biases'
    assert moved.get(("all_gather", "dp", "forward"), 0) in (0, pytest.approx(reduced))


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


def _pinned_data_parallel_mlp(budget: float | None):
    """An MLP (hidden 2048, ffn 8192: 33.6 M parameters) at batch 4096 on 4 GPUs with its
    two linears pinned batch-split, so only the parameters' storage is left to choose."""
    model, inputs = mlp.build(batch=4096, hidden=2048, ffn=8192, device="meta")
    mesh = autopar.Mesh((4,), ("dp",), hardware="h100-sxm")
    pins = {"linear": "S(0)", "linear_1": "S(0)"}
    return autopar.plan(model, mesh, inputs, memory_budget=budget, constraints=pins)


def weights(plan):
    return [n for n in plan.nodes if n.role == "parameter" and n.name.endswith("weight")]


def test_states_that_do_not_fit_replicated_are_sharded_not_the_parameters_use():
    """fp32 AdamW keeps 16 bytes per parameter element replicated (parameter, gradient, two
    moments): 537 MB for 33.6 M elements, plus ~84 MB of activations per GPU and what the
    backward makes (a weight's whole gradient before its reduce-scatter). Under a 450 MB
    budget no weight can stay replicated, so the states must be split. A distributed
    optimizer (ZeRO-2: gradient and states split, the parameter gathered once at its use and
    kept for the backward) holds 4 + 1 + 2 + 1 = 8 bytes per element (268 MB in all) and
    moves a
    forward all-gather and a backward reduce-scatter. ZeRO-3 would hold less but gather
    the weights again for the backward: a third pass of 134 MB over the links for memory
    the budget does not need. With ample memory the plan is the same: the reduce-scatter
    and all-gather move the all-reduce's bytes, and each rank steps a quarter of the
    weights (a distributed optimizer)."""
    sharded = _pinned_data_parallel_mlp(450e6)
    assert sharded.peak_memory_bytes <= 450e6
    # The first weight's gathered copy is never read by the backward (its input needs no
    # gradient), so gathered at use (ZeRO-3) and kept gathered (ZeRO-2) are the same there.
    assert all(w.output in ("S(0)", "S(1)") for w in weights(sharded))
    assert weights(sharded)[1].gathered == "R"
    kinds = {(kind, direction) for kind, _, direction in sharded.comm_bytes()}
    assert ("all_gather", "backward") not in kinds  # no regather (ZeRO-3)
    ample = _pinned_data_parallel_mlp(None)
    assert all(w.output in ("S(0)", "S(1)") for w in weights(ample))
    assert ample.comm_bytes() == sharded.comm_bytes()
    assert ample.step_time_s <= sharded.step_time_s
    assert ample.hidden_comm_s > 0
    quarter = formulas.optimizer_time(2048 * 8192 // 4, 4, 8, ample.mesh.hardware)
    assert weights(ample)[0].optimizer_s == pytest.approx(quarter)


def test_with_micro_batches_states_that_do_not_fit_replicated_are_zero_1():
    """The same MLP as above in 16 micro-batches of 256 under 560 MB. Replicated (16
    bytes per element, 537 MB, and the backward's gradients) still does not fit. ZeRO-1
    keeps a gathered copy and a whole gradient for the step and shards the states (12
    bytes per element in this runtime, which also keeps the shard the optimizer steps:
    403 MB; 531 MB at the backward's peak): it gathers each weight once and reduce-scatters
    its accumulated gradient once per step. ZeRO-2 would gather and reduce-scatter in
    every micro-batch (16x the bytes, more than a micro-batch's compute hides: at 4
    micro-batches of 1024 it hides them, and the plan does so), ZeRO-3 gather twice in
    every micro-batch."""
    model, inputs = mlp.build(batch=4096, hidden=2048, ffn=8192, device="meta")
    mesh = autopar.Mesh((4,), ("dp",), hardware="h100-sxm")
    pins = {"linear": "S(0)", "linear_1": "S(0)"}
    plan = autopar.plan(model, mesh, inputs, memory_budget=560e6, constraints=pins,
                        microbatches=16)
    assert plan.microbatches == 16 and plan.peak_memory_bytes <= 560e6
    assert all(w.whole_gradient and w.gathered == "R" for w in weights(plan))
    totals = plan.comm_bytes()
    weights_bytes = 2 * 2048 * 8192 * 4  # both weights whole: each collective's buffer
    assert totals[("all_gather", "dp", "forward")] == weights_bytes  # once, not 4 times
    assert totals[("reduce_scatter", "dp", "backward")] == weights_bytes


def test_micro_batches_are_chosen_only_where_memory_binds():
    """Micro-batches only trade time (smaller steps, collectives repeated) for activation
    memory. A long-sequence GPT with recomputation off does not fit 4 GPUs at a budget
    below what its activations need in one pass; as "auto", the planner cuts the step
    into micro-batches until it fits. With memory to spare it runs the step whole."""
    model, inputs = _long_sequence_gpt()
    mesh = autopar.Mesh((4,), ("dp",), hardware="h100-sxm")
    with pytest.raises(autopar.InfeasiblePlanError) as whole:
        autopar.plan(model, mesh, inputs, memory_budget=1, recompute=False, microbatches=1)
    budget = 0.7 * whole.value.min_bytes
    plan = autopar.plan(model, mesh, inputs, memory_budget=budget, recompute=False)
    assert plan.microbatches > 1 and plan.peak_memory_bytes <= budget
    assert autopar.plan(model, mesh, inputs, recompute=False).microbatches == 1


def _long_sequence_gpt():
    """A small GPT (hidden 256, 2 layers) on sequences of 8192 tokens: its activations
    (8 x 8192 x 256 x 4 B = 64 MiB per tensor, ~20 kept per layer) dwarf its 1.6 M
    parameters."""
    return gpt.build(batch=8, seq=8192, hidden=256, heads=4, layers=2, vocab=512,
                     device="meta")


def test_long_sequences_whose_activations_do_not_fit_are_recomputed():
    """On 4 GPUs the activations of a long sequence in one micro-batch can't all be kept
    under a budget of 0.8 x the least memory any plan without recomputation needs: the
    solver recomputes some ops in the backward (paying their forward again) rather than
    fail. (Free to choose micro-batches, it runs two instead.)"""
    model, inputs = _long_sequence_gpt()
    mesh = autopar.Mesh((4,), ("dp",), hardware="h100-sxm")
    with pytest.raises(autopar.InfeasiblePlanError) as keeping:
        autopar.plan(model, mesh, inputs, memory_budget=1, recompute=False, microbatches=1)
    budget = 0.8 * keeping.value.min_bytes
    keep_all = autopar.plan(model, mesh, inputs, recompute=False, microbatches=1)
    plan = autopar.plan(model, mesh, inputs, memory_budget=budget, microbatches=1)
    assert plan.peak_memory_bytes <= budget
    assert any(n.recompute for n in plan.nodes)
    assert plan.compute_s > keep_all.compute_s  # the recomputed forward is paid for


def test_a_small_model_with_ample_memory_recomputes_nothing():
    """Recomputation only ever costs time; with memory to spare the plan keeps everything."""
    model, inputs = _long_sequence_gpt()
    plan = autopar.plan(model, autopar.Mesh((4,), ("dp",), hardware="h100-sxm"), inputs)
    assert not any(n.recompute for n in plan.nodes)


@pytest.mark.slow  # about a minute: the plan without a pipeline tries 1-8 micro-batches
def test_a_slow_link_between_nodes_is_pipelined_across():
    """A 0.47 B-parameter GPT in bfloat16 (hidden 2048, 8 layers, 64 x 512 tokens) on 2 nodes
    of 8 H100s joined by 100 Gb/s Ethernet (12.5 GB/s per GPU, `h100-ethernet`), within
    0.4 GiB per GPU: one node can't hold the model and its AdamW state (0.47e9 x 8 B / 8 =
    0.47 GB per GPU, and the backward's gradients), so a plan without a pipeline must use
    the other node for storage or work, and every way to do it moves weights, gradients or
    activations over Ethernet each step (the best found steps 96 ms). A pipeline over the
    nodes keeps each stage's weights, gradients and state inside its node and sends only the
    boundary activations, 64 x 512 x 2048 x 2 B = 134 MB each way, spread over its
    micro-batches (85 ms a step): the planner pipelines. (At 16 sequences both step near
    23 ms, and which is planned is a matter of 1%.)"""
    model, inputs = gpt.build(vocab=32000, seq=512, hidden=2048, heads=16, layers=8, batch=64,
                              device="meta", dtype=torch.bfloat16)
    mesh = autopar.Mesh((2, 8), ("pp", "tp"), hardware="h100-ethernet")
    plan = autopar.plan(model, mesh, inputs, memory_budget=0.4 * 2**30)
    assert plan.pipeline is not None
    assert plan.pipeline.ranks == 2 and plan.pipeline.microbatches >= 2
    pipeline_traffic = {kind for kind, axis, _ in plan.comm_bytes() if axis == "pp"}
    assert pipeline_traffic <= {"send", "broadcast", "all_reduce"}


def test_a_model_that_fits_data_parallel_on_infiniband_is_not_pipelined():
    """A 13 M-parameter GPT (hidden 512, 4 layers) with 64 sequences of 512 tokens on 2 nodes
    of 8 H100s on InfiniBand (50 GB/s per GPU): data parallelism across the nodes all-reduces
    0.05 GB of gradients (2 ms) behind ~10 ms of compute, while a pipeline over the two nodes
    leaves each stage idle for a share (p - 1) / (m + p - 1) of the step: not worth it."""
    model, inputs = gpt.build(vocab=32000, seq=512, hidden=512, heads=8, layers=4, batch=64,
                              device="meta")
    mesh = autopar.Mesh((2, 8), ("pp", "tp"), hardware="h100-sxm")
    plan = autopar.plan(model, mesh, inputs, time_limit=5)
    assert plan.pipeline is None


def _rings(plan) -> dict[str, set[str]]:
    """Per attention node, the mesh axes its ring sends over (empty: no ring)."""
    return {n.name: {t.axis for t in n.transfers if t.kind == "send"}
            for n in plan.nodes if "scaled_dot_product_attention" in n.op}


@pytest.mark.parametrize("seq,batch,ring", [(4096, 32, False), (131072, 1, True)])
def test_context_parallelism_is_chosen_for_long_sequences_only(seq, batch, ring):
    """Llama-3-8B-wide blocks (hidden 4096, 32 query and 8 key/value heads, ffn 14336, two
    layers) in bfloat16 on 8x8 H100s, 131072 tokens a step either way. At 32 sequences of
    4096 the batch splits over dp and the heads over tp: no collective inside attention,
    while a ring over dp would pass each rank's keys and values (32 sequences, 4 of the 32
    heads they are expanded to, 512 positions: 32 x 4 x 512 x 128 x 2 B x 2 = 32 MiB a
    step) over InfiniBand around attention blocks too short to hide them (the cost model:
    21 ms a step without a ring, 64 ms with one).
    At one sequence of 131072 the batch does not split and 32 heads can't fill 64 devices:
    without a ring, attention is replicated over one axis (338 ms a step); on a ring each
    rank attends to an eighth of the sequence, 1/8 of the attention's 4 s^2 h FLOPs hiding
    the blocks' sends (64 ms)."""
    from examples import llama

    model, inputs = llama.build(vocab=32000, seq=seq, hidden=4096, heads=32, kv_heads=8,
                                ffn=14336, layers=2, batch=batch, device="meta",
                                dtype=torch.bfloat16)
    mesh = autopar.Mesh((8, 8), ("dp", "tp"), hardware="h100-sxm")
    plan = autopar.plan(model, mesh, inputs, time_limit=10, microbatches=1)
    rings = _rings(plan)
    assert rings
    assert all(bool(axes) == ring for axes in rings.values()), rings
