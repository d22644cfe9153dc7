"""Forward simulation of one strategy per mesh axis on a multi-axis mesh.

The strategy pass combines single-axis strategies into mesh-wide ones; this checks that the
combination means what the lowering will do. A tensor is cut axis by axis, the first axis
outermost (DTensor's order): each placement applies to the piece the previous axes left.
A rank calls the op with `local_args` given its piece of the output, and a vocab-split
embedding starts at its piece's first row. Outputs are put back innermost axis first.
Combinations the strategy pass drops (a piece left empty, pieces that do not line up)
raise `Uneven`.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product
from typing import Any

import torch
from simulate import Uneven, _call, _fill, _outputs, _tol, build, join, split

from autopar.passes.strategies.find_strategies import lined_up
from autopar.rules import AxisStrategy, OpSpec, local_args
from autopar.rules.embedding import is_vocab_split, masked_embedding
from autopar.values.placement import chunk_extent, local_shape, smallest_piece


def _cut(t: torch.Tensor, placements: Sequence, mesh: Sequence[int],
         gen: torch.Generator) -> dict[tuple[int, ...], torch.Tensor]:
    pieces = {(): t}
    for placement, n in zip(placements, mesh):
        pieces = {c + (i,): part for c, v in pieces.items()
                  for i, part in enumerate(split(v, placement, n, gen))}
    return pieces


def _run(op: OpSpec, strategies: Sequence[AxisStrategy], mesh: Sequence[int],
         coord: tuple[int, ...], local: list[torch.Tensor]) -> list[torch.Tensor]:
    out = op.outputs[0]
    placements = tuple(s.output for s in strategies)
    args, kwargs = _fill(*local_args(op, local_shape(out.shape, placements, mesh, coord)),
                         local)
    axes = [a for a, s in enumerate(strategies) if is_vocab_split(op, s.inputs[0])]
    if axes:
        start, rows = 0, op.inputs[0].shape[0]
        for a in axes:
            offset, rows = chunk_extent(rows, mesh[a], coord[a])
            start += offset
        padding = args[2] if len(args) > 2 else kwargs.get("padding_idx", -1)
        return _outputs(masked_embedding(*local, start, padding))
    return _outputs(_call(op.target, args, kwargs))


def _check_kept(op: OpSpec, strategies: Sequence[AxisStrategy], mesh: tuple[int, ...]) -> None:
    """Raise `Uneven` where the strategy pass drops the combination on `mesh`."""
    tensors = [*((spec, tuple(s.inputs[i] for s in strategies))
                 for i, spec in enumerate(op.inputs)),
               *((spec, tuple(s.output for s in strategies)) for spec in op.outputs)]
    for spec, placements in tensors:
        if any(smallest_piece(size, placements, mesh, d) == 0
               for d, size in enumerate(spec.shape)):
            raise Uneven(f"{spec.shape} in {mesh}: an empty piece")
    if not lined_up(tensors, mesh):
        raise Uneven(f"pieces that do not line up on {mesh}")


def simulate_mesh(target: Any, args: tuple, kwargs: dict, strategies: Sequence[AxisStrategy],
                  mesh: Sequence[int], seed: int = 0) -> None:
    """Assert that the per-axis `strategies` combined are exact on `mesh` (forward)."""
    gen = torch.Generator().manual_seed(seed)
    op, tensors = build(target, args, kwargs)
    _check_kept(op, strategies, tuple(mesh))
    cuts = [_cut(t, [s.inputs[i] for s in strategies], mesh, gen)
            for i, t in enumerate(tensors)]
    coords = list(product(*map(range, mesh)))
    results = {c: _run(op, strategies, mesh, c, [cut[c] for cut in cuts]) for c in coords}
    for axis in reversed(range(len(mesh))):
        placement = strategies[axis].output
        results = {c: [join([results[c + (i,)][k] for i in range(mesh[axis])], placement)
                       for k in range(len(results[c + (0,)]))]
                   for c in product(*map(range, mesh[:axis]))}
    for got, want in zip(results[()], _outputs(_call(target, args, kwargs))):
        torch.testing.assert_close(got, want, **_tol(want))
