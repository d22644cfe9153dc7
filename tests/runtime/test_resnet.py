"""A ResNet-style CNN (convolutions, GroupNorm, residuals, spatial mean) trains exactly like
the single-process model on meshes (2,) and (2, 2) over gloo.

Each mesh gets a memory budget below the replicated plan's peak, so the solver must shard;
on (2,) the plan also pins a convolution to the output-channel split and the next one to
the input-channel split (its output a summand), so both tensor-parallel paths of the
convolution rule run whatever the solver prefers. The checks are those of
`test_equivalence`: loss and every gradient within 1e-5 for 3 AdamW steps, sharded plans,
and collective bytes equal to the plan's prediction.

The model trains in float64. In float32 the GroupNorm gradients of this small CNN already
differ by about 1e-6 relative on the first step when the ranks' sums are reordered (ten
times what the transformers show), and AdamW's tenfold growth per step takes that to the
tolerance by the second step. In float64 the same plans agree to about 1e-14, so a wrong
collective (1e-2 or more) still stands out by orders of magnitude.
"""

from __future__ import annotations

import functools

import pytest
import torch
from equivalence_cases import (
    Case,
    check_bytes,
    check_equivalence,
    check_sharded,
    replicated_peak,
    train_all,
)

import autopar
from autopar.runtime.launch import launch

EXAMPLE = "examples.resnet"
# Two stages (one with a projection shortcut) keep planning on every rank short.
BUILD = (("widths", (8, 16)), ("dtype", torch.float64))
MESHES = {(2,): ("x",), (2, 2): ("dp", "tp")}
BUDGETS = {(2,): 0.6, (2, 2): 0.4}  # fractions of the replicated plan's peak memory
# layers.0.conv1 (conv2d_1) splits its output channels; layers.0.conv2 (conv2d_2) takes its
# input split on channels (relu_1) and yields a summand.
CHANNEL_SPLITS = (("conv2d_1", "S(1)"), ("relu_1", "S(1)"), ("conv2d_2", "P"))


@functools.cache
def peak() -> float:
    return replicated_peak(Case(EXAMPLE, BUILD))


def cases(shape: tuple[int, ...]) -> tuple[Case, ...]:
    pinned = CHANNEL_SPLITS if shape == (2,) else ()
    return (Case(EXAMPLE, BUILD, memory_budget=BUDGETS[shape] * peak(), constraints=pinned),)


@pytest.fixture(scope="module", params=list(MESHES), ids=lambda s: "x".join(map(str, s)))
def outcomes(request):
    shape = request.param
    chosen = cases(shape)
    nprocs = 1
    for n in shape:
        nprocs *= n
    results = launch(train_all, nprocs, chosen, shape, MESHES[shape], timeout=600.0)
    return shape, chosen, results


def test_loss_and_every_gradient_match_the_single_process_model(outcomes):
    _, chosen, results = outcomes
    check_equivalence(chosen, results)


def test_the_plans_shard_and_communicate(outcomes):
    _, chosen, results = outcomes
    check_sharded(chosen, results)


def test_measured_bytes_equal_the_plan_exactly(outcomes):
    _, chosen, results = outcomes
    check_bytes(chosen, results)


def test_pinned_convolutions_split_their_channels(outcomes):
    shape, _, results = outcomes
    if shape != (2,):
        pytest.skip("pinned on mesh (2,) only")
    plan = autopar.Plan.from_dict(results[0][0].plan)
    nodes = {n.name: n for n in plan.nodes}
    assert (nodes["conv2d_1"].inputs, nodes["conv2d_1"].output) == (("R", "S(0)"), "S(1)")
    assert (nodes["conv2d_2"].inputs, nodes["conv2d_2"].output) == (("S(1)", "S(1)"), "P")
