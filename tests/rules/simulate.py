"""Single-process simulation of one sharding strategy on n ranks.

`simulate(target, args, kwargs, strategy, n)` checks, with real fp64 tensors, that running
the op on each rank's local inputs yields the output placement the strategy claims:

- inputs are cut per placement: `S(d)` -> DTensor's chunks along d (uneven where n does
  not divide, when the strategy pass would keep the strategy: `find_strategies.lined_up`),
  `R` -> the whole tensor, `P` -> random summands that add up to the tensor;
- each rank calls the op with `autopar.rules.local_args` (local sizes for view/expand/...),
  and a vocab-split embedding calls `embedding.masked_embedding`: the lowering's obligations;
- outputs are put back per output placement (`S`: cat, `P`: sum, `R`: every rank equal) and
  compared with the op on the full inputs.

Backward, where the output is split and floating: with a random upstream gradient g (each
rank gets its chunk of g under `S`, the whole g under `P`), a rank's input gradients must
put back to the full gradient the way the design says: chunks of an `S(d)` input
concatenate, the summands of an `R` input add up (its gradient is Partial), and every rank
holds the whole gradient of a `P` input.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from autopar.passes.strategies.find_strategies import lined_up
from autopar.rules import AxisStrategy, OpSpec, local_args
from autopar.rules.embedding import is_vocab_split, masked_embedding
from autopar.rules.pointwise import is_inplace
from autopar.runtime.axis_ops import piece_of
from autopar.values.placement import (
    Partial,
    Placement,
    Replicate,
    Shard,
    chunk_extent,
    chunk_sizes,
    local_shape,
)
from autopar.values.specs import TensorSpec


class Uneven(Exception):
    """The strategy cuts dims unevenly in a way the strategy pass drops."""


def spec_of(t: torch.Tensor) -> TensorSpec:
    return TensorSpec(tuple(t.shape), t.dtype)


def build(target: Any, args: tuple, kwargs: dict) -> tuple[OpSpec, list[torch.Tensor]]:
    """The OpSpec a rule sees for this call, and the call's tensors in `inputs` order."""
    leaves, _ = tree_flatten((args, kwargs))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    outputs = _outputs(_call(target, args, kwargs))

    def swap(x: Any) -> Any:
        return spec_of(x) if isinstance(x, torch.Tensor) else x

    op = OpSpec(target, tree_map(swap, args), tree_map(swap, kwargs),
                tuple(map(spec_of, tensors)), tuple(map(spec_of, outputs)))
    return op, tensors


def _fill(args: tuple, kwargs: dict, tensors: list) -> tuple[tuple, dict]:
    """`args`/`kwargs` with their TensorSpec leaves replaced by `tensors`, in order."""
    leaves, tree = tree_flatten((args, kwargs))
    feed = iter(tensors)
    return tree_unflatten([next(feed) if isinstance(x, TensorSpec) else x for x in leaves],
                          tree)


def _outputs(value: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(value)[0] if isinstance(x, torch.Tensor)]


def _call(target: Any, args: tuple, kwargs: dict) -> Any:
    if is_inplace(OpSpec(target, args, kwargs)):
        args = (args[0].clone(), *args[1:])  # never write into the caller's tensor
    return target(*args, **kwargs)


def split(t: torch.Tensor, placement: Placement, n: int, gen: torch.Generator) -> list:
    """The n local values of `t` under `placement`."""
    if isinstance(placement, Shard):
        return [piece_of(t, placement.dim, n, r) for r in range(n)]
    if isinstance(placement, Partial):
        assert t.is_floating_point(), "Partial of a non-float tensor"
        parts = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for _ in range(n - 1)]
        return [*parts, t - sum(parts, torch.zeros_like(t))]
    return [t] * n


def join(parts: list[torch.Tensor], placement: Placement) -> torch.Tensor:
    """The global value from n local values under `placement`."""
    if isinstance(placement, Shard):
        return torch.cat(parts, placement.dim)
    if isinstance(placement, Partial):
        return sum(parts[1:], parts[0])
    for p in parts[1:]:
        torch.testing.assert_close(p, parts[0], **_tol(p), msg="R output differs")
    return parts[0]


def _run_local(op: OpSpec, strategy: AxisStrategy, n: int, rank: int,
               local: list[torch.Tensor]) -> Any:
    shape = local_shape(op.outputs[0].shape, (strategy.output,), (n,), (rank,)) \
        if op.outputs else ()
    args, kwargs = _fill(*local_args(op, shape), local)
    if op.inputs and is_vocab_split(op, strategy.inputs[0]):
        weight, indices = local
        start = chunk_extent(op.inputs[0].shape[0], n, rank)[0]
        padding = args[2] if len(args) > 2 else kwargs.get("padding_idx", -1)
        return masked_embedding(weight, indices, start, padding)
    return _call(op.target, args, kwargs)


