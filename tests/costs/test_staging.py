"""Staging buffers of redistributions: the formula step by step and over several steps (the
problem charges them: tests/passes/problem/test_edge_memory.py)."""

from __future__ import annotations

import pytest

from autopar.costs.staging import staging_bytes, step_staging
from autopar.values.placement import Partial, Replicate, Shard

MB = 2**20


@pytest.mark.parametrize(("kind", "dim", "expected"), [
    ("all_reduce", 1, 0.0), ("all_gather", 0, 0.0), ("reduce_scatter", 0, 0.0),
    ("all_gather", 2, 400.0), ("reduce_scatter", 1, 100.0), ("all_to_all", 0, 100.0),
    (None, 1, 0.0)])
def test_each_step_stages_what_the_runtime_lays_out(kind, dim, expected):
    assert step_staging(kind, dim, 100.0, 400.0) == expected


def test_a_gather_along_dim_0_stages_nothing_and_along_another_dim_the_result():
    assert staging_bytes(8 * MB, (Shard(0),), (Replicate(),), (4,)) == 0
    assert staging_bytes(8 * MB, (Shard(1),), (Replicate(),), (4,)) == 8 * MB


def test_an_all_to_all_stages_the_pieces_received():
    assert staging_bytes(8 * MB, (Shard(0),), (Shard(1),), (2,)) == 4 * MB


def test_a_reduce_scatter_along_another_dim_stages_its_input_laid_out():
    assert staging_bytes(8 * MB, (Partial(),), (Shard(1),), (4,)) == 8 * MB


def test_a_conversion_of_two_steps_also_holds_the_first_result_during_the_second():
    # Gathers run innermost axis first: axis 1 gathers S(0) (2 MB -> 4 MB, no staging),
    # then axis 0 gathers S(1) (4 MB -> 8 MB) with the 4 MB result of the first beside
    # its staging (8 MB) and its result (8 MB): 20 MB at most, 12 MB beyond the result.
    assert staging_bytes(8 * MB, (Shard(1), Shard(0)), (Replicate(), Replicate()),
                         (2, 2)) == 12 * MB


def test_local_conversions_stage_nothing():
    assert staging_bytes(8 * MB, (Replicate(),), (Shard(1),), (4,)) == 0
    assert staging_bytes(8 * MB, (Replicate(),), (Partial(),), (4,)) == 0
    assert staging_bytes(8 * MB, (Shard(0),), (Shard(0),), (4,)) == 0
