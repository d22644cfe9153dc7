"""Checkpoints: training saved under one plan resumes under another exactly as it would
have gone on, and a checkpoint that can't be loaded says why.

A run trains `STEPS` AdamW steps on a (dp, tp) = 2x2 mesh under a budget that shards its
state, saves, and trains `STEPS` more (the uninterrupted run). The checkpoint is then
loaded, into a model initialised otherwise, under other plans: on 4 ranks, on 2, on 1, and
on the same 2x2 plan, each training `STEPS` steps. Resumed on the same plan the losses
and parameters are the uninterrupted run's bit for bit (parameters, AdamW's moments and
step count all restored); on another plan, the losses within `RELATIVE` and the
parameters within `RELATIVE` of the model's norm, each tensor within `PER_TENSOR` of its
own (the plans sum in other orders; a tensor whose gradient is zero but for rounding, a
key projection's bias, takes AdamW steps on that rounding). Pipelined plans save and load
the same way, each pipeline rank its stages.
"""

from __future__ import annotations

import importlib

import checkpoint_workers as workers
import pytest
import torch
from checkpoint_workers import Layout

import autopar
from autopar.errors import CheckpointError
from autopar.runtime.launch import launch
from autopar.tools import checkpoint

RELATIVE = 1e-6
PER_TENSOR = 1e-5
SOURCE = {"gpt": Layout((2, 2), ("dp", "tp"), budget=0.5),
          "llama": Layout((2, 2), ("dp", "tp"), budget=0.5),
          "moe": Layout((2, 2), ("dp", "tp"), budget=0.8)}

def _targets(source: Layout) -> tuple[Layout, ...]:
    """The same plan, 4 ranks sharding as much, 2 ranks, one."""
    return (source, Layout((4,), ("dp",), budget=source.budget), Layout((2,), ("dp",)),
            Layout((1,), ("dp",)))
PIPELINED = Layout((2, 2), ("pp", "tp"),
                   pipeline=autopar.Pipeline(schedule="1F1B", microbatches=4))


def _close(state: dict, reference: dict) -> bool:
    """Within `RELATIVE` of the whole model's norm, each tensor within `PER_TENSOR`."""
    names = [k for k in reference if reference[k].is_floating_point()]
    error = sum(float((state[k] - reference[k]).norm()) ** 2 for k in names) ** 0.5
    norm = sum(float(reference[k].norm()) ** 2 for k in names) ** 0.5
    worst = max(float((state[k] - reference[k]).norm() / reference[k].norm().clamp_min(1e-30))
                for k in names)
    return error <= RELATIVE * norm and worst <= PER_TENSOR


def _resumed(example: str, source: Layout, targets, tmp_path):
    path = str(tmp_path / example)
    plan = workers.plan_for(example, source)
    losses, state = launch(workers.run_and_save, source.ranks, example, source, plan, path)[0]
    for target in targets:
        resumed = launch(workers.load_and_run, target.ranks, example, target,
                         workers.plan_for(example, target), path)[0]
        yield target, (losses, state), resumed


@pytest.mark.slow
@pytest.mark.parametrize("example", ["gpt", "llama", "moe"])
def test_a_run_resumes_under_another_plan_as_it_would_have_gone_on(example, tmp_path):
    source = SOURCE[example]
    for target, (losses, state), (after, resumed, step) in _resumed(
            example, source, _targets(source), tmp_path):
        assert step == workers.STEPS
        if target == source:
            assert after == losses[workers.STEPS:], target
            assert all(torch.equal(resumed[k], state[k]) for k in state), target
            continue
        for a, b in zip(after, losses[workers.STEPS:]):
            assert abs(a - b) <= RELATIVE * abs(b), (target, after, losses)
        assert _close(resumed, state), target


