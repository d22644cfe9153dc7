"""Forward-only plans (`training=False`) serve exactly like the single-process model.

Hugging Face models as they serve (`inference_models`: Llama, Qwen2, Mixtral, BERT, ViT,
each returning its logits) are compiled with `training=False` on gloo meshes (2,), (4,),
(2, 2), and (2, 2) pipelined over its first axis (two stages of one layer each), each
under a memory budget below the weights' own bytes, so that no plan keeping them whole
fits and they must shard: the one-device plan's peak less a quarter of the weights' bytes
(half would leave two devices nothing for the weights' gathered copies and the whole
logits every rank returns).
Every rank's outputs equal the plain model's in eval mode within `TOLERANCE`, carry no
autograd graph, and the bytes each rank's collectives moved equal the plan's prediction
(all of it forward: the plan has no backward).
"""

from __future__ import annotations

from dataclasses import dataclass

import hf_models
import inference_models
import pytest
import torch
from torch.distributed.tensor import DTensor

import autopar
from autopar.runtime.launch import launch

NAMES = tuple(inference_models.MODELS)
# "2x2pp": pipelined over pp, its last stage's outputs broadcast to the other stage's ranks.
MESHES = {"2": ((2,), ("tp",)), "4": ((4,), ("tp",)), "2x2": ((2, 2), ("dp", "tp")),
          "2x2pp": ((2, 2), ("pp", "tp"))}
# Absolute, on logits of order one: a split computation rounds about 1e-7 differently.
TOLERANCE = 1e-5


@dataclass(frozen=True)
class Served:
    """What one rank saw of one model: its outputs' largest difference from the plain
    model's, whether they need a gradient, the bytes measured and predicted, the plan."""

    error: float
    requires_grad: bool
    measured: dict
    predicted: dict
    plan: dict


def budgets() -> dict[str, float]:
    """Per model: the one-device forward-only plan's peak less a quarter of the weights'
    bytes."""
    chosen = {}
    for name in NAMES:
        model, inputs = inference_models.build(name)
        whole = autopar.plan(model, autopar.Mesh((1,), ("x",), hardware="cpu"), inputs,
                             training=False)
        chosen[name] = whole.peak_memory_bytes - inference_models.weight_bytes(model) / 4
    return chosen


def serve_all(rank: int, chosen: dict[str, float], shape: tuple[int, ...],
              names: tuple[str, ...]) -> list[Served]:
    mesh = autopar.Mesh(shape, names, hardware="cpu")
    served = []
    for name, budget in chosen.items():
        model, inputs = inference_models.build(name)
        pm = autopar.compile(model, mesh, inputs, training=False, memory_budget=budget,
                             time_limit=3.0,
                             pipeline=autopar.Pipeline() if "pp" in names else False)
        out = pm(*inputs)
        model.eval()
        with torch.no_grad():
            expected = model(*inputs)
        served.append(Served(float((out - expected).abs().max()), out.requires_grad,
                             dict(pm.counter.totals()),
                             pm.plan.rank_comm_bytes(tuple(pm.coordinate)),
                             pm.plan.to_dict()))
    return served


@pytest.fixture(scope="module", params=tuple(MESHES))
def outcomes(request):
    shape, names = MESHES[request.param]
    chosen = budgets()
    count = 1
    for size in shape:
        count *= size
    return chosen, launch(serve_all, count, chosen, shape, names, timeout=900.0)


def test_the_budgets_leave_no_room_for_whole_weights():
    chosen = budgets()
    for name in NAMES:
        model, _ = inference_models.build(name)
        assert chosen[name] < inference_models.weight_bytes(model), name


def test_mixtral_routes_by_a_clear_margin():
    # Otherwise a rounding difference could route a token elsewhere on some rank.
    assert hf_models.routing_margin(*inference_models.build("mixtral")) > 1e-4


def test_outputs_match_the_single_process_model(outcomes):
    _, results = outcomes
    for rank, served in enumerate(results):
        for name, one in zip(NAMES, served):
            assert one.error <= TOLERANCE, (rank, name, one.error)
            assert not one.requires_grad, (rank, name)


