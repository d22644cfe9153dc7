"""The contract between the strategy pass and the per-op-family sharding rules.

A rule looks at one op (`OpSpec`) and returns the ways it can be split over *one* mesh axis
(`AxisStrategy`): a placement for every tensor input and one for the output(s). The strategy
pass takes the product over the mesh axes, drops combinations whose shards do not divide
evenly, and always adds the all-replicated strategy, so a rule lists only the splits it
supports and need not repeat the replicated one.

Semantics a rule must respect, per axis, for the strategy to be correct as lowered:
- `Shard(d)` input: each rank receives the d-th chunk; `Replicate()`: the full tensor;
  `Partial()`: a summand of the value (allowed only where the op is linear in that input).
- The output placement is what running the op on the local inputs yields, unchanged; an op
  whose output is `Shard` or `Partial` while an input is `Replicate` must use that whole
  input on every rank (its gradient there is then Partial and gets all-reduced).
- A multi-output op (split, topk, ...) gives every tensor output the same placement.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autopar.values.placement import Placement
from autopar.values.specs import TensorSpec


@dataclass(frozen=True)
class OpSpec:
    """What a rule sees of one graph node.

    `args`/`kwargs` are the node's arguments with each tensor-valued fx.Node replaced by its
    `TensorSpec` (a tuple of them for a multi-output producer) and each symbolic int by its
    concrete size. `inputs` lists the tensor arguments in pytree order of (args, kwargs),
    repeats kept: strategy input placements align with it. `outputs` lists the tensor
    outputs (one for most ops).
    """

    target: Any
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()

    @property
    def name(self) -> str:
        """`"aten.linear.default"`-style name, for messages."""
        return str(self.target)

    def arg(self, index: int, name: str, default: Any = None) -> Any:
        """Argument `name`, given positionally at `index` or by keyword, else `default`."""
        if index < len(self.args):
            return self.args[index]
        return self.kwargs.get(name, default)


@dataclass(frozen=True)
class AxisStrategy:
    """One way to split an op over a single mesh axis."""

    inputs: tuple[Placement, ...]
    output: Placement

    def __post_init__(self) -> None:
        assert all(isinstance(p, Placement) for p in (*self.inputs, self.output)), self


Rule = Callable[[OpSpec], list[AxisStrategy]]