@pytest.mark.parametrize("shares", [None, ((3, 3, 1, 1),)], ids=["chunks", "shares"])
def test_uneven_pieces_save_and_resume_bit_for_bit(shares, tmp_path):
    """DCP writes and reads the pieces as DTensors cut by DTensor's chunking, or where the
    shares cut them (130 rows: 49, 49, 16, 16) at their own offsets, then asynchronously.
    Loaded whole into one process, each piece lands where the plan placed it."""
    path = str(tmp_path / "uneven")
    after, resumed, state, loaded, saved = launch(workers.uneven_round_trip, 4, path, shares,
                                                  shares is not None)[0]
    assert resumed == after
    assert all(torch.equal(loaded[k], state[k]) for k in state)
    plain, _ = importlib.import_module("examples.mlp").build(hidden=66, ffn=130, seed=2)
    checkpoint.load_full(path, plain)
    assert all(torch.equal(plain.state_dict()[k], saved[k]) for k in saved)
    pieces = [n.pieces for n in autopar.Plan.from_dict(checkpoint.info(path).plan).nodes
              if n.name.endswith("fc1_weight")]
    assert pieces == ["dim 0: 33 x3, 31" if shares is None else "dim 0: 49 x2, 16 x2"]


def test_an_asynchronous_save_holds_the_state_it_was_called_with(tmp_path):
    """The training steps on while the pieces are written: the checkpoint is the state at
    the call, resumed bit for bit."""
    layout, path = SOURCE["gpt"], str(tmp_path / "async")
    plan = workers.plan_for("gpt", layout)
    losses, state = launch(workers.run_and_save, layout.ranks, "gpt", layout, plan, path,
                           True)[0]
    after, resumed, step = launch(workers.load_and_run, layout.ranks, "gpt", layout, plan,
                                  path)[0]
    assert step == workers.STEPS and after == losses[workers.STEPS:]
    assert all(torch.equal(resumed[k], state[k]) for k in state)


@pytest.mark.slow
def test_a_pipelined_run_saves_and_resumes_on_a_mesh_without_pipeline(tmp_path):
    for target, (losses, state), (after, resumed, _) in _resumed(
            "gpt", PIPELINED, (PIPELINED, Layout((2,), ("dp",))), tmp_path):
        if target == PIPELINED:
            assert after == losses[workers.STEPS:]
            continue
        for a, b in zip(after, losses[workers.STEPS:]):
            assert abs(a - b) <= RELATIVE * abs(b), (after, losses)
        assert _close(resumed, state)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("ck") / "gpt")
    layout = Layout((2,), ("dp",))
    launch(workers.run_and_save, 2, "gpt", layout, workers.plan_for("gpt", layout), path)
    return path


def test_a_checkpoint_loads_into_the_plain_model_and_consolidates(saved, tmp_path):
    model, _ = workers.build("gpt", 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=workers.LEARNING_RATE)
    info = checkpoint.load_full(saved, model, optimizer)
    assert info.step == workers.STEPS and info.extra == {"example": "gpt"}
    steps = {float(s["step"]) for s in optimizer.state.values()}
    assert steps == {float(workers.STEPS)}
    checkpoint.consolidate(saved, tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)
    for name, tensor in model.state_dict().items():
        if name in whole:
            assert torch.equal(whole[name], tensor), name
    assert any(key.startswith("optim/") for key in whole)


def test_a_missing_checkpoint_is_named_with_the_fix(tmp_path):
    model, _ = workers.build("gpt", 0)
    with pytest.raises(CheckpointError, match="no checkpoint at") as error:
        checkpoint.load_full(tmp_path / "nothing", model)
    assert "fix:" in str(error.value)


def test_an_incomplete_checkpoint_is_never_loaded(saved, tmp_path):
    import shutil

    cut = tmp_path / "cut"
    shutil.copytree(saved, cut)
    (cut / checkpoint.MANIFEST).unlink()  # as a save that stopped before its commit
    model, _ = workers.build("gpt", 0)
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        checkpoint.load_full(cut, model)


def test_a_corrupt_checkpoint_is_refused(saved, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(saved, broken)
    for data in broken.glob("*.distcp"):
        data.write_bytes(data.read_bytes()[:100])
    model, _ = workers.build("gpt", 0)
    with pytest.raises(CheckpointError, match="can't be read") as error:
        checkpoint.load_full(broken, model)
    assert "fix:" in str(error.value)


def test_a_checkpoint_of_another_model_is_refused(saved):
    import examples.llama as llama

    model, _ = llama.build(**workers.CONFIG)
    with pytest.raises(CheckpointError, match="another model") as error:
        checkpoint.load_full(saved, model)
    assert "fix:" in str(error.value)
    other, _ = workers.build("gpt", 0)
    with pytest.raises(CheckpointError, match="another optimizer"):
        checkpoint.load_full(saved, other, torch.optim.SGD(other.parameters(), lr=0.1))
