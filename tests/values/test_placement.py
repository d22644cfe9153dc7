"""Placement text form."""

import pytest

from autopar.errors import ShardingError
from autopar.values.placement import (
    Partial,
    Replicate,
    Shard,
    format_placements,
    parse_placements,
    shard_count,
)


def test_round_trip():
    placements = (Shard(2), Replicate(), Partial())
    assert format_placements(placements) == "S(2),R,P"
    assert parse_placements("S(2),R,P") == placements


def test_bad_text_is_a_sharding_error():
    with pytest.raises(ShardingError, match="S\\(<dim>\\)"):
        parse_placements("S(x),R")


def test_shard_count_multiplies_axes_on_the_same_dim():
    assert shard_count((Shard(0), Shard(0), Shard(1)), (2, 3, 4), 0) == 6
    assert shard_count((Shard(0), Shard(0), Shard(1)), (2, 3, 4), 1) == 4
