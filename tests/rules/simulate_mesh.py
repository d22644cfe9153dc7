"""Forward simulation of one strategy per mesh axis on a multi-axis mesh.

The strategy pass combines single-axis strategies into mesh-wide ones; this checks that the
combination means what the lowering will do. A tensor is cut axis by axis, the first axis
outermost (DTensor's order): each placement applies to the piece the previous axes left.
A rank calls the op with `local_args` given the product of chunk counts over the axes that
split each output dim, and a vocab-split embedding starts at its chunk's row in the
combined order of the axes that split the table. Outputs are put back innermost axis first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import product
from typing import Any

import torch
from simulate import Uneven, _call, _fill, _outputs, _tol, build, join, split

from autopar.rules import AxisStrategy, OpSpec, local_args
from autopar.rules.embedding import is_vocab_split, masked_embedding
from autopar.values.placement import Shard


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
    pieces = [math.prod(n for s, n in zip(strategies, mesh) if s.output == Shard(d))
              for d in range(out.ndim)]
    if any(size % k for size, k in zip(out.shape, pieces)):
        raise Uneven(f"output {out.shape} in {pieces}")
    args, kwargs = _fill(*local_args(op, pieces), local)
    axes = [a for a, s in enumerate(strategies) if is_vocab_split(op, s.inputs[0])]
    if axes:
        chunk, count = 0, 1
        for a in axes:
            chunk, count = chunk * mesh[a] + coord[a], count * mesh[a]
        padding = args[2] if len(args) > 2 else kwargs.get("padding_idx", -1)
        start = chunk * op.inputs[0].shape[0] // count
        return _outputs(masked_embedding(*local, start, padding))
    return _outputs(_call(op.target, args, kwargs))


def simulate_mesh(target: Any, args: tuple, kwargs: dict, strategies: Sequence[AxisStrategy],
                  mesh: Sequence[int], seed: int = 0) -> None:
    """Assert that the per-axis `strategies` combined are exact on `mesh` (forward)."""
    gen = torch.Generator().manual_seed(seed)
    op, tensors = build(target, args, kwargs)
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
