"""Collective steps of the runtime (`autopar.runtime.axis_ops`) on real gloo ranks."""

from __future__ import annotations

import torch

import autopar
from autopar.runtime import device_mesh
from autopar.runtime.axis_ops import apply_step, piece_of
from autopar.runtime.counter import CommCounter
from autopar.runtime.launch import launch
from autopar.runtime.steps import redistribution_steps
from autopar.values.placement import Shard


def _whole() -> torch.Tensor:
    return torch.arange(4 * 6 * 3 * 5, dtype=torch.float32).reshape(4, 6, 3, 5)


def _all_to_all_channels_last(rank: int) -> torch.Tensor:
    # Rank r holds channels piece r of a channels-last batch (as a CNN's gradients are
    # laid out) and receives batch piece r with every channel.
    mesh = device_mesh(autopar.Mesh((2,), ("x",)))
    mine = _whole().chunk(2, 1)[rank].contiguous(memory_format=torch.channels_last)
    (step,) = redistribution_steps((Shard(1),), (Shard(0),), tuple(_whole().shape), (2,))
    return apply_step(mine, step, mesh, CommCounter(), "forward")


def test_an_all_to_all_of_a_channels_last_tensor_moves_its_pieces():
    received = launch(_all_to_all_channels_last, 2, timeout=120.0)
    for rank, piece in enumerate(received):
        torch.testing.assert_close(piece, _whole().chunk(2, 0)[rank], rtol=0, atol=0)


def test_pieces_follow_dtensor_chunking():
    # 7 rows in 4: 2, 2, 2, 1; 10 in 4: 3, 3, 3, 1 (torch.chunk's sizes).
    whole = torch.arange(70).reshape(7, 10)
    for dim in (0, 1):
        assert [piece_of(whole, dim, 4, i).shape[dim] for i in range(4)] == \
            [c.shape[dim] for c in whole.chunk(4, dim)]
        torch.testing.assert_close(torch.cat([piece_of(whole, dim, 4, i) for i in range(4)],
                                             dim), whole)
