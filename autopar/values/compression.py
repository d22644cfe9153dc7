"""Compressed collectives a plan may choose, per tensor: what each does and what it costs in
exactness.

`compression=` of `plan` and `compile` says which the solver may choose: None (the
default) none, so that plans stay exact; "auto" every one; a tuple of names those.

- "bf16-reduce": a parameter's gradient is reduced (all-reduced, or reduce-scattered for a
  parameter stored sharded) in bfloat16 and cast back to its dtype: half the bytes of an
  fp32 gradient. The error is bfloat16's rounding (8 bits of mantissa, a relative 2^-9 at
  most) of each rank's gradient and of each partial sum the backend forms.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from autopar.errors import PlanningError


@dataclass(frozen=True)
class Compression:
    """One compressed collective: `name`, what it compresses, the dtype a reduction runs in
    (`reduce_dtype`), and its expected error in words (`error`)."""

    name: str
    compresses: str
    reduce_dtype: torch.dtype
    error: str

    def applies_to(self, dtype: torch.dtype) -> bool:
        """Whether it makes a gradient of `dtype` smaller."""
        return dtype.is_floating_point and dtype.itemsize > self.reduce_dtype.itemsize


COMPRESSIONS = {
    "bf16-reduce": Compression(
        "bf16-reduce", "gradient reductions in bfloat16", torch.bfloat16,
        "bfloat16 rounding of each rank's gradient and each partial sum (2^-9 relative)"),
}


def check_compression(compression: object) -> tuple[Compression, ...]:
    """The compressions `compression` allows (module docstring); `PlanningError` for any
    other value or an unknown name."""
    if compression is None:
        return ()
    if compression == "auto":
        return tuple(COMPRESSIONS.values())
    names = (compression,) if isinstance(compression, str) else compression
    if not isinstance(names, (tuple, list)) or not names:
        raise PlanningError("compression must be None, 'auto' or a tuple of names",
                            expected=f"None, 'auto' or names out of {sorted(COMPRESSIONS)}",
                            got=repr(compression), fix="e.g. compression=('bf16-reduce',)")
    unknown = [name for name in names if name not in COMPRESSIONS]
    if unknown:
        raise PlanningError(f"unknown compression {unknown[0]!r}",
                            expected=f"names out of {sorted(COMPRESSIONS)}",
                            got=repr(compression), fix="use one of the names listed")
    return tuple(COMPRESSIONS[name] for name in dict.fromkeys(names))
