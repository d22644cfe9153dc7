"""What a compressed collective moves, computes and holds (`autopar.values.compression`).

For a parameter of itemsize s whose edge moves per-rank buffers of B bytes over an axis of
n devices:

    reduce (bf16-reduce)    each backward all-reduce or reduce-scatter moves B x r / s,
                            r the reduce dtype's itemsize
    gather (int8-gather)    each all-gather of the parameter (the forward's, and the
                            backward's repeat of it where the parameter is gathered again)
                            moves n (E + c ceil(E / K)), E = B / (n s) elements per piece,
                            K = QUANT_BLOCK elements per scale of c bytes
    low-rank (powersgd-R)   where the edge's collectives are backward all-reduces alone
                            (one per axis replicating the parameter, inner axes first),
                            the last one (the outermost axis: across nodes on a (node,
                            gpu) mesh) of a local gradient viewed as an N x M matrix moves
                            (N + M) R' s, R' = min(N, M, R), where that is less than half
                            N M (torch's hook sends smaller ones whole): P then Q, charged
                            as one transfer (the second call's latency with the codec's
                            time); the all-reduces before it stay exact
    secondary (hpz)         a parameter gathered into `read` over two axes or more keeps
                            a copy at `secondary_copy(output, read)` (`read` cut n ways
                            on the innermost of those axes) from the forward to the
                            backward, which gathers it back over that axis alone: one
                            all-gather of the read's local bytes on that axis's link
                            (the node's fast one) instead of every forward gather again.
                            The copy holds 1/n of the read's local bytes per use that
                            saves the parameter, cut out of the gathered tensor (read
                            and written once)

Encoding and decoding (and hpz's cut) are memory-bound passes over the tensor
(`codec_bytes`); PowerSGD's two products and its orthogonalisation are FLOPs
(`codec_flops`). PowerSGD keeps an error of the local gradient's size and its P and Q
between steps (`state_bytes`).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from autopar.costs.formulas import Transfer
from autopar.values.compression import (
    QUANT_BLOCK,
    SCALE_DTYPE,
    Compression,
    compresses_matrix,
    matrix_of,
)
from autopar.values.placement import Placements, Replicate, Shard


def compressed_transfers(transfers: tuple[Transfer, ...], compression: Compression,
                         dtype: torch.dtype, local: tuple[int, ...],
                         mesh_shape: tuple[int, ...], *, regather: bool = False
                         ) -> tuple[Transfer, ...]:
    """`transfers` of one edge out of a parameter of `dtype`, whose local piece (as its
    reductions see it) has shape `local`, with `compression` applied (module docstring;
    a combination, each of its kinds; "secondary" leaves them: the regather's are its own,
    `edge_transfers(regather_from=)`); `regather`: the backward starts with a repeat of
    the forward's all-gathers."""
    if "reduce" in compression.kinds:
        ratio = compression.reduce_dtype.itemsize / dtype.itemsize
        transfers = tuple(dataclasses.replace(t, nbytes=t.nbytes * ratio)
                          if t.backward and t.kind in ("all_reduce", "reduce_scatter") else t
                          for t in transfers)
    if "gather" in compression.kinds:
        transfers = _quantized_gathers(transfers, dtype, mesh_shape, regather)
    if "low-rank" not in compression.kinds or not transfers or any(
            not t.backward or t.kind != "all_reduce" for t in transfers) \
            or not compresses_matrix(local, compression.rank):
        return transfers  # reduced otherwise, or a piece too small: not compressed
    return (*transfers[:-1], dataclasses.replace(transfers[-1], nbytes=low_rank_bytes(
        local, compression.rank, dtype.itemsize)))


def _quantized_gathers(transfers: tuple[Transfer, ...], dtype: torch.dtype,
                       mesh_shape: tuple[int, ...], regather: bool) -> tuple[Transfer, ...]:
    """`transfers` with the forward's all-gathers, and their repeats in the backward where
    the parameter is `regather`ed, in int8 blocks (`quantized_bytes`)."""
    gathers = sum(t.kind == "all_gather" and not t.backward for t in transfers)
    repeats = gathers if regather else 0
    out = []
    for t in transfers:
        if t.kind == "all_gather" and (not t.backward or repeats > 0):
            repeats -= t.backward
            t = dataclasses.replace(t, nbytes=quantized_bytes(
                t.nbytes, dtype.itemsize, mesh_shape[t.axis]))
        out.append(t)
    return tuple(out)


