"""Plans with dims that do not divide and with pieces sized to the devices (meta device).

- Pieces follow DTensor's chunking, or the mesh's shares (`placement.chunk_sizes`).
- A model whose every dim fails to divide the mesh (an MLP of 4097 and 16385 features on a
  batch of 3, over 4 devices) is split, not replicated: its weights are cut 4097 x3, 4094.
- An odd vocabulary plans within 1% of the even one next to it.
- Textbook: 4 H100s and 4 A100s in one data-parallel group cut the batch close to the
  ratio of their speeds, and the step is predicted at least 1.3x faster than with even
  pieces, under the same cost model.
"""

from __future__ import annotations

import pytest
import torch

import autopar
from autopar.errors import MeshError
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.planning.shares import step_compute
from autopar.values.hardware import load_hardware
from autopar.values.placement import chunk_sizes
from examples import gpt, mlp

MIXED = ["h100-sxm"] * 4 + ["a100-sxm"] * 4


def test_pieces_follow_dtensor_chunking_or_the_shares():
    assert chunk_sizes(50257, 4) == (12565, 12565, 12565, 12562)
    assert chunk_sizes(6, 4) == (2, 2, 2, 0)  # DTensor's: the strategy pass drops it
    assert chunk_sizes(6, 4, (1, 1, 1, 1)) == (2, 2, 1, 1)
    assert chunk_sizes(64, 8, (3, 3, 3, 3, 1, 1, 1, 1)) == (12,) * 4 + (4,) * 4
    assert chunk_sizes(10, 3, (2, 1, 1)) == (5, 3, 2)  # 5, 2.5, 2.5: the first tie first


def test_a_dimension_that_does_not_divide_is_split_where_that_is_cheaper():
    model, inputs = mlp.build(batch=3, hidden=4097, ffn=16385, device="meta")
    mesh = autopar.Mesh((4,), ("tp",), hardware="h100-sxm")
    plan = autopar.plan(model, mesh, inputs, time_limit=10.0)
    alone = autopar.plan(model, autopar.Mesh((1,), ("x",), hardware="h100-sxm"), inputs,
                         time_limit=10.0)
    weights = {n.name: n for n in plan.nodes if n.role == "parameter"}
    assert weights["p_fc1_weight"].pieces == "dim 0: 4097 x3, 4094"
    assert plan.step_time_s < alone.step_time_s / 3
    assert "split unevenly" in autopar.summary(plan)


def test_an_odd_vocabulary_plans_like_an_even_one():
    steps = []
    for vocab in (1000, 1001):
        model, inputs = gpt.build(vocab=vocab, seq=256, hidden=512, heads=8, batch=8,
                                  device="meta")
        alone = autopar.plan(model, autopar.Mesh((1,), ("x",), hardware="h100-sxm"), inputs,
                             time_limit=5.0)
        mesh = autopar.Mesh((4,), ("tp",), hardware="h100-sxm")
        steps.append(autopar.plan(model, mesh, inputs, memory_budget=0.4 * alone.peak_memory_bytes,
                                  time_limit=10.0).step_time_s)
    assert steps[1] <= 1.01 * steps[0]


def test_a_mixed_data_parallel_group_cuts_the_batch_by_speed():
    model, inputs = gpt.build(vocab=8192, seq=1024, hidden=1024, heads=16, layers=4, batch=64,
                              device="meta", dtype=torch.bfloat16)
    planned = {shares: autopar.plan(model, autopar.Mesh((8,), ("dp",), hardware=MIXED,
                                                        shares=shares), inputs, time_limit=10.0)
               for shares in (None, "even")}
    weights = planned[None].mesh.shares[0]
    assert weights[:4] == (weights[0],) * 4 and weights[4:] == (weights[4],) * 4
    gm = annotate(capture(model, inputs))
    speed = (step_compute(gm, load_hardware("a100-sxm"))
             / step_compute(gm, load_hardware("h100-sxm")))
    # The batch of 64 is cut in whole samples: the H100s' share within a sample of it.
    assert weights[0] / weights[4] == pytest.approx(speed, rel=0.25)
    assert [n for n in planned[None].nodes if n.pieces]
    assert planned["even"].step_time_s >= 1.3 * planned[None].step_time_s
    assert "dp pieces 3:3:3:3:1:1:1:1" in planned[None].mesh.describe()


def test_a_mixed_tensor_parallel_group_sizes_its_pieces_by_speed():
    """Two H100s and two A100s in one tensor-parallel group, under a budget that keeps
    no parameter whole: cut by the kinds' speed, the weights' pieces on the H100s are
    about 3x the A100s', and the step beats the even cut (where every device waits for
    the A100s) by 1.3x or more."""
    model, inputs = gpt.build(vocab=8192, seq=1024, hidden=4096, heads=32, layers=4, batch=4,
                              device="meta", dtype=torch.bfloat16)
    alone = autopar.plan(model, autopar.Mesh((1,), ("x",), hardware="h100-sxm"), inputs,
                         time_limit=5.0)
    planned = {shares: autopar.plan(
        model, autopar.Mesh((4,), ("tp",), hardware=MIXED[2:6], shares=shares), inputs,
        memory_budget=0.45 * alone.peak_memory_bytes, time_limit=10.0)
        for shares in (None, "even")}
    weights = planned[None].mesh.shares[0]
    assert weights[0] == weights[1] >= 2.5 * weights[2] and weights[2] == weights[3]
    cut = [n for n in planned[None].nodes if n.role == "parameter" and n.pieces]
    for node in cut:  # "dim 0: 6159 x2, 2033 x2": the H100s' pieces first
        fast, slow = (int(part.split()[0]) for part in node.pieces.split(": ")[1].split(", "))
        assert fast >= 2.5 * slow, node.pieces
    # Tensor parallel: the MLP's weights are used as their pieces, never gathered.
    gathered = {t.tensor for n in planned[None].nodes for t in n.transfers
                if t.kind == "all_gather"}
    assert [n for n in cut if n.name.endswith("fc_weight") and n.name not in gathered]
    assert planned["even"].step_time_s >= 1.3 * planned[None].step_time_s


@pytest.mark.parametrize("shares", [((1, 2),), ((1, 0, 1, 1),), (None, None), "fast"])
def test_bad_shares_are_refused(shares):
    with pytest.raises(MeshError, match="invalid mesh shares") as raised:
        autopar.Mesh((4,), ("dp",), shares=shares)
    assert "fix" in str(raised.value)
