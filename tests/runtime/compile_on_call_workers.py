"""Rank bodies of test_compile_on_call (module level, so `launch` can send them)."""

from __future__ import annotations

import copy

import torch
from torch.distributed.device_mesh import init_device_mesh

import autopar
from examples import mlp


def train_through_new_shapes(rank: int, use_device_mesh: bool) -> dict:
    """`autopar.compile(model, mesh)` without inputs, an optimizer made before the first
    call, then calls at batch 8, 8, 4, 8: each loss against the plain model's, and the final
    parameters' largest difference from it."""
    model, (x, y) = mlp.build(batch=8, hidden=32)
    reference = copy.deepcopy(model)
    mesh = (init_device_mesh("cpu", (2,), mesh_dim_names=("dp",)) if use_device_mesh
            else autopar.Mesh((2,), ("dp",), hardware="cpu"))
    pm = autopar.compile(model, mesh)
    optimizer = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    losses = []
    for size in (8, 8, 4, 8):
        loss = pm(x[:size], y[:size])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        expected = reference(x[:size], y[:size])
        expected.backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
        losses.append((float(loss.detach()), float(expected.detach())))
    full = pm.full_state_dict()
    error = max(float((full[name] - value).abs().max())
                for name, value in reference.state_dict().items())
    return {"losses": losses, "param_error": error, "programs": len(pm._compiled),
            "axes": pm.plan.mesh.axis_names}


def fixed_plan_refuses_new_shapes(rank: int) -> str:
    model, (x, y) = mlp.build(batch=8, hidden=32)
    pm = autopar.compile(model, autopar.Mesh((2,), ("dp",), hardware="cpu"), replan=False)
    pm(x, y).backward()
    try:
        pm(x[:4], y[:4])
    except autopar.InputMismatchError as error:
        return str(error)
    return "no error"
