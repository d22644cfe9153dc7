"""What `test_throughput_compiled` runs on every rank: the batch a throughput plan chose,
compiled from that plan on a real model and decoded greedily."""

from __future__ import annotations

import copy

import generation_cases as cases
import torch

import autopar


def decode_at_planned_batch(rank: int, plan: dict, shape: tuple[int, ...],
                            axes: tuple[str, ...]) -> tuple[list, list]:
    """Ids `autopar.generate` appends to prompts of the plan's batch, and transformers'."""
    made = autopar.Plan.from_dict(plan)
    batch = made.serving_batch
    lm = cases.build("llama")
    reference = copy.deepcopy(lm)
    served = autopar.CachedLM(lm, batch=batch, max_len=cases.MAX_LEN)
    ids = torch.randint(0, cases.VOCAB, (batch, cases.PROMPT),
                        generator=torch.Generator().manual_seed(1))
    pm = autopar.compile(served, autopar.Mesh(shape, axes, hardware="cpu"),
                         (ids[:, :1], torch.tensor([0])), training=False, plan=made)
    ours = autopar.generate(pm, ids, max_new_tokens=8)
    with torch.no_grad():
        expected = reference.generate(ids, max_new_tokens=8, do_sample=False,
                                      cache_implementation="static", pad_token_id=0)
    return ours.tolist(), expected.tolist()
