"""Steps run as micro-batches train exactly like the single-process model, with the bytes
the plan predicts.

A plan of M micro-batches runs each call as M forwards and backwards of one micro-batch
(gradient accumulation): replicated parameters' gradient all-reduces are deferred to the
last micro-batch (counted once per step), ZeRO-3 gathers run per micro-batch, and ZeRO-1
parameters are gathered once per step and their whole gradient reduce-scattered once. The
cases are the solver's plans under budgets where it chooses each of these: on (4,), the MLP
with its linears pinned batch-split and the Llama-style example choose ZeRO-1, the
GPT-style one ZeRO-2; on (2, 2), GPT-style and Llama-style plans mix tensor parallelism,
ZeRO-3 storage and data parallelism. As in `test_equivalence`: 3 AdamW steps, losses and
every gradient within relative 1e-5 of the plain model (whose loss is the mean over the
whole batch: the micro-batches' losses are weighted by their counts of targets), measured
bytes per (kind, axis, direction) equal to the plan's times the steps.
"""

from __future__ import annotations

import functools
import importlib

import pytest
from equivalence_cases import Case, check_bytes, check_equivalence, train_all

import autopar
from autopar.runtime.launch import launch

MESHES = {(4,): ("x",), (2, 2): ("dp", "tp")}
PINNED = (("linear", "S(0)"), ("linear_1", "S(0)"))
# (example, build, pins, micro-batches, fraction of the unconstrained plan's peak memory)
CASES = {
    (4,): (("examples.mlp", (("batch", 16), ("hidden", 64), ("ffn", 256)), PINNED, 4, 0.85),
           ("examples.llama", (("batch", 8),), (), 4, 0.7),
           ("examples.gpt", (("batch", 8),), (), 4, 0.8)),
    (2, 2): (("examples.gpt", (("batch", 4),), (), 2, 0.3),
             ("examples.llama", (("batch", 4),), (), 4, 0.3)),
}


@functools.cache
def _plan(example: str, build: tuple, pins: tuple, microbatches: int, fraction: float,
          shape: tuple[int, ...]) -> autopar.Plan:
    model, inputs = importlib.import_module(example).build(**dict(build))
    mesh = autopar.Mesh(shape, MESHES[shape], hardware="cpu")
    options = dict(microbatches=microbatches, constraints=dict(pins) or None, time_limit=3.0)
    whole = autopar.plan(model, mesh, inputs, **options).peak_memory_bytes
    return autopar.plan(model, mesh, inputs, memory_budget=fraction * whole, **options)


@pytest.fixture(scope="module", params=list(MESHES), ids=lambda s: "x".join(map(str, s)))
def outcomes(request):
    shape = request.param
    chosen = tuple(Case(example, build=build, plan=_plan(example, build, pins, count, fraction,
                                                         shape).to_dict())
                   for example, build, pins, count, fraction in CASES[shape])
    results = launch(train_all, 4, chosen, shape, MESHES[shape], timeout=600.0)
    return shape, chosen, results


def _plans(chosen) -> list[autopar.Plan]:
    return [autopar.Plan.from_dict(case.plan) for case in chosen]


def test_the_plans_run_micro_batches_with_each_storage(outcomes):
    shape, chosen, _ = outcomes
    plans = _plans(chosen)
    assert all(plan.microbatches > 1 for plan in plans)
    if shape == (4,):
        mlp, llama, gpt = plans
        assert any(n.whole_gradient for n in mlp.nodes)  # ZeRO-1
        assert any(n.whole_gradient for n in llama.nodes)
        assert any(n.gathered and not n.whole_gradient for n in gpt.nodes)  # ZeRO-2
    else:
        for plan in plans:
            kinds = {(kind, axis) for kind, axis, _ in plan.comm_bytes()}
            assert {("all_gather", "dp"), ("all_reduce", "tp")} <= kinds, kinds


def test_loss_and_every_gradient_match_the_single_process_model(outcomes):
    _, chosen, results = outcomes
    check_equivalence(chosen, results)


def test_measured_bytes_equal_the_plan_gathers_per_micro_batch_reductions_per_step(outcomes):
    _, chosen, results = outcomes
    check_bytes(chosen, results)
    for plan in _plans(chosen):
        for node in plan.nodes:
            for transfer in node.transfers:
                source = plan.node(transfer.tensor)
                reads = [t for t in node.transfers if t.tensor == transfer.tensor]
                # A replicated parameter's one all-reduce waits for the last micro-batch.
                deferred = source.role == "parameter" and len(reads) == 1 \
                    and (transfer.kind, transfer.backward) == ("all_reduce", True)
                once = deferred or source.whole_gradient
                assert transfer.calls == (1 if once else plan.microbatches), \
                    (node.name, transfer)
