"""Redistribution cases and their reference layouts, shared by the parent and the ranks.

A case is one graph edge: source and destination placements, the consumer's output
placement (it decides the arriving gradient), whether the tensor is on the gradient path
and whether it is a regathered parameter. `layout` cuts a global tensor into a rank's
local piece for any placements (Partial: random summands that add up to the value), so
the expected result of every edge is computed from global tensors alone. Shapes the mesh
does not divide (`UNEVEN`) cut as DTensor does, the first pieces the longest.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass

import torch

from autopar.costs import formulas, uneven
from autopar.runtime import (
    CommCounter,
    Redistribution,
    Regather,
    UnsupportedRedistributionError,
    device_mesh,
    redistribute,
)
from autopar.runtime.axis_ops import piece_of
from autopar.values.placement import (
    Partial,
    Placements,
    Replicate,
    Shard,
    format_placements,
    parse_placements,
)
from autopar.values.specs import TensorSpec

SHAPE = (4, 8)
UNEVEN = (7, 10)  # 7 in 2: 4, 3; in 4: 2, 2, 2, 1; 10 in 4: 3, 3, 3, 1
AXIS = ("R", "P", "S(0)", "S(1)")


@dataclass(frozen=True)
class Case:
    """One edge, with placements in text form (`"S(0),R"`) so it pickles trivially."""

    src: str
    dst: str
    consumer: str
    shape: tuple[int, ...] = SHAPE
    regather: bool = False
    requires_grad: bool = True

    @property
    def id(self) -> str:
        flags = ("-regather" if self.regather else "") + ("" if self.requires_grad else "-nograd")
        return f"{self.src}->{self.dst}|{self.consumer}{flags}|{'x'.join(map(str, self.shape))}"

    def redistribution(self, mesh_shape: tuple[int, ...]) -> Redistribution:
        return Redistribution.for_edge(
            self.shape, torch.float64, parse_placements(self.src), parse_placements(self.dst),
            parse_placements(self.consumer), mesh_shape, requires_grad=self.requires_grad,
            regather=self.regather)

    def transfers(self, mesh_shape: tuple[int, ...]) -> tuple[formulas.Transfer, ...]:
        nbytes = uneven.tensor_bytes(TensorSpec(self.shape, torch.float64), mesh_shape)
        return formulas.edge_transfers(nbytes, parse_placements(self.src),
                                       parse_placements(self.dst), parse_placements(self.consumer),
                                       mesh_shape, requires_grad=self.requires_grad,
                                       regather=self.regather)


def _consumers(dst: Placements) -> list[Placements]:
    # The consumer's output matters only on axes where the input is R (R or P grad there).
    options = [(Replicate(), Shard(0)) if isinstance(p, Replicate) else (Shard(0),)
               for p in dst]
    return [tuple(c) for c in itertools.product(*options)]


def cases(ndim: int, *, regather_cases: bool = True, nograd_cases: bool = False,
          shape: tuple[int, ...] = SHAPE) -> list[Case]:
    """Every src/dst pair of R, P, S(0), S(1) per axis, with every distinct arriving grad;
    regathered parameter edges for sources without P; optionally edges off the grad path;
    of a tensor of `shape`."""
    result = []
    for src in itertools.product(AXIS, repeat=ndim):
        for dst in itertools.product(AXIS, repeat=ndim):
            src_text, dst_text = ",".join(src), ",".join(dst)
            for consumer in _consumers(parse_placements(dst_text)):
                c = format_placements(consumer)
                result.append(Case(src_text, dst_text, c, shape))
                if regather_cases and "P" not in src:
                    result.append(Case(src_text, dst_text, c, shape, regather=True))
            if nograd_cases:
                result.append(Case(src_text, dst_text, ",".join(["S(0)"] * ndim), shape,
                                   requires_grad=False))
    return result


def coordinate(rank: int, mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major coordinate of `rank`, torch DeviceMesh's default layout."""
    coords = []
    for size in reversed(mesh_shape):
        coords.append(rank % size)
        rank //= size
    return tuple(reversed(coords))


def layout(value: torch.Tensor, placements: Placements, coord: tuple[int, ...],
           mesh_shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The local piece of global `value` at `coord`; Partial summands are seeded noise."""
    piece = value
    for axis, (placement, n) in enumerate(zip(placements, mesh_shape)):
        if isinstance(placement, Shard):
            piece = piece_of(piece, placement.dim, n, coord[axis])
        elif isinstance(placement, Partial):
            # Same noise on every member of the axis group: seeded by the outer coordinates.
            key = hash((seed, axis, coord[:axis])) % (2 ** 31)
            noise = torch.randn((n, *piece.shape), dtype=piece.dtype,
                                generator=torch.Generator().manual_seed(key))
            piece = piece / n + noise[coord[axis]] - noise.mean(0)
    return piece.contiguous()


def global_tensor(index: int, shape: tuple[int, ...], salt: int) -> torch.Tensor:
    return torch.randn(shape, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(1000 * index + salt))


def _run(case: Case, index: int, mesh, coord, mesh_shape) -> dict:
    try:
        r = case.redistribution(mesh_shape)
    except UnsupportedRedistributionError as error:
        return {"unsupported": str(error)}
    value, grad = global_tensor(index, case.shape, 1), global_tensor(index, case.shape, 2)
    x = layout(value, r.src, coord, mesh_shape, index).requires_grad_(case.requires_grad)
    upstream = layout(grad, r.grad_arriving, coord, mesh_shape, index + 7919)
    counter = CommCounter()
    result: dict = {}
    if case.regather:
        scope = Regather()
        with scope:
            out = redistribute(x, r, mesh, counter, regather=scope)
            weight = torch.ones_like(out, requires_grad=True)
            y = out * weight  # saves `out` for weight's gradient: the regather's use
        kept, gathered = out.detach().clone(), weakref.ref(out)
        del out
        # Only the handle is saved, so the gathered tensor is gone until the backward.
        result["freed"] = gathered() is None
        y.backward(upstream)
        result["weight_grad_error"] = float((weight.grad - upstream * kept).abs().max())
        result["out"] = kept
    else:
        out = redistribute(x, r, mesh, counter)
        if case.requires_grad:
            out.backward(upstream)
        result["out"] = out.detach()
    result["grad"] = x.grad
    result["counter"] = counter.totals()
    return result


def run_cases(rank: int, mesh_shape: tuple[int, ...], axis_names: tuple[str, ...],
              case_list: list[Case]) -> dict:
    """Rank body: run every case on a DeviceMesh of `mesh_shape`; results per case."""
    import autopar

    mesh = device_mesh(autopar.Mesh(mesh_shape, axis_names))
    coord = tuple(mesh.get_coordinate())
    return {"coordinate": coord,
            "results": [_run(case, i, mesh, coord, mesh_shape)
                        for i, case in enumerate(case_list)]}