def _tol(t: torch.Tensor) -> dict[str, float]:
    if t.dtype == torch.float64:
        return {"rtol": 1e-9, "atol": 1e-9}
    if t.is_floating_point():
        return {"rtol": 1e-5, "atol": 1e-5}
    return {"rtol": 0, "atol": 0}


def simulate(target: Any, args: tuple, kwargs: dict, strategy: AxisStrategy, n: int,
             backward: bool = True, frozen: tuple[int, ...] = (), seed: int = 0) -> None:
    """Assert that `strategy` is exact for this call on n ranks (see the module doc).
    `frozen` lists inputs (by index) the op is not differentiable in."""
    gen = torch.Generator().manual_seed(seed)
    op, tensors = build(target, args, kwargs)
    assert len(strategy.inputs) == len(tensors), (strategy, len(tensors))
    _check_kept(op, strategy, n)
    pieces = [split(t, p, n, gen) for t, p in zip(tensors, strategy.inputs)]
    locals_ = [[pieces[i][r] for i in range(len(tensors))] for r in range(n)]
    full = _outputs(_call(target, args, kwargs))
    per_rank = [_outputs(_run_local(op, strategy, n, r, locals_[r])) for r in range(n)]
    for k, want in enumerate(full):
        if isinstance(strategy.output, Shard):
            for r in range(n):
                expect = piece_of(want, strategy.output.dim, n, r).shape
                assert per_rank[r][k].shape == expect, (k, r, per_rank[r][k].shape, expect)
        got = join([per_rank[r][k] for r in range(n)], strategy.output)
        torch.testing.assert_close(got, want, **_tol(want))
    if backward and not isinstance(strategy.output, Replicate):
        _check_backward(op, strategy, n, tensors, locals_, full, gen, frozen)


def _check_kept(op: OpSpec, strategy: AxisStrategy, n: int) -> None:
    """Raise `Uneven` where the strategy pass drops the strategy on n ranks."""
    tensors = [*((spec, (p,)) for spec, p in zip(op.inputs, strategy.inputs)),
               *((spec, (strategy.output,)) for spec in op.outputs)]
    for spec, (placement,) in tensors:
        if isinstance(placement, Shard) and 0 in chunk_sizes(spec.shape[placement.dim], n):
            raise Uneven(f"dim {placement.dim} of {spec.shape} in {n}: an empty piece")
    if not lined_up(tensors, (n,)):
        raise Uneven(f"pieces that do not line up in {n}")


def _check_backward(op: OpSpec, strategy: AxisStrategy, n: int, tensors: list,
                    locals_: list, full: list, gen: torch.Generator,
                    frozen: tuple[int, ...]) -> None:
    grads_out = [torch.randn(o.shape, generator=gen, dtype=o.dtype)
                 if o.is_floating_point() else None for o in full]
    wanted = [i for i, t in enumerate(tensors) if t.is_floating_point() and i not in frozen]
    if not wanted or all(g is None for g in grads_out):
        return
    want = _grads(op, strategy, tensors, wanted, grads_out, None, 0, n)
    ranks = []
    for r in range(n):
        up = [None if g is None else _local_grad(g, strategy.output, n, r) for g in grads_out]
        ranks.append(_grads(op, strategy, locals_[r], wanted, up, strategy, r, n))
    for j, i in enumerate(wanted):
        placement = strategy.inputs[i]
        parts = [ranks[r][j] for r in range(n)]
        if isinstance(placement, Shard):
            got = torch.cat(parts, placement.dim)
        elif isinstance(placement, Partial):
            for p in parts:
                torch.testing.assert_close(p, want[j], **_tol(p), msg=f"grad of P input {i}")
            continue
        else:
            got = sum(parts[1:], parts[0])
        torch.testing.assert_close(got, want[j], **_tol(got))


def _local_grad(g: torch.Tensor, placement: Placement, n: int, rank: int) -> torch.Tensor:
    return piece_of(g, placement.dim, n, rank) if isinstance(placement, Shard) else g


def _grads(op: OpSpec, strategy: AxisStrategy, tensors: list, wanted: list[int],
           upstream: list, local: AxisStrategy | None, rank: int, n: int) -> list:
    leaves = [t.detach().clone().requires_grad_(i in wanted) for i, t in enumerate(tensors)]
    if local is None:
        out = _outputs(_call(op.target, *_fill(tuple(op.args), dict(op.kwargs), leaves)))
    else:
        out = _outputs(_run_local(op, local, n, rank, leaves))
    loss = sum((o * g).sum() for o, g in zip(out, upstream) if g is not None)
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        return [torch.zeros_like(leaves[i]) for i in wanted]
    grads = torch.autograd.grad(loss, [leaves[i] for i in wanted], allow_unused=True)
    return [torch.zeros_like(leaves[i]) if g is None else g for i, g in zip(wanted, grads)]
