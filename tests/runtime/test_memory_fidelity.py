"""The memory a plan predicts per device against what the ranks hold (2x2 mesh, 4 gloo ranks,
one launch).

Each case compiles an example under a budget that forces sharding (MLP: tensor and data
parallel; GPT: sharded storage and recomputation; ResNet: ZeRO-2, kept gathered, and
recomputation), trains one AdamW step and measures (`autopar.runtime.memory_probe`):

- parameter pieces, the gradient tensors and the optimizer's parameter-shaped states
  equal `autopar.tools.predicted_memory.predicted_memory` exactly, on every rank;
- the storages autograd holds at the end of the forward for the backward, parameters and
  their kept-gathered copies aside, are within 10% of the predicted kept activations.

Where the model or the runtime is known to be off, the check is an xfail(strict=True) that
states the measured gap: it fails, prompting its removal, once the gap is closed.
"""

from __future__ import annotations

import pytest
from memory_workers import MemoryCase, measure_cases

import autopar
from autopar.runtime.launch import launch

# Peak memory per device of the plan that keeps each example whole on one device (CPU
# profile, default configs), measured with `autopar.plan(..., Mesh((1,)))`: budgets below
# it force sharding. Hard-coded to save three solves; `test_the_plans_shard` fails if a
# changed model makes a budget stop forcing what the case is for.
REPLICATED_PEAK = {"mlp": 144904.0, "gpt": 2610252.0, "resnet": 620724.0}
CASES = (
    MemoryCase("examples.mlp", memory_budget=0.3 * REPLICATED_PEAK["mlp"]),
    MemoryCase("examples.gpt", memory_budget=0.3 * REPLICATED_PEAK["gpt"]),
    MemoryCase("examples.resnet", memory_budget=0.6 * REPLICATED_PEAK["resnet"]),
)
ACTIVATION_TOLERANCE = 0.10


@pytest.fixture(scope="module")
def measured():
    return launch(measure_cases, 4, CASES, (2, 2), ("dp", "tp"), timeout=300.0)


def _case(measured, example: str):
    index = next(i for i, c in enumerate(CASES) if c.example == f"examples.{example}")
    return [per_rank[index] for per_rank in measured]


def test_the_plans_shard(measured):
    """What each case is for: every plan splits parameters; GPT's recomputes; ResNet's keeps
    a parameter gathered (ZeRO-2)."""
    for case, first in zip(CASES, measured[0]):
        plan = autopar.Plan.from_dict(first.plan)
        assert any(n.role == "parameter" and "S(" in n.output for n in plan.nodes), case
    gpt = autopar.Plan.from_dict(_case(measured, "gpt")[0].plan)
    assert any(n.recompute for n in gpt.nodes)
    resnet = autopar.Plan.from_dict(_case(measured, "resnet")[0].plan)
    assert any(n.gathered for n in resnet.nodes)
    assert _case(measured, "resnet")[0].predicted.gathered > 0


@pytest.mark.parametrize("example", ["mlp", "gpt", "resnet"])
def test_state_bytes_equal_the_prediction_exactly(measured, example):
    results = _case(measured, example)
    predicted = results[0].predicted
    for rank, result in enumerate(results):
        state = result.state
        assert state.parameters == predicted.parameters, (example, rank)
        assert state.gradients == predicted.gradients, (example, rank)
        assert state.optimizer_states == predicted.optimizer_states, (example, rank)
        assert state.buffers == predicted.buffers, (example, rank)


def test_kept_gathered_copies_equal_the_prediction(measured):
    """ResNet's ZeRO-2 parameters: the gathered copies their consumers save are the bytes
    the plan charges for them."""
    results = _case(measured, "resnet")
    for rank, result in enumerate(results):
        assert result.saved.gathered == results[0].predicted.gathered, rank


@pytest.mark.parametrize("example", [
    # The runtime keeps the gradient of a kept-gathered (ZeRO-2) parameter as a view of the
    # full gradient its backward built: measured 79,816 B of gradient storage against
    # 38,344 B of gradients (the two gathered conv weights hold 18,432 and 36,864 B for
    # 4,608 and 9,216 B of gradient). MLP and GPT: bias gradients that are views of full
    # ones (+96 B and +384 B).
    pytest.param("resnet", marks=pytest.mark.xfail(strict=True, reason="ZeRO-2 gradients "
                                                   "held as views of full gradients")),
    pytest.param("gpt", marks=pytest.mark.xfail(strict=True, reason="bias gradients held as "
                                                "views of full gradients")),
    pytest.param("mlp", marks=pytest.mark.xfail(strict=True, reason="bias gradients held as "
                                                "views of full gradients")),
])
def test_gradient_storages_are_the_gradients(measured, example):
    """A gradient holds no more memory than itself (no view into a larger buffer)."""
    results = _case(measured, example)
    for rank, result in enumerate(results):
        assert result.state.gradient_storages == results[0].predicted.gradients, rank


@pytest.mark.parametrize("example", [
    "mlp",
    "resnet",
    # Measured 258,572 B held against 165,890 B predicted (+56%). The plan charges each kept
    # op's output at the op's own placement, but what autograd holds differs: collective
    # outputs saved by their consumer (an all-reduced or all-gathered copy, e.g. add__R_R,
    # linear__S0_R) are charged nowhere; charging them needs memory per edge in the solve.
    pytest.param("gpt", marks=pytest.mark.xfail(strict=True, reason="+56% activations "
                                                "held: copies made by collectives")),
])
def test_activation_bytes_within_ten_percent(measured, example):
    results = _case(measured, example)
    predicted = results[0].predicted.activations
    for rank, result in enumerate(results):
        held = result.saved.activations
        assert abs(held - predicted) <= ACTIVATION_TOLERANCE * predicted, (rank, held,
                                                                           predicted)
