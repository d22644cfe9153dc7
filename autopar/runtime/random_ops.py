"""Random ops with DTensor's semantics (obligation 4 of `autopar.rules`).

An op that draws random numbers (tagged `nondeterministic_seeded`: dropout, rand_like,
bernoulli, ...) draws, on every rank, the numbers of the *whole* tensor, and the rank keeps
its piece of them:

- under `R` (or `P`) every rank holding the tensor draws the same numbers: all ranks call
  the generator with the same shapes in the same order, so, seeded alike (as torchrun
  scripts seed every rank), their generators stay in step;
- under a split, each rank keeps a different chunk of one global draw: the numbers the
  single-process model draws for the whole tensor, cut as the placement cuts it.

So a model with dropout trains on the mesh exactly as on one process whose generator is
in the same state, and replicated parameters stay identical on every rank. CPU generators
can't skip ahead to a chunk's offset (CUDA's Philox offsets can), so each rank pays for
drawing the whole tensor: as much as the replicated op would.

`seeded_piece` stands in for a split random op in a rank's program; ops that draw without
a tensor input (rand, randn, randperm) are replicated by their rules and need nothing.
"""

from __future__ import annotations

import torch

from autopar.runtime.shards import chunk_of
from autopar.values.placement import Placements, Shares

aten = torch.ops.aten

# The output depends only on its tensor input's shape and dtype, not its values.
_SHAPE_ONLY = {aten.rand_like.default, aten.randn_like.default, aten.randint_like.default,
               aten.randint_like.low_dtype, aten.bernoulli.p}
# out = input * mask / (1 - p): the draw from a tensor of ones, times the input.
_SCALED_MASK = {aten.dropout.default, aten.native_dropout.default}
# Ops with probabilities as input: their draw is compared with the uniform numbers of the
# whole tensor (the same semantics; other numbers than torch's own kernel draws).
_PROBABILITIES = {aten.bernoulli.default}

SUPPORTED = frozenset(_SHAPE_ONLY | _SCALED_MASK | _PROBABILITIES)


def seeded_piece(target, x: torch.Tensor, *args, full_shape: tuple[int, ...],
                 placements: Placements, mesh_shape: tuple[int, ...],
                 coordinate: tuple[int, ...], shares: Shares = None, **kwargs):
    """`target(x, *args, **kwargs)` on this rank's piece `x` of a tensor of `full_shape`
    split by `placements` (the op's output placements, cut by the mesh's `shares`),
    drawing the whole tensor's numbers and keeping this rank's chunk. `target` is one of
    `SUPPORTED`."""
    def piece(full: torch.Tensor) -> torch.Tensor:  # a P output's draw is whole, as under R
        return chunk_of(full, placements, mesh_shape, coordinate, shares)

    whole = torch.empty(full_shape, dtype=x.dtype, device=x.device)
    if target in _SHAPE_ONLY:
        return piece(target(whole, *args, **kwargs))
    if target in _PROBABILITIES:
        return (piece(torch.rand_like(whole)) < x).to(x.dtype)
    train = args[1] if len(args) > 1 else kwargs.get("train", True)
    if not train:
        return target(x, *args, **kwargs)
    drawn = target(torch.ones_like(whole), *args, **kwargs)
    if target is aten.native_dropout.default:
        scaled, mask = drawn
        return x * piece(scaled), piece(mask)
    return x * piece(drawn)
