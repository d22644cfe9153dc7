"""Bad input to `autopar.compile` and to compiled models: clear errors, never a hang.

Documented choice for new input shapes: a compiled model refuses them with
`InputMismatchError` rather than recompiling, because compiling is collective and a rank
that recompiled alone would leave the others waiting.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from compile_workers import (
    accumulate_two_backwards,
    compile_for_wrong_world,
    die_mid_training,
    infeasible_on_rank_zero,
)

import autopar
from autopar.runtime import LaunchError, ProcessGroupError
from autopar.runtime.launch import launch
from examples import gpt, mlp

ONE = autopar.Mesh((1,), ("x",), hardware="cpu")


def test_a_world_size_that_does_not_match_the_mesh():
    messages = launch(compile_for_wrong_world, 2, timeout=120.0)
    for message in messages:
        assert message.startswith("ProcessGroupError"), message
        assert "world size 2" in message and "4 ranks" in message


def test_no_process_group_for_a_mesh_of_several_devices():
    model, inputs = mlp.build()
    with pytest.raises(ProcessGroupError, match="not initialised"):
        autopar.compile(model, autopar.Mesh((2,), ("x",), hardware="cpu"), inputs)


def test_a_mesh_of_one_device_needs_no_process_group():
    model, inputs = mlp.build()
    pm = autopar.compile(model, ONE, inputs)
    assert "self." not in pm.code.split("def forward")[1]  # no collective module called
    assert torch.equal(pm(*inputs), model(*inputs))


def test_inputs_of_other_shapes_are_refused_with_a_fix():
    model, (x, target) = mlp.build(batch=8)
    pm = autopar.compile(model, ONE, (x, target))
    with pytest.raises(autopar.InputMismatchError, match="input 0") as error:
        pm(torch.zeros(4, x.shape[1]), target)
    assert "compile again" in error.value.fix
    with pytest.raises(autopar.InputMismatchError, match="dtype|float64"):
        pm(x.double(), target)
    with pytest.raises(autopar.InputMismatchError, match="structured differently"):
        pm(x)
    with pytest.raises(autopar.InputMismatchError, match="structured differently"):
        pm(x, target=target)
    # As many positional arguments as the example, but not the same kind of value.
    with pytest.raises(autopar.InputMismatchError, match="input 1"):
        pm(x, None)
    with pytest.raises(autopar.InputMismatchError, match="input 1"):
        pm(x, [target])


def test_without_example_inputs_the_plan_waits_for_the_first_call():
    model, inputs = mlp.build()
    pm = autopar.compile(model, ONE)
    with pytest.raises(autopar.InputMismatchError, match="first call"):
        pm.plan  # noqa: B018 - the property access is what raises
    with pytest.raises(autopar.InputMismatchError, match="positional"):
        pm(x=inputs[0], target=inputs[1])
    pm(*inputs).backward()
    assert pm.plan.mesh == ONE


def test_a_plan_for_another_mesh_or_model_is_refused():
    model, inputs = mlp.build()
    plan = autopar.plan(model, ONE, inputs)
    with pytest.raises(autopar.MeshError, match="another mesh"):
        autopar.compile(model, autopar.Mesh((1, 1), ("a", "b"), hardware="cpu"), inputs,
                        plan=plan)
    other, other_inputs = gpt.build()
    with pytest.raises(autopar.InputMismatchError, match="input 0 differs") as error:
        autopar.compile(other, ONE, other_inputs, plan=plan)
    assert "float32[" in str(error.value) and "int64[" in str(error.value)
    with pytest.raises(autopar.PlanFormatError, match="another model: node"):
        autopar.compile(other, ONE, other_inputs,
                        plan=dataclasses.replace(plan, inputs=()))
    wider, same_inputs = mlp.build(ffn=256)  # the inputs' shapes are the same
    with pytest.raises(autopar.PlanFormatError, match="other tensor shapes"):
        autopar.compile(wider, ONE, same_inputs, plan=plan)


def test_a_planning_error_on_rank_zero_reaches_every_rank():
    messages = launch(infeasible_on_rank_zero, 2, timeout=120.0)
    assert all(m.startswith("InfeasiblePlanError") for m in messages), messages
    assert messages[0] == messages[1]


def test_a_rank_that_dies_mid_step_fails_the_others_within_bounded_time():
    start = time.monotonic()
    with pytest.raises(LaunchError, match="rank 1") as error:
        launch(die_mid_training, 2, timeout=120.0, grace=5.0)
    assert time.monotonic() - start < 90.0
    assert "exit" in str(error.value) and "3" in str(error.value)


def test_a_meta_model_is_initialised_piece_by_piece_like_torch_nn():
    # Each module's reset_parameters() runs in graph order, which here is construction
    # order: the values are those of the same model built on the CPU under the same seed.
    with torch.device("meta"):
        model = mlp.MLP(16, 32)
    _, meta_inputs = mlp.build(hidden=16, ffn=32, device="meta")
    _, inputs = mlp.build(hidden=16, ffn=32)
    torch.manual_seed(7)
    pm = autopar.compile(model, ONE, meta_inputs)
    torch.manual_seed(7)
    expected = mlp.MLP(16, 32).state_dict()
    full = pm.full_state_dict()
    assert full.keys() == expected.keys()
    assert all(torch.equal(full[k], expected[k]) for k in full)
    assert all(p.device.type == "meta" for p in model.parameters())  # the model is untouched
    assert torch.isfinite(pm(*inputs))


def test_meta_tensors_without_reset_parameters_are_refused():
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(4, device="meta"))

        def forward(self, x):
            return (x * self.weight).sum()

    with pytest.raises(autopar.InitializationError, match="reset_parameters"):
        autopar.compile(Scale(), ONE, (torch.ones(2, 4, device="meta"),))


def test_tensors_a_meta_graph_creates_are_made_on_the_ranks_device():
    # GPT's position ids come from arange(..., device=meta) in the captured graph.
    model, meta_inputs = gpt.build(device="meta")
    _, inputs = gpt.build()
    pm = autopar.compile(model, ONE, meta_inputs)
    assert "device(type='meta')" not in pm.code
    assert torch.isfinite(pm(*inputs))


def test_gradients_accumulate_over_backward_passes_exactly():
    # Overlapped all-reduces add only this pass's contribution to what .grad holds.
    errors = launch(accumulate_two_backwards, 2, timeout=120.0)
    assert max(errors) < 1e-6, errors


def test_a_non_tensor_input_is_fixed_to_its_example_value():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x, times: int):
            return self.fc(x).sum() * times

    model, x = Scaled(), torch.randn(8, 4)
    pm = autopar.compile(model, ONE, (x, 3))
    assert torch.equal(pm(x, 3), model(x, 3))
    with pytest.raises(autopar.InputMismatchError, match="input 1"):
        pm(x, 4)
    with pytest.raises(autopar.InputMismatchError, match="input 1"):
        pm(x, torch.tensor([3, 3]))
