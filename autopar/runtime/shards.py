"""A rank's piece of a stored tensor, and the full tensor back from the pieces.

Pieces follow the placements' chunk order: a dim sharded over axes a < b is cut outer axis
first, so the rank at coordinates (i_a, i_b) holds chunk i_a * n_b + i_b (DTensor's order,
the one `autopar.runtime.steps` gathers in), with DTensor's chunking where a dim does not
divide. Stored tensors are never `Partial`.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh

from autopar.runtime.axis_ops import apply_steps, piece_of
from autopar.runtime.counter import CommCounter
from autopar.runtime.steps import redistribution_steps
from autopar.values.placement import Partial, Placements, Replicate, Shard, Shares


def chunk_of(full: torch.Tensor, placements: Placements, mesh_shape: tuple[int, ...],
             coordinate: tuple[int, ...], shares: Shares = None) -> torch.Tensor:
    """The view of `full` the rank at `coordinate` holds under `placements`, cut by the
    mesh's `shares` (`R` and `P` keep a dim whole); no copy, no communication."""
    piece = full
    for axis, placement in enumerate(placements):
        if isinstance(placement, Shard):
            piece = piece_of(piece, placement.dim, mesh_shape[axis], coordinate[axis],
                             None if shares is None else shares[axis])
    return piece


def local_piece(full: torch.Tensor, placements: Placements, mesh_shape: tuple[int, ...],
                coordinate: tuple[int, ...], shares: Shares = None) -> torch.Tensor:
    """The piece of `full` the rank at `coordinate` holds, cut by the mesh's `shares`: a
    new tensor, no communication."""
    assert not any(isinstance(p, Partial) for p in placements), placements
    piece = chunk_of(full, placements, mesh_shape, coordinate, shares)
    return piece.detach().clone(memory_format=torch.contiguous_format)


def gather_full(piece: torch.Tensor, placements: Placements, shape: tuple[int, ...],
                mesh: DeviceMesh | None, shares: Shares = None) -> torch.Tensor:
    """The full tensor from every rank's `piece`, cut by the mesh's `shares` (collective:
    all ranks call it). The collectives are counted on a private counter, not the
    program's."""
    replicated = tuple(Replicate() for _ in placements)
    if tuple(placements) == replicated:
        return piece.detach().clone()
    assert mesh is not None, "a sharded tensor without a DeviceMesh"
    steps = redistribution_steps(tuple(placements), replicated, tuple(shape), tuple(mesh.shape),
                                 shares)
    with torch.no_grad():
        return apply_steps(piece.detach(), steps, mesh, CommCounter(), "forward")