def quantized_bytes(nbytes, itemsize: int, n: int):
    """The bytes an all-gather of `nbytes` (n pieces of `itemsize` elements) moves as int8
    blocks with their scales."""
    elements = nbytes / (n * itemsize)
    return n * (elements + SCALE_DTYPE.itemsize * math.ceil(elements / QUANT_BLOCK))


def low_rank_bytes(local: tuple[int, ...], rank: int, itemsize: int) -> int:
    """The bytes PowerSGD's P and Q all-reduces move for a gradient of shape `local`."""
    n, m = matrix_of(local)
    return (n + m) * min(n, m, rank) * itemsize


def codec_bytes(compression: Compression, numel: int, itemsize: int, gathers: int,
                pieces: int = 1) -> float:
    """Bytes read and written encoding and decoding one parameter of `numel` elements per
    step: reduce, a cast in and out (each pass reads one dtype, writes the other); gather,
    `gathers` quantize-dequantize round trips; with hpz's copy (`keeps_copy`), the copy
    of `numel / pieces` elements cut out at the forward's gather; low-rank, the error
    added and kept, the decompressed gradient written (three passes); a combination, the
    sum of its kinds'."""
    moved = 2 * numel * itemsize / pieces if compression.keeps_copy and pieces > 1 else 0.0
    if "gather" in compression.kinds:
        moved += 2 * gathers * numel * (itemsize + 1)
    if "reduce" in compression.kinds:
        moved += 2 * numel * (itemsize + compression.reduce_dtype.itemsize)
    if "low-rank" in compression.kinds:
        moved += 3 * 2 * numel * itemsize
    return moved


def codec_flops(compression: Compression, local: tuple[int, ...]) -> float:
    """FLOPs of PowerSGD's products M Q, M^T P and P Q^T with its Gram-Schmidt of P and Q
    (4 N R^2 + 4 M R^2); 0 for the other kinds."""
    if "low-rank" not in compression.kinds or len(local) < 2:
        return 0.0
    n, m = matrix_of(local)
    rank = min(n, m, compression.rank)
    return 3 * 2 * n * m * rank + 4 * (n + m) * rank * rank


def state_bytes(compression: Compression, local: tuple[int, ...], itemsize: int) -> float:
    """Bytes kept between steps: PowerSGD's error feedback (the local gradient's size) and
    its P and Q (warm start); none for the other kinds."""
    if "low-rank" not in compression.kinds or len(local) < 2:
        return 0.0
    n, m = matrix_of(local)
    return (n * m + (n + m) * min(n, m, compression.rank)) * itemsize


def secondary_copy(output: Placements, read: Placements, mesh_shape: tuple[int, ...]
                   ) -> Placements | None:
    """The placements of the copy "hpz" keeps of a parameter stored as `output` and
    gathered into `read` (module docstring): `read`, cut as `output` on the innermost axis
    the gather runs on; None where the gather runs on fewer than two axes (the copy would
    then be the stored piece itself, or the gathered tensor: ZeRO-3 or ZeRO-2)."""
    gathered = [axis for axis, (o, r, n) in enumerate(zip(output, read, mesh_shape))
                if n > 1 and o != r]
    if len(gathered) < 2:
        return None
    inner = gathered[-1]
    if not (isinstance(output[inner], Shard) and isinstance(read[inner], Replicate)):
        return None
    return tuple(output[inner] if axis == inner else r for axis, r in enumerate(read))


def regather_source(compression: Compression | None, regather: bool, output: Placements,
                    read: Placements, mesh_shape: tuple[int, ...]) -> Placements | None:
    """Where the backward gathers a parameter stored as `output`, read as `read`, from:
    hpz's copy (`secondary_copy`) where `compression` keeps one and the edge is
    `regather`ed; None for the stored piece (the cost model and the runtime both ask)."""
    if not regather or compression is None or not compression.keeps_copy:
        return None
    return secondary_copy(output, read, mesh_shape)


def secondary_pieces(output: Placements, mesh_shape: tuple[int, ...]) -> int:
    """How many pieces "hpz"'s copy of a parameter stored as `output` and gathered whole
    is cut into (the innermost axis it is sharded on; 1 where it has no copy)."""
    whole = tuple(Replicate() for _ in output)
    copy = secondary_copy(output, whole, mesh_shape)
    return 1 if copy is None else next(n for p, n in zip(copy, mesh_shape) if p != Replicate())
