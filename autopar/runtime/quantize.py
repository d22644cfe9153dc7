"""int8 block quantization of a parameter's piece for its all-gather ("int8-gather",
`autopar.values.compression`).

A piece, flattened, is cut into blocks of `QUANT_BLOCK` elements (the last one shorter);
each block is sent as int8 values round(x / s), s = its largest magnitude / 127 (1 for an
all-zero block), with s in `SCALE_DTYPE`. What arrives is the values times their block's
scale, in the piece's dtype: `round_trip` is what a rank's piece becomes, the rounding a
reference computation applies to compare against the parallel program.
"""

from __future__ import annotations

import math

import torch

from autopar.values.compression import QUANT_BLOCK, SCALE_DTYPE


def quantize(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 values (as many as `flat` has elements) and the per-block scales of the
    1-D tensor `flat`."""
    blocks = math.ceil(flat.numel() / QUANT_BLOCK)
    padded = flat.new_zeros(blocks * QUANT_BLOCK)
    padded[:flat.numel()] = flat
    padded = padded.view(blocks, QUANT_BLOCK).to(SCALE_DTYPE)
    scales = padded.abs().amax(dim=1, keepdim=True) / 127
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    values = torch.round(padded / scales).to(torch.int8)
    return values.view(-1)[:flat.numel()], scales.view(-1)


def dequantize(values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype
               ) -> torch.Tensor:
    """The tensor of `dtype` that `quantize` encoded as `values` and `scales`: 1-D, or
    one row per piece where both have a leading dim of pieces."""
    numel, blocks = values.shape[-1], scales.shape[-1]
    padded = values.new_zeros((*values.shape[:-1], blocks * QUANT_BLOCK))
    padded[..., :numel] = values
    out = padded.view(*values.shape[:-1], blocks, QUANT_BLOCK).to(SCALE_DTYPE) \
        * scales.unsqueeze(-1)
    return out.flatten(-2)[..., :numel].to(dtype)


def round_trip(piece: torch.Tensor) -> torch.Tensor:
    """`piece` as the other ranks receive it: quantized and dequantized over its
    contiguous flattening."""
    flat = piece.detach().contiguous().view(-1)
    return dequantize(*quantize(flat), piece.dtype).view(piece.shape)


class DequantizingWork:
    """The two all-gathers of int8 values and scales in flight; `wait` waits for both and
    writes the dequantized pieces into `out` ((n, E) rows, one per rank)."""

    def __init__(self, works: tuple, values: torch.Tensor, scales: torch.Tensor,
                 out: torch.Tensor) -> None:
        self._works, self._values, self._scales, self._out = works, values, scales, out

    def wait(self) -> None:
        for work in self._works:
            work.wait()
        n = self._out.shape[0]
        self._out.copy_(dequantize(self._values.view(n, -1), self._scales.view(n, -1),
                                   self._out.dtype))
