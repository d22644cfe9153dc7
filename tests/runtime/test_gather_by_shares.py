"""All-gathers of pieces cut by a mesh axis's shares return the whole tensor, waited on
at once or later (a gather started ahead of its use, `autopar.runtime.prefetch`): the
pieces travel padded to the largest, and where a longer piece follows a shorter one they
are laid end to end only once the gather is done."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from autopar.runtime.axis_ops import start_all_gather
from autopar.runtime.launch import launch
from autopar.runtime.shards import local_piece
from autopar.runtime.steps import redistribution_steps
from autopar.values.placement import Replicate, Shard

SHAPE = (64, 3)


def _gathered(rank: int, shares: tuple, async_op: bool) -> bool:
    mesh = init_device_mesh("cpu", (4,))
    full = torch.arange(SHAPE[0] * SHAPE[1], dtype=torch.float32).reshape(SHAPE)
    piece = local_piece(full, (Shard(0),), (4,), (rank,), shares)
    step, = redistribution_steps((Shard(0),), (Replicate(),), SHAPE, (4,), shares)
    out, work, _ = start_all_gather(piece, step, mesh, async_op=async_op)
    if work is not None:
        work.wait()
    return torch.equal(out, full)


@pytest.mark.parametrize("weights", [(3, 3, 1, 1), (1, 3, 3, 1), (1, 1, 1, 1)])
@pytest.mark.parametrize("async_op", [True, False], ids=["ahead", "at-once"])
def test_a_gather_of_pieces_cut_by_shares_is_the_whole_tensor(weights, async_op):
    assert launch(_gathered, 4, (weights,), async_op) == [True] * 4
