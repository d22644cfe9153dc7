"""A throughput plan (`objective="throughput"`, made on the meta device) compiles on real
ranks for the batch it chose: a `CachedLM` of that batch, compiled with the plan, decodes
what transformers decodes, on every rank of a gloo (2,) mesh."""

from __future__ import annotations

import generation_cases as cases
import throughput_workers as workers
import torch

import autopar
from autopar.runtime.launch import launch


def test_a_throughput_plan_compiles_at_the_batch_it_chose():
    with torch.device("meta"):
        served = autopar.CachedLM(cases.build("llama"), batch=2, max_len=cases.MAX_LEN)
        inputs = (torch.zeros(2, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    mesh = autopar.Mesh((2,), ("tp",), hardware="cpu")
    # A budget of a few sequences' cache beyond the weights: the batch is chosen by memory.
    plan = autopar.plan(served, mesh, inputs, training=False, objective="throughput",
                        memory_budget=0.6 * cases.one_device_peak("llama"), time_limit=5.0)
    batch = plan.serving_batch
    assert batch > 2 and dict(plan.serving).get(2 * batch) == 0.0
    results = launch(workers.decode_at_planned_batch, 2, plan.to_dict(), (2,), ("tp",),
                     timeout=600.0)
    for ours, expected in results:
        assert len(ours) == batch and ours == expected
