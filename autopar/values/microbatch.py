"""A step run as micro-batches: how the batch splits (`BatchSplit`) and each micro-batch's
inputs. The split is found by `autopar.passes.layout.split_microbatches`; the runtime cuts
the inputs by it."""

from __future__ import annotations

from dataclasses import dataclass

SUMMED, SCALED, COUNTED = "summed", "scaled", "counted"
# The mean of the micro-batches' losses, each micro-batch being the model's batch for the
# ops that mix samples: gradient accumulation, not the whole batch's gradient.
ACCUMULATED = "accumulated"
# What `split_microbatches` does with a step whose ops or loss mix the samples of the batch.
REFUSE, ACCUMULATE = "refuse", "accumulate"


@dataclass(frozen=True)
class BatchSplit:
    """How a step runs as `microbatches` micro-batches: which flat user inputs are cut along
    dim 0 (`split`; the others go whole to every micro-batch), of `batch` samples, and how
    the micro-batches' losses combine (`weighting`, see `split_microbatches`): SUMMED, a
    sum (w_i = 1); SCALED, a sum over the constant `count` (a mean's number of samples,
    w_i = its micro-batch value / `count`); COUNTED, over a count of the inputs
    (w_i = den_i / sum_j den_j); ACCUMULATED, the mean of the micro-batches' losses
    (w_i = 1 / M) of a step that mixes samples, `mixes` naming the op or loss that does
    (empty for the other weightings, whose micro-batches give the batch's loss exactly)."""

    microbatches: int
    batch: int
    split: tuple[bool, ...]
    weighting: str
    count: float = 1.0
    mixes: str = ""

    def describe(self) -> str:
        return f"{self.microbatches} micro-batches of {self.batch // self.microbatches} samples"


def micro_inputs(flat_inputs: list, split: BatchSplit) -> list[list]:
    """The flat inputs of each micro-batch: the cut ones chunked along dim 0 (views)."""
    count = split.microbatches
    pieces = [value.chunk(count, 0) if cut else [value] * count
              for value, cut in zip(flat_inputs, split.split)]
    return [[piece[i] for piece in pieces] for i in range(count)]
