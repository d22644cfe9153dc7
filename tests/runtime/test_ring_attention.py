"""Ring attention on gloo ranks equals the whole attention, forward and backward, and
moves the bytes the cost model's `Ring` predicts."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from ring_workers import Case, expected_bytes, run_cases

from autopar.runtime.launch import launch

CASES = {
    "causal": Case(causal=True),
    "full": Case(causal=False),
    "causal-gqa": Case(causal=True, heads=4, kv_heads=2),
    "causal-odd-rows": Case(causal=True, length=18),
    "full-scaled": Case(causal=False, scale=0.3),
    "causal-bf16": Case(causal=True, dtype=torch.bfloat16),
    "masked": Case(causal=False, masked=True),
    "masked-gqa": Case(causal=False, masked=True, heads=4, kv_heads=1),
    "longer-keys": Case(causal=False, length=12, key_length=36),
}


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_attention_equals_whole_attention(world):
    cases = tuple(dataclasses.replace(c, length=c.length // world * world)
                  for c in CASES.values())
    results = launch(run_cases, world, cases, timeout=300.0)
    for per_rank in results:
        for name, case, result in zip(CASES, cases, per_rank):
            tolerance = 1e-2 if case.dtype == torch.bfloat16 else 1e-10
            assert result.out_error < tolerance, (name, result)
            assert max(result.grad_errors) < tolerance, (name, result)
            assert result.sent == expected_bytes(case, world), (name, result.sent)
