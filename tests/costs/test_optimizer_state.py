"""What training keeps per parameter element (`autopar.costs.optimizer_state`), and plans that
count it."""

import pytest
import torch

import autopar
from autopar.costs.optimizer_state import OptimizerState, optimizer_state
from autopar.errors import OptimizerError
from examples import mlp


@pytest.mark.parametrize(("spec", "states"), [
    (None, 2), (torch.optim.AdamW, 2), (torch.optim.Adam, 2),
    ((torch.optim.Adam, {"amsgrad": True}), 3),
    (torch.optim.SGD, 0), ((torch.optim.SGD, {"momentum": 0.9}), 1), (torch.optim.Adagrad, 1),
    ((torch.optim.RMSprop, {"momentum": 0.9, "centered": True}), 3),
])
def test_torch_optimizers_keep_their_states_in_the_parameter_dtype(spec, states):
    state = optimizer_state(spec)
    assert state.states == states
    assert state.element_bytes(torch.bfloat16) == 2 * states
    assert state.element_bytes(torch.float32) == 4 * states


def test_an_optimizer_instance_is_read_with_its_options():
    weight = torch.nn.Parameter(torch.zeros(2))
    assert optimizer_state(torch.optim.SGD([weight], lr=0.1, momentum=0.9)).states == 1


def test_mixed_precision_keeps_an_fp32_master_copy_and_fp32_states():
    """bf16 parameters under the Megatron recipe: 4 bytes of master weight and 2 x 4 of
    Adam moments per element, besides the bf16 parameter and gradient."""
    state = optimizer_state(torch.optim.AdamW, master_weights=torch.float32)
    assert state.element_bytes(torch.bfloat16) == 4 + 8
    assert "float32 master weights" in state.describe()


def test_bytes_per_element_stand_for_an_optimizer_it_does_not_know():
    assert optimizer_state(6).element_bytes(torch.float32) == 6
    assert OptimizerState.from_dict(optimizer_state(6).to_dict()) == optimizer_state(6)


@pytest.mark.parametrize("spec", [torch.optim.LBFGS, "adamw", [1, 2], -3, True])
def test_what_it_cannot_size_is_refused_with_the_fix(spec):
    with pytest.raises(OptimizerError) as error:
        optimizer_state(spec)
    assert "fix:" in str(error.value)
    if spec is torch.optim.LBFGS:
        assert "bytes per parameter element" in str(error.value)


def test_master_weights_must_be_a_float_dtype():
    with pytest.raises(OptimizerError):
        optimizer_state(torch.optim.AdamW, master_weights=torch.int8)


def test_the_plan_counts_the_optimizer_it_is_given():
    """On one device every parameter is replicated: SGD without momentum keeps parameter and
    gradient (8 bytes per fp32 element), AdamW two moments more (16)."""
    model, inputs = mlp.build(batch=4, hidden=64, ffn=256, device="meta")
    mesh = autopar.Mesh((1,), ("dp",), hardware="cpu")
    elements = sum(p.numel() for p in model.parameters())

    def parameter_bytes(optimizer):
        plan = autopar.plan(model, mesh, inputs, optimizer=optimizer)
        return sum(n.memory_bytes for n in plan.nodes if n.role == "parameter"), plan

    sgd, sgd_plan = parameter_bytes(torch.optim.SGD)
    adamw, adamw_plan = parameter_bytes(torch.optim.AdamW)
    assert (sgd, adamw) == (8 * elements, 16 * elements)
    assert sgd_plan.optimizer.startswith("SGD") and adamw_plan.optimizer.startswith("AdamW")
    assert "optimizer" in autopar.summary(adamw_plan) and "AdamW" in autopar.summary(adamw_plan)
    with pytest.raises(OptimizerError):
        autopar.plan(model, mesh, inputs, optimizer=torch.optim.LBFGS)
