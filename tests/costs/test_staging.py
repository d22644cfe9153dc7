"""Staging buffers of redistributions: the formula step by step and over several steps (the
problem charges them: tests/passes/problem/test_edge_memory.py)."""

from __future__ import annotations

from autopar.costs.staging import staging_bytes
from autopar.values.placement import Partial, Replicate, Shard

MB = 2**20


def test_a_gather_along_dim_0_stages_nothing_and_along_another_dim_the_result():
    assert staging_bytes(8 * MB, (Shard(0),), (Replicate(),), (4,)) == 0
    assert staging_bytes(8 * MB, (Shard(1),), (Replicate(),), (4,)) == 8 * MB


def test_an_all_to_all_stages_the_pieces_received():
    assert staging_bytes(8 * MB, (Shard(0),), (Shard(1),), (2,)) == 4 * MB


def test_a_reduce_scatter_along_another_dim_stages_its_input_laid_out():
    assert staging_bytes(8 * MB, (Partial(),), (Shard(1),), (4,)) == 8 * MB


def test_a_conversion_of_two_steps_also_holds_the_first_result_during_the_second():
    # Gathers run innermost axis first: axis 1 gathers S(0) into its result (2 MB -> 4 MB),
    # then axis 0 gathers S(1): that 4 MB, its copy laid out dim 1 first and the 8 MB
    # gathered are held at once (16 MB), as are the gathered and its final copy: 8 MB
    # beyond the result.
    assert staging_bytes(8 * MB, (Shard(1), Shard(0)), (Replicate(), Replicate()),
                         (2, 2)) == 8 * MB


def test_gathers_along_one_dim_lay_the_tensor_out_once():
    # (S(1), S(1)) -> (R, R): the first gather copies its 2 MB input dim 1 first and
    # gathers 4 MB; the second reads that buffer as it is and gathers 8 MB beside it
    # (12 MB); the last copy holds 16 MB: 8 MB beyond the result, not the 12 MB of a
    # copy laid out before each gather.
    assert staging_bytes(8 * MB, (Shard(1), Shard(1)), (Replicate(), Replicate()),
                         (2, 2)) == 8 * MB


def test_an_all_reduce_stages_nothing():
    assert staging_bytes(8 * MB, (Partial(),), (Replicate(),), (4,)) == 0


def test_local_conversions_stage_nothing():
    assert staging_bytes(8 * MB, (Replicate(),), (Shard(1),), (4,)) == 0
    assert staging_bytes(8 * MB, (Replicate(),), (Partial(),), (4,)) == 0
    assert staging_bytes(8 * MB, (Shard(0),), (Shard(0),), (4,)) == 0
