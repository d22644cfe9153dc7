"""Gradients reduced in bfloat16 ("bf16-reduce") and parameters gathered in int8
("int8-gather") on gloo ranks, and compression's bad input.

An MLP of 256 and 1024 features is planned on a mesh of two data-parallel devices over the
slow link of `h100-ethernet` (where halving the gradients' bytes pays) as data parallelism
(gradients all-reduced) and as ZeRO-3 (gradients reduce-scattered), the solver allowed to
compress. Run on two CPU ranks (the numerics do not depend on the profile), one step's
gradients equal, within 1e-6 relative, those of the single-process model computed with the
same rounding (`compression_workers.rounded_reference`), and the bytes moved equal the
plan's: the gradients' half of what fp32 moves. Planned as ZeRO-3 with int8 gathers, the
loss and gradients equal those of the single-process model whose weights are rounded as
each rank's piece is (`compression_workers.quantized_weights`), and the gathers move a
quarter of the weights' bytes plus one fp32 scale per block.
"""

from __future__ import annotations

import math

import compression_workers
import pytest
import torch

import autopar
from autopar.errors import AutoparError, PlanFormatError, PlanningError
from autopar.runtime.launch import launch
from autopar.runtime.redistribution import Redistribution
from autopar.values.compression import INT8_GATHER, QUANT_BLOCK
from autopar.values.placement import Replicate, Shard

MESH = autopar.Mesh((2,), ("dp",), hardware="h100-ethernet", links=("ethernet",))
STRATEGIES = ("data parallel", "fully sharded (ZeRO-3)")


def _plan(strategy: str, compression) -> autopar.Plan:
    model, inputs = compression_workers.build()
    return autopar.plan(model, MESH, inputs, strategy=strategy, compression=compression,
                        time_limit=10.0)


@pytest.fixture(scope="module", params=STRATEGIES)
def ran(request):
    plan = _plan(request.param, ("bf16-reduce",))
    return plan, launch(compression_workers.compressed_step, 2, plan.to_dict(), timeout=300.0)


def _compressed(plan: autopar.Plan) -> set[str]:
    return {compression_workers.parameter_name(n) for n in plan.nodes if n.compression}


def test_the_plan_compresses_weights_not_biases(ran):
    # A bias's 4 KiB saves less than its two casts cost: the solver leaves it exact. (A
    # reduction the backward hides gains nothing either: ZeRO-3 may leave a weight exact.)
    plan, _ = ran
    compressed = _compressed(plan)
    assert compressed and compressed <= {"fc1.weight", "fc2.weight"}
    assert "parameters' gradient reductions in bfloat16 (bf16-reduce)" in " ".join(
        autopar.summary(plan).split())


def test_gradients_equal_the_single_process_ones_with_the_same_rounding(ran):
    _, results = ran
    expected = results[0]["expected"]
    for rank, result in enumerate(results):
        for name, want in expected.items():
            got = result["grads"][name]
            error = float((got - want).norm() / want.norm())
            assert error <= 1e-6, (rank, name, error)


def test_bytes_moved_are_the_plans_the_weights_gradients_halved(ran):
    plan, results = ran
    for result in results:
        assert result["measured"] == {k: v for k, v in result["predicted"].items() if v}
    exact = _plan(plan.hand_strategies[0].name, None).comm_bytes()
    weights = len(_compressed(plan)) * compression_workers.SIZES["hidden"] \
        * compression_workers.SIZES["ffn"]
    reduced = [key for key in exact if key[2] == "backward"
               and key[0] in ("all_reduce", "reduce_scatter")]
    assert len(reduced) == 1  # one reduction: the gradients' (an fp32 element: 4 bytes)
    assert plan.comm_bytes()[reduced[0]] == exact[reduced[0]] - weights * 4 / 2


@pytest.fixture(scope="module")
def gathered():
    plan = _plan("fully sharded (ZeRO-3)", ("int8-gather",))
    return plan, launch(compression_workers.gathered_step, 2, plan.to_dict(), timeout=300.0)


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


def test_int8_gathers_train_as_the_rounded_weights_do(gathered):
    plan, results = gathered
    assert {n.compression for n in plan.nodes if n.role == "parameter"} >= {"int8-gather"}
    expected = results[0]
    for rank, result in enumerate(results):
        assert _relative(result["loss"], expected["expected_loss"]) <= 1e-6, rank
        for name, want in expected["expected"].items():
            assert _relative(result["grads"][name], want) <= 1e-6, (rank, name)


def test_int8_gathers_move_a_quarter_plus_the_scales(gathered):
    plan, results = gathered
    for result in results:
        assert result["measured"] == {k: v for k, v in result["predicted"].items() if v}
    exact = _plan("fully sharded (ZeRO-3)", None).comm_bytes()
    saved = []  # per compressed parameter, what one gather of it saves
    for node in plan.nodes:
        if node.compression == "int8-gather":
            whole = math.prod(compression_workers.shape_of(node))
            piece = whole // 2  # a rank's piece, its blocks' scales gathered beside it
            saved.append(whole * 4 - (whole + 2 * 4 * math.ceil(piece / QUANT_BLOCK)))
    key = ("all_gather", "dp", "forward")
    assert plan.comm_bytes()[key] == exact[key] - sum(saved)
    # The backward gathers again (ZeRO-3) the weights a linear saves: fc2's, not fc1's,
    # whose input needs no gradient. Both weights are the same size.
    key = ("all_gather", "dp", "backward")
    assert plan.comm_bytes()[key] == exact[key] - saved[0] > 0


@pytest.mark.parametrize(("compression", "match"), [
    ("zip", "unknown compression 'zip'"),
    (("bf16-reduce", "int4-gather"), "unknown compression 'int4-gather'"),
    (3, "must be None, 'auto' or a tuple of names"),
    ("powersgd-0", "PowerSGD's rank must be at least 1"),
    (("powersgd-512",), "rank 512 is larger than every matrix"),
])
def test_bad_compressions_are_refused_before_planning(compression, match):
    model, inputs = compression_workers.build()
    with pytest.raises(PlanningError, match=match) as raised:
        autopar.plan(model, MESH, inputs, compression=compression)
    assert "fix" in str(raised.value)


def test_int8_gathers_of_an_integer_tensor_are_refused():
    with pytest.raises(AutoparError, match="int8-gather compresses floating-point"):
        Redistribution.for_edge((8, 4), torch.int64, (Shard(0),), (Replicate(),),
                                (Replicate(),), (2,), compression=INT8_GATHER)


def test_a_plan_naming_an_unknown_compression_is_refused(gathered):
    plan, _ = gathered
    data = plan.to_dict()
    for node in data["nodes"]:
        if node["compression"]:
            node["compression"] = "int3-gather"
    with pytest.raises(PlanFormatError, match="unknown compression 'int3-gather'"):
        autopar.Plan.from_dict(data)
