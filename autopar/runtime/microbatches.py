"""Micro-batches inside one call: `pm(*inputs)` runs the step as M micro-batches.

A plan with `microbatches` M > 1 was made for one micro-batch's graph. A call of the
compiled model cuts the inputs along dim 0 (`autopar.values.microbatch.micro_inputs`) and runs each
micro-batch's forward and, at once, its backward, seeded with the micro-batch's weight w_i,
so that only one micro-batch's activations are alive at a time. The gradients accumulate:
replicated parameters' all-reduces wait for the last micro-batch (the reducer's
`deferring`), ZeRO-1 copies serve every micro-batch, the rest runs per micro-batch as
planned.

The call returns the batch's loss, sum_i w_i * loss_i, and the backward of that loss adds
the accumulated gradients to `.grad`, times the gradient it receives: `loss.backward()`,
`(loss * scale).backward()` and `loss.backward()` after earlier steps' gradients were kept
all accumulate exactly as they would on the single-process model. (The gradients are
computed in the call; their backward only hands them over.) Under `torch.no_grad()` the
call runs the forwards only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from autopar.runtime.grad_reduce import GradientReducer


class _Accumulated(torch.autograd.Function):
    """The batch's loss, whose backward hands over the gradients the call computed."""

    @staticmethod
    def forward(ctx, loss: torch.Tensor, gradients: list, *parameters: torch.Tensor
                ) -> torch.Tensor:
        ctx.gradients = gradients
        return loss.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # Handed over, not kept: autograd then takes each gradient as the parameter's
        # `.grad` instead of copying it, and no second copy lives on until the loss goes.
        gradients, ctx.gradients = ctx.gradients, None
        if bool(grad != 1):
            gradients = [None if g is None else g * grad for g in gradients]
        return None, None, *gradients


def run_microbatches(run: Callable[[list], torch.Tensor], inputs: Sequence[list],
                     weights: Sequence[float], parameters: Sequence[torch.Tensor],
                     reducer: GradientReducer | None) -> torch.Tensor:
    """The batch's loss from `run` (one micro-batch's flat inputs -> its loss) over the
    micro-batches' `inputs` with their `weights`, accumulating the gradients of
    `parameters` (see the module docstring). A micro-batch of weight 0 (every target
    ignored) contributes nothing and is skipped, on every rank alike."""
    work = [(flat, w) for flat, w in zip(inputs, weights) if w != 0] or list(zip(inputs, weights))
    train = torch.is_grad_enabled() and any(p.requires_grad for p in parameters)
    if not train:
        return sum(w * run(flat) for flat, w in work)

    def step() -> torch.Tensor:
        total = None
        try:
            for i, (flat, w) in enumerate(work):
                if reducer is not None:
                    reducer.deferring = i < len(work) - 1
                loss = run(flat)
                torch.autograd.backward(loss, torch.full_like(loss, w))
                part = loss.detach() * w
                total = part if total is None else total + part
        finally:
            if reducer is not None:
                reducer.end_step()
        return total

    return hand_over(step, parameters)


def hand_over(step: Callable[[], torch.Tensor], parameters: Sequence[torch.Tensor]
              ) -> torch.Tensor:
    """Run `step` (forwards and backwards of a whole batch, returning its loss detached)
    with `parameters`' `.grad` cleared, then put back what they held: the returned loss's
    backward adds the gradients `step` made, times the gradient it receives."""
    kept = [p.grad for p in parameters]
    for p in parameters:
        p.grad = None
    try:
        total = step()
        gradients = [p.grad for p in parameters]
    finally:
        for p, grad in zip(parameters, kept):
            p.grad = grad
    return _Accumulated.apply(total, gradients, *parameters)
