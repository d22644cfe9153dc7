"""The cost model's sizes of tensors cut unevenly (`autopar.costs.uneven`)."""

from __future__ import annotations

import torch

from autopar.costs import formulas, uneven
from autopar.values.placement import Partial, Replicate, Shard
from autopar.values.specs import TensorSpec

R, S0, P = Replicate(), Shard(0), Partial()


def test_only_a_tensor_some_cut_makes_uneven_is_sized_by_its_shape():
    assert type(uneven.tensor_bytes(TensorSpec((64, 8), torch.float32), (4,))) is int
    odd = uneven.tensor_bytes(TensorSpec((50257, 8), torch.float32), (4,))
    assert isinstance(odd, uneven.TensorBytes) and int(odd) == 50257 * 8 * 4
    # With shares every cut of the axis is sized by its pieces.
    assert isinstance(uneven.tensor_bytes(TensorSpec((64, 8), torch.float32), (4,),
                                          ((3, 3, 1, 1),)), uneven.TensorBytes)


def test_equal_bytes_of_other_shapes_are_other_sizes():
    a, b = uneven.TensorBytes((6, 4), 4), uneven.TensorBytes((4, 6), 4)
    assert int(a) == int(b) and a != b and hash(a) != hash(b) and a == 96


def test_a_rank_holds_and_moves_the_largest_piece():
    odd = uneven.TensorBytes((50257, 8), 4)
    assert formulas.local_bytes(odd, (S0,), (4,)) == 12565 * 8 * 4
    (gather,) = formulas.redistribute(odd, (S0,), (R,), (4,))
    assert gather.nbytes == 4 * 12565 * 8 * 4  # every piece padded to the largest
    (scatter,) = formulas.redistribute(odd, (P,), (S0,), (4,))
    assert scatter.nbytes == 4 * 12565 * 8 * 4
    (reduce,) = formulas.redistribute(odd, (P,), (R,), (4,))
    assert reduce.nbytes == int(odd)


def test_an_ops_load_is_its_largest_piece_over_an_even_share():
    odd = uneven.TensorBytes((6, 4), 4, ((2, 1),))
    assert uneven.imbalance(odd, (S0,), (2,)) == 4 / 3  # 4 of 6 rows, against 3
    assert uneven.imbalance(odd, (S0,), (2,), (1,)) == 2 / 3
    assert uneven.imbalance(96, (S0,), (2,)) == 1.0