def test_the_plans_shard_the_weights_and_have_no_backward(outcomes):
    _, results = outcomes
    for name, one in zip(NAMES, results[0]):
        plan = autopar.Plan.from_dict(one.plan)
        assert not plan.training, name
        assert (plan.pipeline is not None) == ("pp" in plan.mesh.axis_names), name
        # A pipeline's stages hold the weights of their own layers.
        assert plan.pipeline is not None or [
            n for n in plan.nodes if n.role == "parameter" and "S(" in n.output], name
        assert all(direction == "forward" for _, _, direction in plan.comm_bytes()), name
        assert plan.optimizer_s == 0.0, name


def test_measured_bytes_equal_the_plan_exactly(outcomes):
    _, results = outcomes
    for rank, served in enumerate(results):
        for name, one in zip(NAMES, served):
            assert one.measured == one.predicted, (rank, name)


@dataclass(frozen=True)
class ShardedServed:
    """One rank's Llama compiled with `outputs="sharded"`: whether it returned a DTensor,
    its placements, the whole's largest difference from the plain model's, the bytes
    measured and predicted, and the bytes the same model's whole-output plan predicts."""

    is_dtensor: bool
    placements: str
    error: float
    measured: dict
    predicted: dict
    whole_plan_bytes: float


def serve_sharded(rank: int, budget: float) -> ShardedServed:
    mesh = autopar.Mesh((2,), ("tp",), hardware="cpu")
    model, inputs = inference_models.build("llama")
    pm = autopar.compile(model, mesh, inputs, training=False, outputs="sharded",
                         memory_budget=budget, time_limit=3.0)
    out = pm(*inputs)
    whole = autopar.plan(model, mesh, inputs, training=False, memory_budget=budget,
                         time_limit=3.0)
    model.eval()
    with torch.no_grad():
        expected = model(*inputs)
    is_dtensor = isinstance(out, DTensor)
    full = out.full_tensor() if is_dtensor else out
    return ShardedServed(is_dtensor, str(getattr(out, "placements", "")),
                         float((full - expected).abs().max()), dict(pm.counter.totals()),
                         pm.plan.comm_bytes(), sum(whole.comm_bytes().values()))


def test_outputs_left_sharded_come_back_as_dtensors_of_the_same_values():
    budget = budgets()["llama"]
    for rank, one in enumerate(launch(serve_sharded, 2, budget, timeout=600.0)):
        assert one.is_dtensor and "Shard" in one.placements, (rank, one.placements)
        assert one.error <= TOLERANCE, (rank, one.error)
        assert one.measured == one.predicted, rank
        # Nothing gathers the logits whole: fewer bytes than the plan that returns them so.
        assert sum(one.predicted.values()) < one.whole_plan_bytes, rank


def serve_in_micro_batches(rank: int) -> tuple[float, dict, dict, int]:
    """ViT pipelined over pp in 2 micro-batches: this rank's largest difference from the
    plain model, bytes measured and predicted, and the plan's micro-batches."""
    mesh = autopar.Mesh((2, 2), ("pp", "tp"), hardware="cpu")
    model, inputs = inference_models.build("vit")
    pm = autopar.compile(model, mesh, inputs, training=False,
                         pipeline=autopar.Pipeline(microbatches=2), time_limit=3.0)
    out = pm(*inputs)
    model.eval()
    with torch.no_grad():
        expected = model(*inputs)
    return (float((out - expected).abs().max()), dict(pm.counter.totals()),
            pm.plan.rank_comm_bytes(tuple(pm.coordinate)), pm.plan.pipeline.microbatches)


def test_a_forward_pipelined_in_micro_batches_returns_the_whole_batch_s_outputs():
    # ViT's 197 tokens split over tp are 99 and 98: the plan's bytes are those of the ranks
    # at tp index 0, which hold the longer pieces; the others move no more.
    for rank, (error, measured, predicted, count) in enumerate(
            launch(serve_in_micro_batches, 4, timeout=600.0)):
        assert count == 2 and error <= TOLERANCE, (rank, error)
        if rank % 2 == 0:
            assert measured == predicted, rank
        else:
            assert measured.keys() == predicted.keys(), rank
            assert all(measured[key] <= predicted[key] for key in measured), rank

