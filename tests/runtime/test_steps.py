"""Step planning, the Redistribution value and the counter: no processes needed."""

from __future__ import annotations

import itertools

import pytest
import torch

from autopar.costs import formulas
from autopar.errors import AutoparError, ShardingError
from autopar.runtime import (
    CommCounter,
    Redistribution,
    RedistributionError,
    UnsupportedRedistributionError,
    local_shape,
    redistribution_steps,
    transfer_totals,
)
from autopar.values.placement import Partial, Replicate, Shard, parse_placements

R, P, S0, S1 = Replicate(), Partial(), Shard(0), Shard(1)
AXIS = (R, P, S0, S1)


def assert_helpful(error: AutoparError) -> None:
    text = str(error)
    assert "expected:" in text and "got:" in text and "fix:" in text, text


@pytest.mark.parametrize("mesh_shape", [(4,), (2, 2), (2, 4)])
def test_steps_perform_the_cost_models_collectives_in_its_order(mesh_shape):
    shape = (8, 8)
    supported = 0
    for src in itertools.product(AXIS, repeat=len(mesh_shape)):
        for dst in itertools.product(AXIS, repeat=len(mesh_shape)):
            try:
                steps = redistribution_steps(src, dst, shape, mesh_shape)
            except UnsupportedRedistributionError:
                assert len(mesh_shape) > 1
                continue
            supported += 1
            charged = formulas.redistribute(512, src, dst, mesh_shape)
            assert [(s.kind, s.axis) for s in steps if s.kind] == [
                (t.kind, t.axis) for t in charged]
    assert supported > 0


def test_inner_axis_of_a_doubly_sharded_dim_converts_alone():
    (step,) = redistribution_steps((S0, S0), (S0, R), (8, 8), (2, 2))
    assert (step.axis, step.kind) == (1, "all_gather")
    (step,) = redistribution_steps((S0, R), (S0, S0), (8, 8), (2, 2))
    assert (step.axis, step.kind) == (1, None)  # a local chunk of the outer chunk


def test_a_doubly_sharded_dim_is_gathered_inner_axis_first():
    steps = redistribution_steps((S0, S0), (R, R), (8, 8), (2, 2))
    assert [(s.axis, s.kind) for s in steps] == [(1, "all_gather"), (0, "all_gather")]


@pytest.mark.parametrize("src, dst", [
    ((S0, S0), (R, S0)),   # outer axis unshards dim 0 while the inner one still cuts it
    ((R, S0), (S0, S0)),   # outer chunking under an existing inner cut: not a local slice
])
def test_outer_axis_of_a_doubly_sharded_dim_is_refused(src, dst):
    with pytest.raises(UnsupportedRedistributionError) as info:
        redistribution_steps(src, dst, (8, 8), (2, 2))
    assert isinstance(info.value, NotImplementedError)
    assert_helpful(info.value)


def test_bad_placements():
    with pytest.raises(ShardingError) as info:
        redistribution_steps((R,), (Shard(2),), (4, 8), (2,))
    assert_helpful(info.value)
    with pytest.raises(ShardingError):
        redistribution_steps((R, R), (S0,), (4, 8), (2, 2))
    with pytest.raises(UnsupportedRedistributionError):
        redistribution_steps((Partial("max"),), (R,), (4, 8), (2,))


def test_local_shape():
    assert local_shape((8, 6), (S0, S0), (2, 2)) == (2, 6)
    assert local_shape((8, 6), (P, S1), (2, 3)) == (8, 2)
    # Uneven: DTensor's chunks, outer axis first; rank 0 (no coordinate) the longest.
    assert local_shape((7, 6), (S0, S0), (2, 2)) == (2, 6)
    assert local_shape((7, 6), (S0, S0), (2, 2), (1, 1)) == (1, 6)
    assert local_shape((7, 6), (S0, S0), (2, 2), (1, 0)) == (2, 6)


def test_uneven_steps_know_the_whole_dim_of_their_group():
    # 7 rows over (2, 2): the outer pieces are 4 and 3, so the inner axis gathers 4 or 3.
    (step,) = redistribution_steps((S0, S0), (S0, R), (7, 6), (2, 2))
    assert step.whole(0, (2, 2), (0, 1)) == 4
    assert step.whole(0, (2, 2), (1, 0)) == 3


def test_edge_holds_the_cost_models_transfers():
    r = Redistribution.for_edge((8, 4), torch.float32, (S0,), (R,), (S1,), (4,))
    assert r.forward == (formulas.Transfer("all_gather", 0, 128, False),)
    assert r.backward == (formulas.Transfer("reduce_scatter", 0, 128, True),)
    assert (r.grad_arriving, r.grad_needed) == ((P,), (S0,))
    again = Redistribution.for_edge((8, 4), torch.float32, (S0,), (R,), (S1,), (4,),
                                    regather=True)
    assert [t.kind for t in again.backward] == ["all_gather", "reduce_scatter"]
    off = Redistribution.for_edge((8, 4), torch.float32, (S0,), (R,), (S1,), (4,),
                                  requires_grad=False)
    assert off.backward == () and off.backward_steps == ()


def test_transfers_that_disagree_with_the_placements_are_refused():
    with pytest.raises(RedistributionError) as info:
        Redistribution((8, 4), torch.float32, (4,), (S0,), (R,), (P,), (S0,), (), (),
                       requires_grad=True)
    assert_helpful(info.value)


def test_regathered_edge_may_only_gather():
    with pytest.raises(UnsupportedRedistributionError):
        Redistribution.for_edge((8, 4), torch.float32, (S0,), (S1,), (S1,), (4,),
                                regather=True)


def test_counter_and_transfer_totals():
    counter = CommCounter()
    counter.record("all_gather", "tp", "forward", 100)
    counter.record("all_gather", "tp", "forward", 28)
    counter.record("all_reduce", "dp", "backward", 64)
    assert counter.totals() == {("all_gather", "tp", "forward"): 128,
                                ("all_reduce", "dp", "backward"): 64}
    assert counter.calls()[("all_gather", "tp", "forward")] == 2
    assert counter.nbytes(direction="backward") == 64 and counter.nbytes() == 192
    counter.reset()
    assert counter.totals() == {}
    transfers = formulas.edge_transfers(1024, parse_placements("S(0),R"),
                                        parse_placements("R,R"), parse_placements("R,S(0)"),
                                        (2, 4), requires_grad=True)
    assert transfer_totals(transfers, ("dp", "tp")) == {
        ("all_gather", "dp", "forward"): 1024,  # the grad arrives R on dp: a local slice
        ("all_reduce", "tp", "backward"): 512}  # and P on tp, reduced after the slice
