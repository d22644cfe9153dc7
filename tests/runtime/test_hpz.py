"""ZeRO-3 parameters gathered again for the backward from an in-node copy ("hpz", ZeRO++'s
hierarchical partitioning) on gloo ranks.

The MLP of test_compression, stored sharded over a (node, gpu) = 2 x 2 mesh whose node axis
is `h100-ethernet`'s slow link: plain ZeRO-3 gathers fc2's weight (the one weight a linear
saves: fc1's input needs no gradient) over both axes again in the backward; with "hpz" the
forward's gather leaves a copy cut over the gpu axis, and the backward gathers it over that
axis alone. Run on four CPU ranks: the loss and every gradient equal the single-process
model's (hpz is exact), and the bytes moved equal the plan's: the backward's gather across
nodes gone, one over the gpu axis of the whole weight in its place.
"""

from __future__ import annotations

import compression_workers
import pytest
import torch

import autopar
from autopar.runtime.launch import launch
from autopar.runtime.redistribution import Redistribution
from autopar.tools.rounded_reference import gathered_in_int8
from autopar.values.compression import HPZ
from autopar.values.placement import Replicate, Shard, parse_placements

MESH = autopar.Mesh((2, 2), ("node", "gpu"), hardware="h100-ethernet",
                    links=("ethernet", "nvlink"))
ZERO3 = "fully sharded (ZeRO-3)"
WEIGHT = compression_workers.SIZES["hidden"] * compression_workers.SIZES["ffn"] * 4  # fp32


def _plan(compression) -> autopar.Plan:
    model, inputs = compression_workers.build()
    return autopar.plan(model, MESH, inputs, strategy=ZERO3, compression=compression,
                        time_limit=10.0)


@pytest.fixture(scope="module")
def ran():
    plan = _plan(("hpz",))
    return plan, launch(compression_workers.gathered_step, 4, plan.to_dict(), timeout=300.0)


def test_the_saved_weight_is_regathered_from_its_in_node_copy(ran):
    plan, _ = ran
    chosen = {compression_workers.parameter_name(n) for n in plan.nodes
              if n.compression == "hpz"}
    assert "fc2.weight" in chosen
    assert "(hpz)" in " ".join(autopar.summary(plan).split())


def test_loss_and_gradients_equal_the_single_process_model(ran):
    _, results = ran
    expected = results[0]
    for rank, result in enumerate(results):
        assert torch.allclose(result["loss"], expected["expected_loss"], rtol=1e-6), rank
        for name, want in expected["expected"].items():
            got = result["grads"][name]
            assert float((got - want).norm() / want.norm()) <= 1e-6, (rank, name)


def test_bytes_are_the_plans_the_gather_across_nodes_moved_inside(ran):
    plan, results = ran
    for result in results:
        assert result["measured"] == {k: v for k, v in result["predicted"].items() if v}
    exact, hpz = _plan(None).comm_bytes(), plan.comm_bytes()
    node, gpu = ("all_gather", "node", "backward"), ("all_gather", "gpu", "backward")
    # Plain ZeRO-3 gathers the weight's half over the gpu axis, then the whole of it over
    # the node axis; from the copy, the whole of it over the gpu axis alone.
    assert hpz[node] == exact[node] - WEIGHT
    assert hpz[gpu] == exact[gpu] - WEIGHT / 2 + WEIGHT
    assert {k: v for k, v in hpz.items() if k[2] == "forward"} == \
        {k: v for k, v in exact.items() if k[2] == "forward"}


def test_the_copy_is_charged_in_memory_and_the_step_is_faster():
    exact, hpz = _plan(None), _plan(("hpz",))
    # The copy is cut over the gpu axis alone: each rank keeps half the weight for the
    # backward, beside the quarter it stores.
    assert hpz.peak_memory_bytes >= exact.peak_memory_bytes + WEIGHT / 2
    assert hpz.step_time_s < exact.step_time_s


def test_the_edge_keeps_a_copy_over_the_inner_axis_and_gathers_it_there():
    edge = Redistribution.for_edge((1024, 256), torch.float32, (Shard(0), Shard(0)),
                                   (Replicate(), Replicate()), (Replicate(), Replicate()),
                                   (2, 2), regather=True, compression=HPZ)
    assert edge.regather_from == (Replicate(), Shard(0))
    assert [s.kind for s in edge.keep_steps if s.kind] == []
    assert [(s.kind, s.axis) for s in edge.regather_steps if s.kind] == [("all_gather", 1)]
    plain = Redistribution.for_edge((1024, 256), torch.float32, (Shard(0), Shard(0)),
                                    (Replicate(), Replicate()), (Replicate(), Replicate()),
                                    (2, 2), regather=True)
    assert plain.regather_from is None
    assert sorted((t.kind, t.axis) for t in plain.backward if t.kind == "all_gather") == \
        [("all_gather", 0), ("all_gather", 1)]
    assert [(t.kind, t.axis, t.nbytes) for t in edge.backward if t.kind == "all_gather"] == \
        [("all_gather", 1, 1024 * 256 * 4)]


@pytest.fixture(scope="module")
def with_int8():
    plan = _plan(("int8-gather", "hpz"))
    return plan, launch(compression_workers.gathered_step, 4, plan.to_dict(), timeout=300.0)


def test_int8_gathers_with_the_copy_train_as_the_twice_rounded_weights_do(with_int8):
    # ZeRO++'s qwZ with its hpZ: the forward gathers int8 over each axis in turn (the node
    # axis rounds again what the gpu axis made); the backward gathers the copy, cut from
    # the dequantized weight, whole over the gpu axis.
    plan, results = with_int8
    chosen = {compression_workers.parameter_name(n): n.compression for n in plan.nodes}
    assert chosen["fc2.weight"] == "int8-gather+hpz"
    expected = results[0]
    for rank, result in enumerate(results):
        assert result["measured"] == {k: v for k, v in result["predicted"].items() if v}
        assert torch.allclose(result["loss"], expected["expected_loss"], rtol=1e-6), rank
        for name, want in expected["expected"].items():
            got = result["grads"][name]
            assert float((got - want).norm() / want.norm()) <= 1e-6, (rank, name)
    int8 = _plan(("int8-gather",)).comm_bytes()
    node, gpu = ("all_gather", "node", "backward"), ("all_gather", "gpu", "backward")
    assert plan.comm_bytes()[node] < int8[node]
    assert plan.comm_bytes()[gpu] > int8[gpu] + WEIGHT / 2  # the whole weight, not int8


@pytest.mark.parametrize("stored", ["S(0),S(0)", "S(1),S(0)"])
def test_the_reference_rounds_as_the_int8_gathers_over_two_axes_do(stored):
    # Rows of 300 and pieces of 3 x 150: the second gather's blocks straddle the first's,
    # so it rounds their values again.
    received = launch(compression_workers.int8_gathered, 4, (6, 300), stored, timeout=120.0)
    weight = torch.randn((6, 300), generator=torch.Generator().manual_seed(0))
    expected = gathered_in_int8(weight, parse_placements(stored), (2, 2))
    assert not torch.equal(expected, weight)
    for got in received:
        assert torch.equal(got, expected)
