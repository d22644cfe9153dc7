"""`check_compression`: the names a plan's `compression=` takes, and what it refuses."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autopar.errors import PlanningError
from autopar.values.compression import POWERSGD_RANK, check_compression, compression_named


def test_auto_allows_each_kind_powersgd_at_its_default_rank():
    found = check_compression("auto")
    assert [c.kind for c in found] == ["reduce", "gather", "secondary", "low-rank"]
    assert found[-1].rank == POWERSGD_RANK


@pytest.mark.parametrize(("name", "rank"), [("powersgd", POWERSGD_RANK), ("powersgd-2", 2),
                                            ("powersgd-16", 16)])
def test_powersgd_names_give_their_rank(name, rank):
    (found,) = check_compression((name,))
    assert found.rank == rank and found.name == f"powersgd-{rank}"
    assert compression_named(found.name) == found  # a plan's record reads back


@pytest.mark.parametrize("name", ["powersgd-0", "powersgd--1"])
def test_a_rank_below_one_is_refused(name):
    with pytest.raises(PlanningError, match="rank must be at least 1"):
        check_compression(name)


def test_a_named_rank_larger_than_every_matrix_is_refused_but_auto_fits():
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 3))  # matrices of sides 2 and 3
    with pytest.raises(PlanningError, match="rank 4 is larger than every matrix"):
        check_compression("powersgd", model)
    assert check_compression(("powersgd-2",), model)[0].rank == 2
    assert len(check_compression("auto", model)) == 4


def test_compressions_apply_to_what_they_make_smaller():
    bf16, int8, hpz, low_rank = check_compression("auto")
    assert hpz.applies_to((8,), torch.int64)  # its bytes go over the faster link instead
    assert bf16.applies_to((4, 4), torch.float32) and not bf16.applies_to((4, 4), torch.bfloat16)
    assert int8.applies_to((8,), torch.bfloat16) and not int8.applies_to((8,), torch.int64)
    assert low_rank.applies_to((1024, 1024), torch.float32)
    assert not low_rank.applies_to((16, 16), torch.float32)  # (16 + 16) x 4 x 2 >= 256
    assert not low_rank.applies_to((4096,), torch.float32)


def test_compressions_combine_on_one_parameter_in_a_fixed_order():
    found = compression_named("hpz+bf16-reduce+int8-gather")
    assert found.name == "bf16-reduce+int8-gather+hpz"
    assert found.kinds == ("reduce", "gather", "secondary")
    assert found.keeps_copy and found.reduce_dtype == torch.bfloat16
    assert compression_named(found.name) == found  # a plan's record reads back
    assert "hpz" not in found.error  # exact: only the rounding parts have an error
    assert found.applies_to((4, 4), torch.float32) and not found.applies_to((4,), torch.int8)


@pytest.mark.parametrize("name", ["int8-gather+int8-gather", "powersgd+hpz", "hpz+zip"])
def test_combinations_of_a_kind_twice_or_with_powersgd_are_unknown(name):
    assert compression_named(name) is None
    with pytest.raises(PlanningError, match="unknown compression"):
        check_compression((name,))
