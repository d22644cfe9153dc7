"""Splits that do not divide, and pieces sized to the devices, train exactly.

- transformers' GPT-2 with its vocabulary of 50257 split over 4 ranks, on (4,) and over both
  axes of (2, 2) (DTensor's chunks: 12565, 12565, 12565, 12562; over (2, 2), 25129 and 25128,
  then 12565 and 12564, and 12564 twice), the embedding (tied to the output head) pinned
  split by rows; and a GPT-2 of 6 heads on 4 ranks under half its replicated peak;
- a batch of 6 over 4 data-parallel ranks, cut 2, 2, 1, 1 by the mesh's shares;
- a mesh declared half h100-sxm, half a100-sxm, whose batch the planner cuts by the kinds'
  speed (the profile sizes the pieces; the numerics do not depend on it);
- the same mixed mesh as one tensor-parallel group cut 3, 3, 1, 1, under half the
  replicated peak: the parameters are stored in pieces sized by the shares.

Each rank compiles the model and trains 3 AdamW steps: the loss and every gradient match
the single-process model within `TOLERANCE`, and the bytes moved equal the plan's on the
rank holding the longest pieces (the plan's figures are its) and are no more on the others.
"""

from __future__ import annotations

import dataclasses

import pytest
from equivalence_cases import (
    Case,
    check_bytes,
    check_equivalence,
    replicated_peak,
    train_all,
)

import autopar
from autopar.runtime.launch import launch

VOCAB = 50257
TABLE = "lm.transformer.wte.weight"
BUDGET = 0.5  # of the replicated plan's peak: the plan must shard
MIXED = ["h100-sxm", "h100-sxm", "a100-sxm", "a100-sxm"]


def _gpt2(**config) -> Case:
    return Case("hf_models", build=(("name", "gpt2"), *config.items()))


# (shape, axis names, hardware, shares) -> cases, one launch each.
LAUNCHES = {
    ((4,), ("tp",), "cpu", None): (
        dataclasses.replace(_gpt2(vocab=VOCAB), constraints=((TABLE, "S(0)"),)),
        _gpt2(heads=6, width=96)),
    ((2, 2), ("dp", "tp"), "cpu", None): (
        dataclasses.replace(_gpt2(vocab=VOCAB), constraints=((TABLE, "S(0),S(0)"),)),),
    ((4,), ("dp",), "cpu", ((2, 2, 1, 1),)): (_gpt2(batch=6),),
    ((4,), ("dp",), tuple(MIXED), None): (_gpt2(batch=32),),
    ((4,), ("tp",), tuple(MIXED), ((3, 3, 1, 1),)): (_gpt2(batch=8, heads=4, width=128),),
}


def _budgeted(case: Case) -> Case:
    """The GPT-2s of given heads under half their replicated peak (they must shard); the
    others as they are (pinned, or data parallel)."""
    return case if not dict(case.build).get("heads") else dataclasses.replace(
        case, memory_budget=BUDGET * replicated_peak(case))


def _label(key) -> str:
    shape, _, hardware, shares = key
    kind = "mixed" if isinstance(hardware, tuple) else hardware
    return "x".join(map(str, shape)) + f"-{kind}" + ("-shares" if shares else "")


@pytest.fixture(scope="module", params=list(LAUNCHES), ids=_label)
def outcomes(request):
    shape, names, hardware, shares = request.param
    cases = tuple(map(_budgeted, LAUNCHES[request.param]))
    mixed = list(hardware) if isinstance(hardware, tuple) else hardware
    return request.param, cases, launch(train_all, 4, cases, shape, names, mixed, shares,
                                        timeout=900.0)


def test_loss_and_every_gradient_match_the_single_process_model(outcomes):
    _, cases, results = outcomes
    check_equivalence(cases, results)


def test_bytes_are_the_plans_on_the_rank_of_the_longest_pieces(outcomes):
    _, cases, results = outcomes
    check_bytes(cases, results, uneven=True)


def test_the_plans_split_unevenly(outcomes):
    key, cases, results = outcomes
    for case, outcome in zip(cases, results[0]):
        plan = autopar.Plan.from_dict(outcome.plan)
        assert plan.comm_bytes(), case
        if key[3] is not None and key[1] == ("tp",):  # parameters stored cut by the shares
            assert [n for n in plan.nodes if n.role == "parameter" and n.pieces], case
        if dict(case.build).get("heads") == 6:
            continue  # 6 heads in 4 would leave a piece empty: other dims split
        assert [n for n in plan.nodes if n.pieces], case
        if case.constraints:
            table = next(n for n in plan.nodes if n.role == "parameter" and "wte" in n.module)
            assert table.output.count("S(0)") == len(dict(case.constraints)[TABLE].split(","))
            assert table.pieces.startswith("dim 0: 12565")
        if key[2] != "cpu":  # cut by the kinds' speed: the H100s take more of the batch
            weights = plan.mesh.shares[0]
            assert weights[0] == weights[1] > weights[2] == weights[3], weights
