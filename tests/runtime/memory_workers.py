"""Rank bodies of the memory fidelity checks: each rank compiles an example under a memory
budget, trains one AdamW step measuring what it holds (`autopar.runtime.memory_probe`), then
measures the peak of a whole step (`autopar.measure`); rank 0 also returns the plan's
prediction (`autopar.tools.predicted_memory.predicted_memory`).
Shared by
`tests/runtime/test_memory_fidelity.py` and `benchmarks/memory_fidelity.py` (module level,
so spawned processes can import it)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

import autopar
from autopar.runtime.memory_probe import SavedBytes, StateBytes, measure_step
from autopar.tools.predicted_memory import MemoryBreakdown, graph_of, predicted_memory


@dataclass(frozen=True)
class MemoryCase:
    """An example (`examples.<name>`), its build config, and the per-device memory budget
    the plan is made under (bytes; None: the hardware's)."""

    example: str
    build: tuple[tuple[str, object], ...] = ()
    memory_budget: float | None = None
    time_limit: float = 6.0  # the whole compile call (capture included)

    def model(self):
        return importlib.import_module(self.example).build(**dict(self.build))


@dataclass(frozen=True)
class Measured:
    """One rank's measurement of one case (`peak_bytes`: the most it held during a step);
    `predicted` and `plan` on rank 0 only."""

    saved: SavedBytes
    state: StateBytes
    peak_bytes: int
    predicted: MemoryBreakdown | None
    plan: dict | None


def measure_cases(rank: int, cases: tuple[MemoryCase, ...], shape: tuple[int, ...],
                  names: tuple[str, ...]) -> list[Measured]:
    """Every case on this rank (under `autopar.launch`), in one process start."""
    mesh = autopar.Mesh(shape, names, hardware="cpu")
    results = []
    for case in cases:
        torch.manual_seed(0)
        model, inputs = case.model()
        # One forward is probed: the step whole, not micro-batches run inside the call.
        pm = autopar.compile(model, mesh, inputs, memory_budget=case.memory_budget,
                             time_limit=case.time_limit, microbatches=1)
        optimizer = torch.optim.AdamW(pm.parameters(), lr=1e-5)
        saved, state = measure_step(pm, optimizer, inputs)
        peak = autopar.measure(pm, inputs, steps=1, warmup=1, optimizer=optimizer)
        predicted = predicted_memory(pm.plan, graph_of(model, inputs)) if rank == 0 else None
        results.append(Measured(saved, state, peak.peak_memory_bytes, predicted,
                                pm.plan.to_dict() if rank == 0 else None))
    return results
