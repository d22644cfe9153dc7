"""`autopar.costs.compression`: the bytes compressed collectives move, against the
formulas of its docstring."""

from __future__ import annotations

import torch

from autopar.costs.compression import (
    codec_bytes,
    compressed_transfers,
    low_rank_bytes,
    quantized_bytes,
    secondary_copy,
    secondary_pieces,
    state_bytes,
)
from autopar.costs.formulas import Transfer, edge_transfers
from autopar.costs.optimizer_state import optimizer_state
from autopar.passes.problem.op_costs import parameter_bytes
from autopar.passes.strategies.find_strategies import Strategy
from autopar.values.compression import BF16_REDUCE, HPZ, INT8_GATHER, powersgd
from autopar.values.mesh import Mesh
from autopar.values.placement import Replicate, Shard
from autopar.values.specs import TensorSpec


def test_bf16_halves_the_backward_reductions_only():
    transfers = (Transfer("all_gather", 0, 4096, False), Transfer("reduce_scatter", 0, 4096, True))
    out = compressed_transfers(transfers, BF16_REDUCE, torch.float32, (32, 32), (2,))
    assert [t.nbytes for t in out] == [4096, 2048]


def test_int8_gathers_move_one_byte_an_element_and_a_scale_a_block():
    # 2 pieces of 300 fp32 elements: 300 int8 each and 2 fp32 scales (blocks of 256).
    assert quantized_bytes(2 * 300 * 4, 4, 2) == 2 * (300 + 2 * 4)
    gather = Transfer("all_gather", 0, 2400, False)
    again = Transfer("all_gather", 0, 2400, True)
    scatter = Transfer("reduce_scatter", 0, 2400, True)
    regathered = compressed_transfers((gather, again, scatter), INT8_GATHER, torch.float32,
                                      (300,), (2,), regather=True)
    assert [t.nbytes for t in regathered] == [616, 616, 2400]
    # Without a regather, a backward all-gather is a gradient's: not quantized.
    kept = compressed_transfers((gather, again), INT8_GATHER, torch.float32, (300,), (2,))
    assert [t.nbytes for t in kept] == [616, 2400]


def test_powersgd_replaces_the_last_all_reduce_by_p_and_q():
    local = (1024, 512)
    assert low_rank_bytes(local, 4, 4) == (1024 + 512) * 4 * 4
    inner = Transfer("all_reduce", 1, 1024 * 512 * 4, True)
    outer = Transfer("all_reduce", 0, 1024 * 512 * 4, True)
    out = compressed_transfers((inner, outer), powersgd(4), torch.float32, local, (2, 8))
    assert out[0] == inner and out[1].axis == 0 and out[1].nbytes == (1024 + 512) * 16
    # A forward collective, or a matrix too small to pay, leaves the edge exact.
    gather = Transfer("all_gather", 1, 64, False)
    assert compressed_transfers((gather, outer), powersgd(4), torch.float32, local,
                                (2, 8)) == (gather, outer)
    small = Transfer("all_reduce", 0, 16 * 16 * 4, True)
    assert compressed_transfers((small,), powersgd(4), torch.float32, (16, 16),
                                (2,)) == (small,)


def test_powersgd_keeps_its_error_and_p_q_between_steps():
    assert state_bytes(powersgd(2), (100, 50), 4) == (100 * 50 + 150 * 2) * 4
    assert state_bytes(BF16_REDUCE, (100, 50), 4) == 0


def test_hpz_copies_the_read_cut_over_the_innermost_gathered_axis():
    r, s0, s1 = Replicate(), Shard(0), Shard(1)
    assert secondary_copy((s0, s0), (r, r), (2, 8)) == (r, s0)
    assert secondary_copy((s0, s0, s1), (r, r, r), (2, 4, 8)) == (r, r, s1)
    # A size-1 axis gathers nothing; one axis gathered leaves nothing to copy.
    assert secondary_copy((s0, s0), (r, r), (1, 8)) is None
    assert secondary_copy((s0, s1), (r, s1), (2, 8)) is None
    assert secondary_pieces((s0, s1), (2, 8)) == 8
    assert secondary_pieces((r, s1), (2, 8)) == 1


def test_hpz_regathers_once_over_the_inner_axis_the_whole_read():
    # A 4 MiB parameter stored S(0), S(0) on (2, 8): the forward gathers over both axes;
    # the backward, from the copy, over the gpu axis alone, the whole read (4 MiB).
    nbytes, r, s0 = 4 * 2**20, Replicate(), Shard(0)
    plain = edge_transfers(nbytes, (s0, s0), (r, r), (r, r), (2, 8), requires_grad=False,
                           regather=False)
    copied = edge_transfers(nbytes, (s0, s0), (r, r), (r, r), (2, 8), requires_grad=True,
                            regather=True, regather_from=(r, s0))
    again = [(t.kind, t.axis, t.nbytes) for t in copied if t.backward and t.kind == "all_gather"]
    assert again == [("all_gather", 1, nbytes)]
    assert [t for t in copied if not t.backward] == list(plain)
    assert codec_bytes(HPZ, 2**20, 4, 2, pieces=8) == 2 * 2**20 * 4 / 8


def test_hpz_copies_are_charged_per_saving_use_and_micro_batch_in_flight():
    # A 1 MiB fp32 weight stored S(0), S(0) on (2, 8): each copy is cut 8 ways (128 KiB).
    spec, mesh = TensorSpec((512, 512), torch.float32), Mesh((2, 8), ("node", "gpu"))
    optimizer = optimizer_state(torch.optim.SGD)
    stored = (Shard(0), Shard(0))
    plain = Strategy(inputs=(), output=stored)
    copied = Strategy(inputs=(), output=stored, compression="hpz")
    base = parameter_bytes(spec, plain, mesh, optimizer, 2, 2)
    copy = 2**20 / 8
    assert parameter_bytes(spec, copied, mesh, optimizer, 2, 2) == base + 2 * copy
    assert parameter_bytes(spec, copied, mesh, optimizer, 2, 2, in_flight=3) == \
        base + 3 * 2 * copy
    assert parameter_bytes(spec, copied, mesh, optimizer, 0, 2) == base  # nothing saves it
