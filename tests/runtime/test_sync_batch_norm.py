"""Batch norm in training mode with its batch split: every rank normalises with the whole
batch's statistics (SyncBatchNorm's semantics, from the all-reduce of the statistics' sums
the plan inserts), so loss, every gradient and the running statistics equal the plain
model's at every step, on real gloo processes."""

from __future__ import annotations

import batch_norm_workers
import pytest

import autopar
from autopar.runtime.launch import launch

MESHES = {"dp2": ((2,), ("dp",)), "dp2x2": ((2, 2), ("dp", "dp2"))}


def _statistics_over_the_split_batch(shape: tuple[int, ...], names: tuple[str, ...]) -> dict:
    """Constraints: the first convolution splits the batch over every axis and each norm's
    statistics (the sums of its decomposition) stay partial sums, all-reduced where they are
    used. Left alone, the cost model prefers splitting channels, which needs no statistics
    exchange at all; this pins the path SyncBatchNorm takes."""
    model, inputs = batch_norm_workers.build()
    free = autopar.plan(model, autopar.Mesh(shape, names, hardware="cpu"), inputs,
                        time_limit=5)
    sums = [node.name for node in free.nodes
            if node.op == "aten.sum.dim_IntList" and node.module.startswith("norm")]
    assert len(sums) == 6, sums  # Σx and Σ(x-mean)² of each of the three norms
    every_axis = ",".join(["S(0)"] * len(shape))
    return {"conv2d": every_axis, **{name: ",".join(["P"] * len(shape)) for name in sums}}


def _statistics_reduced(plan: autopar.Plan, constraints: dict) -> set[str]:
    """The mesh axes over which the forward sums the statistics' partial sums (an
    all-reduce, or a reduce-scatter when the solver keeps the channels split after)."""
    return {transfer.axis for node in plan.nodes for transfer in node.transfers
            if transfer.tensor in constraints and not transfer.backward
            and transfer.kind in ("all_reduce", "reduce_scatter")}


@pytest.mark.parametrize("mesh", MESHES, ids=list(MESHES))
def test_split_batch_trains_as_one_process(mesh):
    shape, names = MESHES[mesh]
    constraints = _statistics_over_the_split_batch(shape, names)
    model, inputs = batch_norm_workers.build()
    plan = autopar.plan(model, autopar.Mesh(shape, names, hardware="cpu"), inputs,
                        constraints=constraints, time_limit=5)
    assert _statistics_reduced(plan, constraints) == set(names), plan.comm_bytes()
    size = 1
    for extent in shape:
        size *= extent
    results = launch(batch_norm_workers.train, size, shape, names, constraints)
    steps = results[0][0]
    assert len(steps) == batch_norm_workers.STEPS
    for step in steps:
        assert batch_norm_workers.TOLERANCE.excess(
            abs(step.loss - step.reference_loss), abs(step.reference_loss)) <= 1, step
        assert step.gradient_excess <= 1, step
        assert step.buffer_excess <= 1, step
    for _, measured, predicted in results:
        assert measured == predicted
