"""Compressed collectives a plan may choose, per parameter: what each does and what it
costs in exactness.

`compression=` of `plan` and `compile` says which the solver may choose: None (the
default) none, so that plans stay exact; "auto" every one (PowerSGD at its default rank);
a tuple of names those.

- "bf16-reduce": a parameter's gradient is reduced (all-reduced, or reduce-scattered for a
  parameter stored sharded) in bfloat16 and cast back to its dtype: half the bytes of an
  fp32 gradient. The error is bfloat16's rounding (8 bits of mantissa, a relative 2^-9 at
  most) of each rank's gradient and of each partial sum the backend forms.
- "int8-gather": a parameter stored sharded (ZeRO-3) is all-gathered as int8 in blocks of
  `QUANT_BLOCK` elements of its flattened piece, each with an fp32 scale (its largest
  magnitude / 127), and dequantized to its dtype after the gather (ZeRO++'s qwZ): a quarter
  of the bytes of an fp32 parameter, plus the scales. The error is half a quantization step
  per element: at most 1/254 of the largest magnitude in its block. Gradients are exact
  for the rounded weights (the rounding is not differentiated: a straight-through copy).
- "hpz": a parameter stored sharded over two axes or more (ZeRO-3 over (node, gpu)) that
  is gathered again for the backward is gathered there from a copy of its own, cut over
  the innermost axis it is gathered on alone (the node's fast link), kept from the
  forward's gather to the backward (ZeRO++'s hpZ: hierarchical partitioning). The backward
  then gathers over that axis only, at the price of the copy's memory. Exact: only where
  the parameter is gathered from changes.
- Several of "bf16-reduce", "int8-gather" and "hpz" may go on one parameter where each is
  allowed, named together: "int8-gather+hpz" (int8 gathers in the forward, the copy, cut
  from the dequantized weight, gathered whole in the backward: ZeRO++'s qwZ with its
  hpZ), "bf16-reduce+int8-gather+hpz" (its gradients reduced in bfloat16 too).
- "powersgd" / "powersgd-R": a data-parallel gradient all-reduce of a matrix (a parameter
  of two dims or more, viewed as dim 0 by the rest) sends a rank-R approximation P Q^T
  instead: two all-reduces of (n + m) x R elements (torch's PowerSGD communication hook,
  with error feedback and warm start). R is given, or `POWERSGD_RANK`: the solver prices
  time only, so it would always take the lowest rank; the accuracy a rank keeps is the
  user's call. The first `POWERSGD_WARMUP` steps reduce exactly. The error is that of a
  rank-R approximation of each step's gradient, fed back into the next step's.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import torch

from autopar.errors import PlanningError

# Elements per int8 block, each with its own scale (ZeRO++ quantizes blocks of 256 to 2048).
QUANT_BLOCK = 256
SCALE_DTYPE = torch.float32
# PowerSGD's rank when none is given (the PowerSGD paper's largest needed to match the
# uncompressed accuracy), and the exact steps before it starts (torch's hook needs >= 2).
POWERSGD_RANK = 4
POWERSGD_WARMUP = 10
# torch's hook compresses a matrix only where (n + m) x R x this < n x m.
POWERSGD_MIN_RATE = 2
_POWERSGD = re.compile(r"powersgd(?:-(-?\d+))?$")


@dataclass(frozen=True)
class Compression:
    """One compressed collective, or several on one parameter: `name`, what it compresses
    (`compresses`, words), its expected error in words (`error`), and its `kind`:
    "reduce" (gradient reductions run in `reduce_dtype`), "gather" (parameter gathers in
    int8 blocks), "secondary" (the backward's gathers from an in-node copy,
    `keeps_copy`) or "low-rank" (PowerSGD of rank `rank`). A combination (`combined`:
    "bf16-reduce+int8-gather+hpz", ZeRO++'s three together) has the kinds of its `parts`
    joined by "+" (`kinds`)."""

    name: str
    kind: str
    compresses: str
    error: str
    reduce_dtype: torch.dtype | None = None
    rank: int = 0
    keeps_copy: bool = False
    parts: tuple[Compression, ...] = ()

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.kind.split(COMBINED))

    def applies_to(self, shape: tuple[int, ...], dtype: torch.dtype) -> bool:
        """Whether it makes a parameter of `shape` and `dtype` move fewer bytes (gather: an
        fp16/bf16/fp32 tensor; low-rank: a matrix that PowerSGD compresses; secondary:
        any, its bytes move over a faster link instead; a combination: every part)."""
        if self.parts:
            return all(part.applies_to(shape, dtype) for part in self.parts)
        if self.kind == "secondary":
            return True
        if not dtype.is_floating_point:
            return False
        if self.kind == "reduce":
            return dtype.itemsize > self.reduce_dtype.itemsize
        if self.kind == "gather":
            return dtype.itemsize > 1
        return compresses_matrix(shape, self.rank)


def matrix_of(shape: tuple[int, ...]) -> tuple[int, int]:
    """The matrix PowerSGD views a tensor of `shape` as: dim 0 by the rest."""
    return shape[0], math.prod(shape[1:])


def compresses_matrix(shape: tuple[int, ...], rank: int) -> bool:
    """Whether torch's PowerSGD hook compresses a gradient of `shape` at `rank`."""
    if len(shape) < 2:
        return False
    n, m = matrix_of(shape)
    return (n + m) * min(n, m, rank) * POWERSGD_MIN_RATE < n * m


BF16_REDUCE = Compression(
    "bf16-reduce", "reduce", "gradient reductions in bfloat16",
    "bfloat16 rounding of each rank's gradient and each partial sum (2^-9 relative)",
    reduce_dtype=torch.bfloat16)
INT8_GATHER = Compression(
    "int8-gather", "gather", "parameter all-gathers in int8 blocks",
    f"int8 rounding in blocks of {QUANT_BLOCK}: at most 1/254 of each block's largest "
    "magnitude")

HPZ = Compression(
    "hpz", "secondary", "ZeRO-3 parameters' backward all-gathers, from a copy split over "
    "the innermost axis only", "none: exact (only what the backward gathers from changes)",
    keeps_copy=True)
# Names of compressions combined on one parameter are joined by this, in this order of
# kinds (PowerSGD combines with none: it replaces the all-reduce the others would cast).
COMBINED, COMBINABLE = "+", ("reduce", "gather", "secondary")


def combined(parts: tuple[Compression, ...]) -> Compression:
    """The compressions `parts` (of distinct combinable kinds) on one parameter."""
    parts = tuple(sorted(parts, key=lambda c: COMBINABLE.index(c.kind)))
    reduce = next((c.reduce_dtype for c in parts if c.reduce_dtype is not None), None)
    return Compression(COMBINED.join(c.name for c in parts),
                       COMBINED.join(c.kind for c in parts),
                       "; ".join(c.compresses for c in parts),
                       "; ".join(c.error for c in parts if c.kind != "secondary"),
                       reduce_dtype=reduce, keeps_copy=any(c.keeps_copy for c in parts),
                       parts=parts)


def powersgd(rank: int) -> Compression:
    """PowerSGD of `rank` (module docstring)."""
    return Compression(f"powersgd-{rank}", "low-rank",
                       f"data-parallel gradient all-reduces as rank-{rank} PowerSGD",
                       f"a rank-{rank} approximation of each gradient, its error fed back "
                       "into the next step's", rank=rank)


COMPRESSIONS = {c.name: c for c in (BF16_REDUCE, INT8_GATHER, HPZ)}
NAMES = (*COMPRESSIONS, "powersgd", "powersgd-R")


@functools.lru_cache(maxsize=64)
def compression_named(name: str) -> Compression | None:
    """The compression `name` stands for (a plan's record of it), None for an unknown name
    or a PowerSGD rank below 1. Memoized: the cost passes and the lowering ask it per
    edge."""
    if name in COMPRESSIONS:
        return COMPRESSIONS[name]
    if COMBINED in name:
        parts = tuple(COMPRESSIONS.get(part) for part in name.split(COMBINED))
        if None in parts or len({c.kind for c in parts}) < len(parts):
            return None
        return combined(parts)
    found = _POWERSGD.match(name)
    if found is None:
        return None
    rank = POWERSGD_RANK if found.group(1) is None else int(found.group(1))
    return powersgd(rank) if rank >= 1 else None


def check_compression(compression: object, model: torch.nn.Module | None = None
                      ) -> tuple[Compression, ...]:
    """The compressions `compression` allows (module docstring); `PlanningError` for any
    other value, an unknown name, a PowerSGD rank below 1, or one named that is larger
    than every trained matrix of `model` (when given; "auto" offers PowerSGD where it
    fits)."""
    found = _named(compression)
    if model is not None and compression != "auto":
        check_rank_fits(found, [tuple(p.shape) for p in model.parameters() if p.requires_grad])
    return found


def _named(compression: object) -> tuple[Compression, ...]:
    if compression is None:
        return ()
    if compression == "auto":
        return (*COMPRESSIONS.values(), powersgd(POWERSGD_RANK))
    names = (compression,) if isinstance(compression, str) else compression
    if not isinstance(names, (tuple, list)) or not names \
            or not all(isinstance(name, str) for name in names):
        raise PlanningError("compression must be None, 'auto' or a tuple of names",
                            expected=f"None, 'auto' or names out of {list(NAMES)}",
                            got=repr(compression), fix="e.g. compression=('bf16-reduce',)")
    found = []
    for name in dict.fromkeys(names):
        one = compression_named(name)
        if one is None and _POWERSGD.match(name):
            raise PlanningError(f"PowerSGD's rank must be at least 1 in {name!r}",
                                expected="powersgd-R with R >= 1, e.g. powersgd-4",
                                got=repr(name), fix="give a rank of 1 or more")
        if one is None:
            raise PlanningError(f"unknown compression {name!r}",
                                expected=f"names out of {list(NAMES)}",
                                got=repr(compression), fix="use one of the names listed")
        found.append(one)
    return tuple(found)


def check_rank_fits(compressions: tuple[Compression, ...],
                    shapes: list[tuple[int, ...]]) -> None:
    """`PlanningError` when a PowerSGD rank is given that no trained matrix of `shapes`
    (the model's parameters) is large enough for: each would be reduced exactly."""
    for compression in compressions:
        if compression.kind != "low-rank":
            continue
        sides = [min(matrix_of(s)) for s in shapes if len(s) >= 2]
        if not sides or compression.rank > max(sides):
            raise PlanningError(
                f"PowerSGD's rank {compression.rank} is larger than every matrix it would "
                "approximate",
                expected=f"a rank up to {max(sides)}, the model's largest matrix side"
                if sides else "a model with a parameter of two dims or more",
                got=f"{compression.name}", fix="give a smaller rank, e.g. powersgd-4")
