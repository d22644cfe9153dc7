"""Splits that do not divide train exactly: transformers' GPT-2 with its vocabulary of 50257
split over 4 ranks, on (4,) and over both axes of (2, 2), and a GPT-2 of 6 heads on 4 ranks.

Pieces follow DTensor's chunking: 50257 rows in 4 are 12565, 12565, 12565 and 12562; over
(2, 2), 25129 and 25128, then 12565 and 12564, and 12564 twice. Each rank compiles the model
(the embedding, tied to the output head, pinned split by rows where the case says so) and
trains 3 AdamW steps: the loss and every gradient match the single-process model within
`TOLERANCE`, and the bytes moved equal the plan's on rank 0 (which holds the longest pieces:
the plan's figures are its) and are no more on the others.
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


def _gpt2(**config) -> Case:
    return Case("hf_models", build=(("name", "gpt2"), *config.items()))


LAUNCHES = {
    ((4,), ("tp",)): (
        dataclasses.replace(_gpt2(vocab=VOCAB), constraints=((TABLE, "S(0)"),)),
        _gpt2(heads=6, width=96)),
    ((2, 2), ("dp", "tp")): (
        dataclasses.replace(_gpt2(vocab=VOCAB), constraints=((TABLE, "S(0),S(0)"),)),),
}


def _budgeted(case: Case) -> Case:
    return case if case.constraints else dataclasses.replace(
        case, memory_budget=BUDGET * replicated_peak(case))


@pytest.fixture(scope="module", params=list(LAUNCHES), ids=lambda key: "x".join(map(str, key[0])))
def outcomes(request):
    shape, names = request.param
    cases = tuple(map(_budgeted, LAUNCHES[request.param]))
    return cases, launch(train_all, 4, cases, shape, names, timeout=900.0)


def test_loss_and_every_gradient_match_the_single_process_model(outcomes):
    check_equivalence(*outcomes)


def test_bytes_are_the_plans_on_the_rank_of_the_longest_pieces(outcomes):
    check_bytes(*outcomes, uneven=True)


def test_the_vocabulary_is_split_unevenly(outcomes):
    cases, results = outcomes
    for case, outcome in zip(cases, results[0]):
        plan = autopar.Plan.from_dict(outcome.plan)
        if case.constraints:
            table = next(n for n in plan.nodes if n.role == "parameter" and "wte" in n.module)
            assert table.output.count("S(0)") == len(dict(case.constraints)[TABLE].split(","))
        assert plan.comm_bytes(), case
