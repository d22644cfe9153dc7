"""The single-process side of a verified run whose plan compresses (`autopar run --verify
--compression`): the same rounding applied where one process can apply it, the compiled
model's own gradients taken where it can't, so that exactness is still checked wherever
it still holds.

- "int8-gather": the reference's weight is rounded as the ranks' gathers round it
  (`autopar.runtime.quantize.round_trip`; over two axes or more, each gather rounds again
  what the one before made: `gathered_in_int8`, for a use that gathers it whole) for its forward
  and backward, then put back for
  the optimizer's step (the gradient of the rounded weight steps the weight, as the
  runtime's straight-through copy does). Every gradient and the loss are then checked as
  without compression, and the reference steps with the compiled gradient of the rounded
  weight (`take_gathered`), so that the next gathers round the same weights.
- "bf16-reduce": the compiled gradient is checked against the reference's within
  bfloat16's rounding of the n ranks' partial sums (`bf16_bound`), then the reference
  steps with the compiled gradient, so that both start the next step from the same
  weights.
- "hpz": exact (the backward gathers the same values from another copy): nothing rounded,
  every gradient checked.
- PowerSGD: the compiled gradient is a low-rank approximation with no bound per step; the
  reference steps with it, unchecked.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator

import torch
from torch import nn

from autopar.runtime.program import StateSlot
from autopar.runtime.quantize import round_trip
from autopar.runtime.shards import chunk_of
from autopar.runtime.steps import redistribution_steps
from autopar.values.compression import compression_named
from autopar.values.placement import Placements, Replicate


def bf16_bound(ranks: int) -> float:
    """The largest difference, relative to the summed gradient's largest entry, that a
    bfloat16 reduction over `ranks` adds: each rank's gradient and each of the ranks - 1
    partial sums rounded once (2^-9 each), a sum never larger than n times its largest
    term."""
    return 2.0 ** -9 * (2 * ranks - 1) * ranks


def compressed_slots(slots: tuple[StateSlot, ...]) -> dict[str, StateSlot]:
    """The trained parameters the plan compresses, by name."""
    return {slot.names[0]: slot for slot in slots if slot.compression}


def gathered_in_int8(weight: torch.Tensor, placements: Placements,
                     mesh_shape: tuple[int, ...]) -> torch.Tensor:
    """`weight` as the ranks gather it in int8: the gathers from its stored `placements` to
    replicated run one axis at a time (`redistribution_steps`, the runtime's order), and
    each rounds every piece it sends (`round_trip`, over the piece with the gathered dim
    first, as `axis_ops.start_all_gather` lays it out): over two axes, the second rounds
    what the first made."""
    placements = tuple(placements)
    replicated = tuple(Replicate() for _ in placements)
    steps = redistribution_steps(placements, replicated, tuple(weight.shape), mesh_shape)
    coordinates = list(itertools.product(*map(range, mesh_shape)))
    pieces = {c: chunk_of(weight, placements, mesh_shape, c) for c in coordinates}
    for step in steps:
        if step.kind != "all_gather":
            continue
        dim, axis = step.src.dim, step.axis
        pieces = {c: torch.cat([round_trip(pieces[(*c[:axis], i, *c[axis + 1:])].movedim(
            dim, 0)).movedim(0, dim) for i in range(mesh_shape[axis])], dim)
            for c in coordinates}
    return pieces[coordinates[0]]


@contextlib.contextmanager
def rounded_weights(reference: nn.Module, slots: dict[str, StateSlot],
                    mesh_shape: tuple[int, ...]) -> Iterator[None]:
    """Within: the int8-gathered weights of `reference` rounded as the ranks gather them;
    after: their own values back (their gradients kept)."""
    held = {}
    parameters = dict(reference.named_parameters())
    for name, slot in slots.items():
        if "gather" in compression_named(slot.compression).kinds:
            weight = parameters[name]
            held[name] = weight.data
            weight.data = gathered_in_int8(weight.data, slot.placements, mesh_shape)
    try:
        yield
    finally:
        for name, data in held.items():
            parameters[name].data = data


def take_compressed(reference: nn.Module, grads: dict, slots: dict[str, StateSlot],
                    ranks: int) -> tuple[float, str | None]:
    """Give the reference the compiled gradients of the parameters whose reduction the plan
    compresses (`grads`: full gradients by name, after the reference's backward), so that
    it steps as the compiled model does; the largest excess of a bf16-reduced one over
    `bf16_bound` (above 1 fails; 0 when none) and its parameter's name."""
    worst: tuple[float, str | None] = (0.0, None)
    parameters = dict(reference.named_parameters())
    for name, slot in slots.items():
        kinds = compression_named(slot.compression).kinds
        if not {"reduce", "low-rank"} & set(kinds) or grads.get(name) is None:
            continue
        param = parameters[name]
        if "reduce" in kinds and param.grad is not None:
            allowed = bf16_bound(ranks) * float(param.grad.abs().max())
            difference = float((grads[name] - param.grad).abs().max())
            excess = difference / allowed if allowed > 0 else \
                (0.0 if difference == 0 else math.inf)
            worst = max(worst, (excess, name), key=lambda pair: pair[0])
        param.grad = grads[name].clone()
    return worst


def take_gathered(reference: nn.Module, grads: dict, slots: dict[str, StateSlot]) -> None:
    """Give the reference the compiled gradients (`grads`, full, by name) of the parameters
    the plan gathers in int8, once they have been checked: both models then step to the
    same weights, which the next step's gathers round alike. Stepping with its own
    gradient, the reference drifts from the ranks' weights in the last bits of the
    reductions, and a weight on a rounding boundary then takes the next int8 level on one
    side only (examples' MLP on 2 ranks, on one machine: at step 10, 6e-4 of fc2's
    gradient)."""
    parameters = dict(reference.named_parameters())
    for name, slot in slots.items():
        if "gather" in compression_named(slot.compression).kinds and grads.get(name) is not None:
            parameters[name].grad = grads[name].clone()
