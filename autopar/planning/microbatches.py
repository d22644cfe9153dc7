"""A step's micro-batches: how the batch splits (`split_microbatches`) and the model captured at
one micro-batch, each made once per planning call.

The plan without a pipeline tries micro-batch counts, the pipeline search tries them again
for its candidates, and Megatron 3D once more; the split of a count (a propagation over
the whole graph) and its capture (torch.export) are the same for all of them. No pass
mutates its input graph, so one graph serves every caller.

The split is propagated once, at one sample per micro-batch, and reused for every count:
every count divides the batch, and a rule that shards a dim into n pieces shards it into
any divisor of n, so where the split at one sample is exact, every count's is, with the
same placements. Only where it is not is each count propagated on its own (a step that
mixes the samples of each pair but not those of micro-batches of two or more, or one that
mixes them all).
"""

from __future__ import annotations

import dataclasses
import functools

import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from autopar.errors import MicrobatchError
from autopar.passes.capturing.annotate import annotate
from autopar.passes.capturing.capture import capture, is_training
from autopar.passes.layout.split_microbatches import batch_size, split_microbatches
from autopar.values.microbatch import REFUSE, BatchSplit


def micro_graph(model: nn.Module, example_inputs: tuple, split: BatchSplit, *,
                training: bool = True) -> fx.GraphModule:
    """`model` captured (for `training`, or its forward alone) and annotated at the shapes
    of one micro-batch of `split`."""
    flat, spec = pytree.tree_flatten((tuple(example_inputs), {}))
    size = split.batch // split.microbatches
    flat = [value[:size] if cut else value for value, cut in zip(flat, split.split)]
    args, _ = pytree.tree_unflatten(flat, spec)
    return annotate(capture(model, tuple(args), training=training))


def _split(gm: fx.GraphModule, count: int, mixing: str) -> BatchSplit | MicrobatchError:
    try:
        return split_microbatches(gm, count, mixing=mixing)
    except MicrobatchError as error:
        return error


class MicroBatches:
    """The micro-batches of one model's step at `example_inputs`, whose captured and
    annotated graph is `gm`: `split(count, mixing)` is `split_microbatches(gm, count, mixing=...)`
    (its `MicrobatchError` raised again on each call; the split at one sample per
    micro-batch where that is exact, module docstring) and `graph(split)` is `micro_graph`,
    each computed once. Mutable: it fills as it is asked; make one per planning call."""

    def __init__(self, model: nn.Module, example_inputs: tuple, gm: fx.GraphModule) -> None:
        self.model, self.example_inputs, self.gm = model, tuple(example_inputs), gm
        self._splits: dict[tuple[int, str], BatchSplit | MicrobatchError] = {}
        self._graphs: dict[BatchSplit, fx.GraphModule] = {}

    def split(self, count: int, *, mixing: str = REFUSE) -> BatchSplit:
        key = (count, mixing)
        if key not in self._splits:
            whole = self._single
            if isinstance(whole, BatchSplit) and count >= 1 and whole.batch % count == 0:
                self._splits[key] = dataclasses.replace(whole, microbatches=count)
            else:
                self._splits[key] = _split(self.gm, count, mixing)
        found = self._splits[key]
        if isinstance(found, MicrobatchError):
            raise found
        return found

    @functools.cached_property
    def _single(self) -> BatchSplit | MicrobatchError | None:
        """The exact split at one sample per micro-batch (module docstring), its error, or
        None for a step without a batch."""
        batch = batch_size(self.gm)
        return None if batch is None else _split(self.gm, batch, REFUSE)

    def graph(self, split: BatchSplit) -> fx.GraphModule:
        if split not in self._graphs:
            self._graphs[split] = micro_graph(self.model, self.example_inputs, split,
                                              training=is_training(self.gm))
        return self._graphs[split]
