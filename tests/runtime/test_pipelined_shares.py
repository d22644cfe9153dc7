"""A pipeline whose stages each hold an H100 and an A100 on their tensor-parallel axis:
each stage's mesh keeps the axis's shares (3:1), its weights are stored cut by them, and
3 AdamW steps equal the single-process model's; the checkpoint loads whole into one
process as the pieces were."""

from __future__ import annotations

import copy
import importlib

import torch
from equivalence_cases import TOLERANCE, gradient_errors

import autopar
from autopar.runtime.launch import launch
from autopar.tools import checkpoint

KINDS = ["h100-sxm", "a100-sxm", "h100-sxm", "a100-sxm"]  # one per device: tp mixed
SHARES = (None, (3, 1))
PINS = {"layers.0.mlp.fc.weight": "R,S(0)", "layers.1.mlp.proj.weight": "R,S(1)"}


def _build():
    return importlib.import_module("examples.gpt").build(batch=8, hidden=64, layers=2)


def _mesh() -> autopar.Mesh:
    return autopar.Mesh((2, 2), ("pp", "tp"), hardware=KINDS, shares=SHARES)


def _train(rank: int, plan: dict, path: str) -> tuple[list, dict]:
    torch.manual_seed(0)
    model, inputs = _build()
    reference = copy.deepcopy(model)
    pm = autopar.compile(model, _mesh(), inputs, plan=autopar.Plan.from_dict(plan))
    optimizers = (torch.optim.AdamW(pm.parameters(), lr=5e-5),
                  torch.optim.AdamW(reference.parameters(), lr=5e-5))
    steps = []
    for _ in range(3):
        loss = pm(*inputs)
        loss.backward()
        grads = pm.full_grads()
        expected = reference(*inputs)
        expected.backward()
        steps.append((float(loss.detach()), float(expected.detach()),
                      max(gradient_errors(grads, reference).values())))
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    checkpoint.save(path, pm, optimizers[0], step=3).wait()
    return steps, {k: v.clone() for k, v in pm.full_state_dict().items()}


def test_stages_of_mixed_kinds_cut_their_weights_by_the_shares(tmp_path):
    model, inputs = _build()
    plan = autopar.plan(model, _mesh(), inputs, constraints=PINS, time_limit=5.0,
                        pipeline=autopar.Pipeline(schedule="1F1B", microbatches=4))
    assert plan.pipeline.sub_mesh.shares == ((3, 1),)
    cut = {n.name: n.pieces for n in plan.nodes if n.role == "parameter" and n.pieces}
    assert cut["p_layers_0_mlp_fc_weight"] == "dim 0: 192, 64", cut
    steps, state = launch(_train, 4, plan.to_dict(), str(tmp_path / "ckpt"))[0]
    for loss, expected, worst in steps:
        assert abs(loss - expected) <= TOLERANCE * abs(expected) and worst <= TOLERANCE
    plain, _ = _build()
    checkpoint.load_full(str(tmp_path / "ckpt"), plain)
    assert all(torch.equal(plain.state_dict()[k], state[k]) for k in state)
