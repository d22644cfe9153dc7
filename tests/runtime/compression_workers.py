"""Rank bodies of test_compression: one step of an MLP whose plan reduces its gradients in
bfloat16 or gathers its parameters in int8, beside the gradients the single-process model
gives with the same rounding."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

import autopar
from autopar.tools.rounded_reference import gathered_in_int8
from autopar.values.placement import parse_placements
from examples import mlp

SIZES = {"batch": 8, "hidden": 256, "ffn": 1024}


def build():
    return mlp.build(**SIZES)


def parameter_name(node) -> str:
    """The model's name of a plan's parameter node (`p_fc1_weight` of module fc1:
    fc1.weight)."""
    return f"{node.module}.{node.name[len('p_' + node.module.replace('.', '_') + '_'):]}"


def shape_of(node) -> tuple[int, ...]:
    """The shape of a plan's parameter node of the MLP."""
    layer, kind = parameter_name(node).split(".")
    rows, columns = ((SIZES["ffn"], SIZES["hidden"]) if layer == "fc1"
                     else (SIZES["hidden"], SIZES["ffn"]))
    return (rows, columns) if kind == "weight" else (rows,)


def rounded_reference(model: torch.nn.Module, inputs: tuple, pieces: int,
                      compressed: set[str]) -> dict:
    """Each parameter's gradient as a plan of `pieces` data-parallel ranks makes it: the
    sum of every rank's gradient of its samples' share of the loss (the mean as the
    captured graph computes it: a sum over the global count); for the `compressed`
    parameters, each rounded to bfloat16, summed in bfloat16, read back in float32."""
    x, target = inputs
    parts: dict[str, list[torch.Tensor]] = {}
    for x_piece, target_piece in zip(x.chunk(pieces), target.chunk(pieces)):
        model.zero_grad()
        out = model.fc2(F.gelu(model.fc1(x_piece)))
        (F.mse_loss(out, target_piece, reduction="sum") / target.numel()).backward()
        for name, p in model.named_parameters():
            parts.setdefault(name, []).append(p.grad.clone())
    summed = {}
    for name, grads in parts.items():
        if name in compressed:
            total = grads[0].to(torch.bfloat16)
            for g in grads[1:]:
                total = (total.float() + g.to(torch.bfloat16).float()).to(torch.bfloat16)
            summed[name] = total.float()
        else:
            summed[name] = sum(grads[1:], grads[0])
    return summed


def compressed_step(rank: int, plan: dict) -> dict:
    """One forward and backward under `plan` (a `Plan.to_dict()`): the full gradients,
    the bytes moved and the plan's; on rank 0 also `rounded_reference`'s gradients."""
    torch.manual_seed(0)
    model, inputs = build()
    reference = copy.deepcopy(model)
    planned = autopar.Plan.from_dict(plan)
    pm = autopar.compile(model, planned.mesh, inputs, plan=planned)
    pm(*inputs).backward()
    result = {"grads": pm.full_grads(), "measured": dict(pm.counter.totals()),
              "predicted": pm.plan.comm_bytes()}
    if rank == 0:
        compressed = {parameter_name(n) for n in planned.nodes if n.compression}
        result["expected"] = rounded_reference(reference, inputs, planned.mesh.size, compressed)
    return result


def quantized_weights(model: torch.nn.Module, stored: dict[str, str],
                      mesh_shape: tuple[int, ...]) -> dict:
    """Each parameter of `model` as the ranks of a plan gather it: for those in `stored`
    (name: the placements it is stored in on a mesh of `mesh_shape`, e.g. "S(0),S(0)"),
    through int8 blocks and back at each gather (`rounded_reference.gathered_in_int8`),
    not differentiated (a straight-through copy); the others as they are."""
    weights = {}
    for name, p in model.named_parameters():
        if name not in stored:
            weights[name] = p
            continue
        rounded = gathered_in_int8(p.detach(), parse_placements(stored[name]), mesh_shape)
        weights[name] = p + (rounded - p).detach()
    return weights


def gathered_step(rank: int, plan: dict) -> dict:
    """One forward and backward under `plan`, whose parameters may be gathered in int8: the
    loss, full gradients, bytes moved and the plan's; on rank 0 also the single-process
    loss and gradients with the same rounding of the weights gathered so (an exact plan's,
    "hpz" too: the single-process model's own)."""
    torch.manual_seed(0)
    model, inputs = build()
    reference = copy.deepcopy(model)
    planned = autopar.Plan.from_dict(plan)
    pm = autopar.compile(model, planned.mesh, inputs, plan=planned)
    loss = pm(*inputs)
    loss.backward()
    result = {"loss": loss.detach(), "grads": pm.full_grads(),
              "measured": dict(pm.counter.totals()), "predicted": pm.plan.comm_bytes()}
    if rank == 0:
        stored = {parameter_name(n): n.output for n in planned.nodes
                  if n.compression.startswith("int8-gather")}
        weights = quantized_weights(reference, stored, planned.mesh.shape)
        expected = torch.func.functional_call(reference, weights, inputs)
        expected.backward()
        result["expected_loss"] = expected.detach()
        result["expected"] = {name: p.grad.clone() for name, p in reference.named_parameters()}
    return result



def int8_gathered(rank: int, shape: tuple[int, ...], stored: str) -> torch.Tensor:
    """A weight of `shape` stored as `stored` on a (2, 2) mesh, all-gathered in int8 by the
    runtime's own steps: what this rank receives."""
    from autopar.runtime import CommCounter, Redistribution, device_mesh
    from autopar.runtime.axis_ops import apply_steps
    from autopar.runtime.shards import local_piece
    from autopar.values.compression import INT8_GATHER
    from autopar.values.placement import Replicate

    mesh = device_mesh(autopar.Mesh((2, 2), ("node", "gpu")))
    placements = parse_placements(stored)
    weight = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    edge = Redistribution.for_edge(shape, weight.dtype, placements, (Replicate(),) * 2,
                                   (Replicate(),) * 2, (2, 2), requires_grad=False,
                                   compression=INT8_GATHER)
    piece = local_piece(weight, placements, (2, 2), tuple(mesh.get_coordinate()))
    return apply_steps(piece, edge.forward_steps, mesh, CommCounter(), "forward")
