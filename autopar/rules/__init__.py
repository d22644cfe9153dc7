"""The sharding-rule registry: for an ATen op, the ways to split it over one mesh axis.

Each family file (`matmul`, `convolution`, `pointwise`, `views`, `slicing`, `indexing`,
`reductions`, `norms`, `attention`, `embedding`, `losses`, `factories`, `pooling`, `upsample`,
`recurrent`) exports `RULES`, keyed
by an `OpOverload` (one overload) or an `OpOverloadPacket` (all its overloads). `lookup` prefers
the exact overload, then its packet. An op with no rule gets `None`: the strategy pass then
replicates it (and warns). The contract a rule honours is in `autopar.rules.base`.

What the lowering must do beyond placing tensors as a strategy says (its obligations):

1. Local size arguments: ops that carry global sizes (view/reshape/_unsafe_view shape,
   expand size, unflatten sizes, repeat_interleave output_size) must be called with the
   rank's local sizes: `local_args(op, shape)`, with `shape` the rank's piece of the output
   (`autopar.values.placement.local_shape`: pieces follow DTensor's chunking, so ranks
   may differ).
2. Vocab-parallel embedding: `embedding` with its weight `Shard(0)` on an axis runs
   `embedding.masked_embedding` with the rank's first row, not a plain lookup (with dim 0
   split over several axes, the row offset of the rank's chunk in their combined order).
3. A replicated input of a split computation is used whole on every rank; its gradient is
   then a summand (all-reduce). A `P` input a rule asks for where the producer is `R` (the
   bias of a row-split linear) is a conversion R -> P: the value on one rank, zeros on the
   others (or the value / n on each).
4. Random ops (dropout, rand_like, rand...) under `R` must draw the same numbers on every
   rank; under a split each rank draws its own chunk's.
5. Context-parallel attention: `scaled_dot_product_attention` with its keys split along
   their length on an axis (`attention.context_axis`) runs
   `autopar.runtime.ring_attention` over that axis, not a local attention.

A rule sees one axis; a few combinations over the mesh still cannot run (two axes each
running a ring). `admissible(op, inputs, output)` says whether a combined strategy can:
the strategy pass drops those that cannot.

No rule splits a mean over a split dim (a local mean is not a summand), so a mean loss
(F.cross_entropy, F.mse_loss, x.mean()) forces a gather of its input under data
parallelism. `decompositions.DECOMPOSITIONS` rewrites those means as sum / global count,
exactly; capture applies it with `ExportedProgram.run_decompositions(DECOMPOSITIONS)`.
`DECOMPOSITIONS` also holds rewrites of ops whose outputs no single placement describes
(the contract gives all the outputs of an op one placement) into ops the rules can split:
batch norm as the reductions and per-channel affine maps it is (`batch_norm`: in training
with the whole batch's statistics, as SyncBatchNorm), embedding_bag as lookups and
scatters (`embedding`), batch_first recurrent layers as sequence-first ones between
transposes (`recurrent`); and the functional `copy` of slice assignments, which has no eager
derivative, as the broadcast it is (`slicing`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from autopar.rules import (
    attention,
    batch_norm,
    convolution,
    decompositions,
    embedding,
    factories,
    indexing,
    losses,
    matmul,
    norms,
    pointwise,
    pooling,
    recurrent,
    reductions,
    slicing,
    upsample,
    views,
)
from autopar.rules.base import AxisStrategy, OpSpec, Rule
from autopar.values.placement import Placements

__all__ = ["DECOMPOSITIONS", "AxisStrategy", "OpSpec", "RULES", "Rule", "admissible",
           "local_args", "lookup"]

_FAMILIES = (
    pointwise, matmul, convolution, views, slicing, indexing, reductions, norms, attention,
    embedding, losses, factories, pooling, upsample, recurrent,
)
# Run by capture (`ExportedProgram.run_decompositions`): means as sums over a global count,
# batch norm as reductions and per-channel affine maps, embedding_bag as lookups and
# scatters, batch_first RNNs as sequence-first, the functional copy of slice assignments as
# a broadcast.
DECOMPOSITIONS = {**decompositions.DECOMPOSITIONS, **batch_norm.DECOMPOSITIONS,
                  **embedding.DECOMPOSITIONS, **recurrent.DECOMPOSITIONS,
                  **slicing.DECOMPOSITIONS}


def _merge() -> Mapping[Any, Rule]:
    merged: dict[Any, Rule] = {}
    for family in _FAMILIES:
        clash = merged.keys() & family.RULES.keys()
        assert not clash, f"{family.__name__} redefines {sorted(map(str, clash))}"
        merged.update(family.RULES)
    return MappingProxyType(merged)


RULES: Mapping[Any, Rule] = _merge()
_LOCAL_ARGS = MappingProxyType({**views.LOCAL_ARGS, **slicing.LOCAL_ARGS})
_ADMISSIBLE = MappingProxyType(dict(attention.ADMISSIBLE))


def lookup(target: Any) -> Rule | None:
    """The rule for an fx node target: exact OpOverload first, then its packet; None for
    anything without one (including non-ATen targets such as `operator.getitem`)."""
    try:
        rule = RULES.get(target)
    except TypeError:  # unhashable target
        return None
    if rule is None and hasattr(target, "overloadpacket"):
        rule = RULES.get(target.overloadpacket)
    return rule


def admissible(op: OpSpec, inputs: tuple[Placements, ...], output: Placements) -> bool:
    """Whether a strategy combined over the mesh axes (one `Placements` per tensor input,
    one for the output) can run; true for every op without a check of its own."""
    check = _ADMISSIBLE.get(op.target)
    return check is None or check(op, inputs, output)


def local_args(op: OpSpec, shape: Sequence[int]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The (args, kwargs) a rank calls `op.target` with, given that its piece of the op's
    (first) output has `shape`. Tensor arguments stay as `TensorSpec`s for the caller to
    substitute; for ops without size arguments the args come back unchanged."""
    assert not op.outputs or len(shape) == op.outputs[0].ndim, (op.name, shape)
    rewrite = _LOCAL_ARGS.get(op.target)
    if rewrite is None or tuple(shape) == tuple(op.outputs[0].shape):
        return tuple(op.args), dict(op.kwargs)
    return rewrite(op, shape)
