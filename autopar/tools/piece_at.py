"""`PieceAt`: a rank's piece of a tensor, as torch.distributed.checkpoint writes and reads
it, at its own offset in the whole tensor.

A parameter cut by a mesh axis's shares (`autopar.values.placement`) has pieces no
DTensor has: DTensor places piece i at DTensor's chunk offsets. DCP asks a tensor for its
pieces through three hooks (`__create_write_items__`, `__create_chunk_list__`,
`__get_tensor_shard__`, which DTensor implements); `PieceAt` answers them with the piece's
own offset, so DCP saves it and reshards it on load (into any plan, DTensors included)
as it does DTensors. It is a tensor of the whole tensor's size holding no data of its
own: DCP reads its size and hooks, and every other op on it is refused.

`global_view` is what DCP is given of any piece: a `PieceAt` where shares cut it, a
DTensor where DTensor's chunks do, the piece itself where it is whole. DCP's asynchronous
save copies a state to memory with ops `PieceAt` refuses; `in_memory` makes that copy
instead, every piece a `PieceAt`.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from autopar.errors import CheckpointError
from autopar.values.placement import Placements, Shares, cut_by_shares, piece_offsets


class PieceAt(torch.Tensor):
    """`piece` of a tensor of `shape`, starting at `offsets` (one per dim)."""

    _piece: torch.Tensor
    _offsets: torch.Size

    @staticmethod
    def __new__(cls, piece: torch.Tensor, shape: tuple[int, ...], offsets: tuple[int, ...]):
        made = torch.Tensor._make_wrapper_subclass(cls, torch.Size(shape), dtype=piece.dtype,
                                                   device=piece.device)
        made._piece, made._offsets = piece, torch.Size(offsets)
        return made

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise CheckpointError(f"a piece placed by shares is read only by DCP, not by {func}",
                              fix="take the piece from the compiled model instead")

    def _chunk(self) -> ChunkStorageMetadata:
        return ChunkStorageMetadata(offsets=self._offsets, sizes=self._piece.size())

    def __create_write_items__(self, fqn: str, obj) -> list[WriteItem]:
        return [WriteItem(index=MetadataIndex(fqn, self._offsets), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(
                              chunk=self._chunk(),
                              properties=TensorProperties.create_from_tensor(self._piece),
                              size=self.size()))]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [self._chunk()]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        return self._piece

    def __repr__(self) -> str:
        return (f"PieceAt(shape={tuple(self.shape)}, offsets={tuple(self._offsets)}, "
                f"piece={tuple(self._piece.shape)})")


def global_view(piece: torch.Tensor, placements: Placements, shape: tuple[int, ...], mesh,
                shares: Shares = None) -> torch.Tensor:
    """`piece`, placed `placements` on the DeviceMesh `mesh` cut by `shares`, as the whole
    tensor of `shape` DCP sees (module docstring)."""
    if mesh is None or tuple(piece.shape) == tuple(shape):
        return piece
    if cut_by_shares(placements, shares):
        return PieceAt(piece, shape, piece_offsets(shape, placements, tuple(mesh.shape),
                                                   tuple(mesh.get_coordinate()), shares))
    return DTensor.from_local(piece, mesh, list(placements), run_check=False,
                              shape=torch.Size(shape),
                              stride=torch.empty(shape, device="meta").stride())


def in_memory(state: dict) -> dict:
    """`state` (a DCP state dict of tensors, DTensors and `PieceAt`s) copied to CPU
    memory, every DTensor as the `PieceAt` of its local piece; other values as they are."""
    copied = {}
    for name, value in state.items():
        if isinstance(value, PieceAt):
            value = PieceAt(_copy(value._piece), tuple(value.shape), tuple(value._offsets))
        elif isinstance(value, DTensor):
            _, offsets = compute_local_shape_and_global_offset(
                value.shape, value.device_mesh, value.placements)
            value = PieceAt(_copy(value.to_local()), tuple(value.shape), tuple(offsets))
        elif isinstance(value, torch.Tensor):
            value = _copy(value)
        copied[name] = value
    return copied


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True)
