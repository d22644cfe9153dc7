"""Golden plans: every example x mesh x hardware of `golden_cases.CASES` plans exactly as
its committed record in `tests/golden/plans/` says (placements equal, predicted costs within
0.1%), the pipelined cases (`PIPELINED_CASES`) their stages and schedule too, and the
forward-only ones (`INFERENCE_CASES`, `training=False`) as they serve. A failure
prints what changed. When a change is intended, regenerate the records on
purpose and commit them with the change:

    python -m pytest tests/golden --regen-golden
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from golden_cases import (
    CASES,
    INFERENCE_CASES,
    PIPELINED_CASES,
    TIME_LIMIT,
    GoldenCase,
    differences,
    record,
)

import autopar
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture
from autopar.planning.graph import plan_graph

PLANS = Path(__file__).parent / "plans"


@functools.cache
def _graph(example: str):
    # One capture per example serves its four (mesh, hardware) cases.
    case = next(c for c in CASES if c.example == example)
    model, inputs = case.build()
    return annotate(capture(model, inputs)), type(model).__name__


def current_record(case: GoldenCase) -> dict:
    if case.pipeline is not None or not case.training:
        # A pipeline captures the model at one micro-batch; inference in eval mode.
        model, inputs = case.build()
        return record(case, autopar.plan(model, case.mesh_value(), inputs,
                                         time_limit=TIME_LIMIT, training=case.training,
                                         pipeline=case.pipeline or "auto"))
    gm, model_name = _graph(case.example)
    plan = plan_graph(gm, case.mesh_value(), model_name=model_name, time_limit=TIME_LIMIT)
    return record(case, plan)


# The pipelined Llama-7B case (about 20 s: 32 layers captured at a micro-batch) is --slow.
@pytest.mark.parametrize("case", [*CASES, *INFERENCE_CASES, *(
    pytest.param(case, marks=pytest.mark.slow) if case.example == "llama" else case
    for case in PIPELINED_CASES)], ids=lambda c: c.name)
def test_plan_matches_its_golden_record(case: GoldenCase, request) -> None:
    path = PLANS / f"{case.name}.json"
    current = current_record(case)
    if request.config.getoption("--regen-golden"):
        PLANS.mkdir(exist_ok=True)
        path.write_text(json.dumps(current, indent=1) + "\n")
        return
    assert path.exists(), (f"no golden record for {case.name}: create it with "
                           "python -m pytest tests/golden --regen-golden")
    changed = differences(json.loads(path.read_text()), current)
    assert not changed, (
        f"the plan of {case.name} changed:\n  " + "\n  ".join(changed[:40])
        + (f"\n  ... and {len(changed) - 40} more" if len(changed) > 40 else "")
        + "\nIf this is intended, regenerate: python -m pytest tests/golden --regen-golden")


def test_every_golden_record_has_a_case() -> None:
    # A record left behind by a removed case would never be checked again.
    names = {case.name for case in CASES + PIPELINED_CASES + INFERENCE_CASES}
    stale = sorted(p.stem for p in PLANS.glob("*.json") if p.stem not in names)
    assert not stale, f"golden records without a case: {stale}; delete them"
