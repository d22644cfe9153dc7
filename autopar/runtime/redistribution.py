"""`Redistribution`: everything the runtime needs to move one tensor along one graph edge.

It is the cost model's view of the edge (`autopar.costs.formulas.edge_transfers`) made executable:
the forward and backward `Transfer`s as the cost model lists them, the placements they convert
between, and the per-axis steps that perform exactly those transfers. Construction checks
that the steps and the transfers agree collective for collective, so the bytes the runtime
moves are the bytes the plan was charged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from autopar.costs import formulas, uneven
from autopar.costs.compression import compressed_transfers, regather_source
from autopar.runtime.errors import RedistributionError, UnsupportedRedistributionError
from autopar.runtime.steps import Step, redistribution_steps
from autopar.values.compression import Compression
from autopar.values.placement import Placements, Shares, format_placements, local_shape
from autopar.values.specs import TensorSpec


@dataclass(frozen=True)
class Redistribution:
    """One edge: `src` -> `dst` forward, `grad_arriving` -> `grad_needed` backward.

    `forward` holds the forward transfers and `backward` the backward ones (backward=True),
    exactly as `formulas.edge_transfers` returns them: with `regather`, the backward list starts
    with a repeat of every forward all-gather (a parameter stored sharded is gathered again
    for the backward instead of being kept). `requires_grad=False` edges have no backward
    transfers and must not be differentiated through. `forward_steps`/`backward_steps` are
    derived. Build one with `Redistribution.for_edge`. `compression`: a parameter's edge
    whose collectives run compressed (`autopar.values.compression`), their steps marked so.
    `regather_from`: where the backward gathers a regathered parameter from ("hpz": a copy
    kept since the forward, `autopar.costs.compression.secondary_copy`; None: the stored
    piece); `keep_steps` (local) cut that copy out of the forward's result and
    `regather_steps` gather it back.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    mesh_shape: tuple[int, ...]
    src: Placements
    dst: Placements
    grad_arriving: Placements
    grad_needed: Placements
    forward: tuple[formulas.Transfer, ...]
    backward: tuple[formulas.Transfer, ...]
    requires_grad: bool = True
    regather: bool = False
    shares: Shares = None
    compression: Compression | None = None
    regather_from: Placements | None = None
    forward_steps: tuple[Step, ...] = field(init=False, repr=False, compare=False)
    backward_steps: tuple[Step, ...] = field(init=False, repr=False, compare=False)
    keep_steps: tuple[Step, ...] = field(init=False, repr=False, compare=False)
    regather_steps: tuple[Step, ...] = field(init=False, repr=False, compare=False)

    @classmethod
    def for_edge(cls, shape: tuple[int, ...], dtype: torch.dtype, src: Placements,
                 dst: Placements, consumer_output: Placements, mesh_shape: tuple[int, ...],
                 *, requires_grad: bool = True, regather: bool = False,
                 shares: Shares = None, compression: Compression | None = None
                 ) -> Redistribution:
        """The edge from a producer with output `src` to a consumer that reads it as `dst`
        and produces `consumer_output`, on a mesh of `mesh_shape` that cuts by `shares`;
        transfers from `formulas.edge_transfers`, compressed by `compression`
        (`compression.compressed_transfers`)."""
        shape, mesh_shape = tuple(shape), tuple(mesh_shape)
        src, dst = tuple(src), tuple(dst)
        if compression is not None and not dtype.is_floating_point:
            raise UnsupportedRedistributionError(
                f"{compression.name} compresses floating-point parameters only",
                expected="a float16, bfloat16 or float32 tensor", got=f"a {dtype} tensor",
                fix="plan again from this model: a plan compresses float parameters only")
        nbytes = uneven.tensor_bytes(TensorSpec(shape, dtype), mesh_shape, shares)
        regather_from = regather_source(compression, regather and requires_grad, src, dst,
                                        mesh_shape)
        transfers = formulas.edge_transfers(nbytes, src, dst, tuple(consumer_output), mesh_shape,
                                            requires_grad=requires_grad, regather=regather,
                                            regather_from=regather_from)
        # None: not executable; the step checks of __post_init__ then say why.
        transfers = transfers or ()
        if compression is not None:
            transfers = compressed_transfers(transfers, compression, dtype,
                                             local_shape(shape, src, mesh_shape), mesh_shape,
                                             regather=regather and regather_from is None)
        return cls(shape, dtype, mesh_shape, src, dst,
                   formulas.arriving_grad(dst, tuple(consumer_output)), formulas.needed_grad(src),
                   tuple(t for t in transfers if not t.backward),
                   tuple(t for t in transfers if t.backward),
                   requires_grad=requires_grad, regather=regather, shares=shares,
                   compression=compression, regather_from=regather_from)

    def __post_init__(self) -> None:
        forward_steps = redistribution_steps(self.src, self.dst, self.shape, self.mesh_shape,
                                             self.shares, self.compression, backward=False)
        backward_steps = (redistribution_steps(self.grad_arriving, self.grad_needed, self.shape,
                                               self.mesh_shape, self.shares, self.compression)
                          if self.requires_grad else ())
        object.__setattr__(self, "forward_steps", forward_steps)
        object.__setattr__(self, "backward_steps", backward_steps)
        gathers = [s for s in forward_steps if s.kind == "all_gather"]
        if self.regather and len(gathers) != len([s for s in forward_steps if s.kind]):
            raise UnsupportedRedistributionError(
                "a regathered parameter edge may only gather in the forward",
                expected="forward collectives that are all all_gather",
                got=self._describe(), fix="store the parameter in a placement that only "
                "needs all-gathers to reach its use, or do not regather it")
        again = self._regather_steps(gathers)
        self._check(self.forward, forward_steps, "forward")
        self._check(self.backward, again + list(backward_steps), "backward")

    def _regather_steps(self, gathers: list[Step]) -> list[Step]:
        """The backward's gathers of a regathered parameter (the forward's `gathers` again,
        or those from `regather_from`), with `keep_steps` and `regather_steps` set."""
        keep: tuple[Step, ...] = ()
        again = gathers if self.regather and self.requires_grad else []
        if again and self.regather_from is not None:
            keep = redistribution_steps(self.dst, self.regather_from, self.shape,
                                        self.mesh_shape, self.shares)
            again = list(redistribution_steps(self.regather_from, self.dst, self.shape,
                                              self.mesh_shape, self.shares))
            if any(s.kind is not None for s in keep) or \
                    any(s.kind not in (None, "all_gather") for s in again):
                raise UnsupportedRedistributionError(
                    "an in-node copy must be cut out locally and gathered back",
                    expected="local cuts to the copy, all-gathers from it",
                    got=f"{self._describe()} kept as {format_placements(self.regather_from)}",
                    fix="regather this edge from the stored piece (no hpz)")
        object.__setattr__(self, "keep_steps", keep)
        object.__setattr__(self, "regather_steps", tuple(again))
        return again

    def _check(self, transfers: tuple[formulas.Transfer, ...], steps: list[Step] | tuple[Step, ...],
               direction: str) -> None:
        # The steps are what runs; the transfers are what was charged: they must agree.
        charged = [(t.kind, t.axis) for t in transfers]
        performed = [(s.kind, s.axis) for s in steps if s.kind is not None]
        if charged != performed:
            raise RedistributionError(
                f"the {direction} transfers do not match the placements of the edge",
                expected=f"collectives {performed}", got=f"{charged} for {self._describe()}",
                fix="build the Redistribution with Redistribution.for_edge")

    def _describe(self) -> str:
        return (f"{format_placements(self.src)} -> {format_placements(self.dst)} "
                f"(grad {format_placements(self.grad_arriving)} -> "
                f"{format_placements(self.grad_needed)}) of shape {self.shape}")

    def __str__(self) -> str:
        return f"Redistribution({self._describe()}{', regather' if self.regather else ''})"
