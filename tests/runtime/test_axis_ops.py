"""Collective steps of the runtime (`autopar.runtime.axis_ops`) on real gloo ranks."""

from __future__ import annotations

import torch

from autopar.runtime import axis_ops
from autopar.runtime.launch import launch


def _whole() -> torch.Tensor:
    return torch.arange(4 * 6 * 3 * 5, dtype=torch.float32).reshape(4, 6, 3, 5)


def _all_to_all_channels_last(rank: int) -> torch.Tensor:
    # Rank r holds channels piece r of a channels-last batch (as a CNN's gradients are
    # laid out) and receives batch piece r with every channel.
    mine = _whole().chunk(2, 1)[rank].contiguous(memory_format=torch.channels_last)
    return axis_ops._all_to_all(mine, 1, 0, 2, None)


def test_an_all_to_all_of_a_channels_last_tensor_moves_its_pieces():
    received = launch(_all_to_all_channels_last, 2, timeout=120.0)
    for rank, piece in enumerate(received):
        torch.testing.assert_close(piece, _whole().chunk(2, 0)[rank], rtol=0, atol=0)
