"""Rank bodies of test_ring_attention: ring attention against the whole attention."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from autopar.costs.ring import Ring
from autopar.runtime.counter import CommCounter
from autopar.runtime.ring_attention import RingAttention


@dataclass(frozen=True)
class Case:
    """Attention of [batch, heads, length, dim] queries over `kv_heads` key/value heads."""

    causal: bool
    heads: int = 4
    kv_heads: int = 4
    length: int = 24
    dtype: torch.dtype = torch.float64
    scale: float | None = None
    masked: bool = False  # a random boolean mask [batch, 1, length, key length]
    key_length: int | None = None  # the query's length by default

@dataclass(frozen=True)
class Result:
    out_error: float
    grad_errors: tuple[float, float, float]
    sent: dict


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def run_case(rank: int, case: Case) -> Result:
    """Attention of the whole sequence on every rank, and this rank's chunk by the ring;
    the relative errors of the output chunk and of the inputs' gradient chunks."""
    world = torch.distributed.get_world_size()
    mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
    generator = torch.Generator().manual_seed(0)

    def tensor(heads: int, length: int) -> torch.Tensor:
        return torch.randn(2, heads, length, 8, generator=generator, dtype=case.dtype)

    keys = case.key_length or case.length
    q, k, v = tensor(case.heads, case.length), tensor(case.kv_heads, keys), \
        tensor(case.kv_heads, keys)
    grad = tensor(case.heads, case.length)
    mask = None
    if case.masked:  # every row keeps at least its first key
        mask = torch.rand(2, 1, case.length, keys, generator=generator) < 0.6
        mask[..., 0] = True
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*whole, attn_mask=mask, is_causal=case.causal,
                                         scale=case.scale,
                                         enable_gqa=case.kv_heads != case.heads)
    out.backward(grad)
    pieces = [t.chunk(world, -2)[rank].clone().requires_grad_() for t in (q, k, v)]
    counter = CommCounter()
    ring = RingAttention(mesh, 0, counter, is_causal=case.causal, scale=case.scale)
    mine = ring(*pieces, None if mask is None else mask.chunk(world, -2)[rank])
    mine.backward(grad.chunk(world, -2)[rank])
    errors = tuple(_relative(p.grad, w.grad.chunk(world, -2)[rank])
                   for p, w in zip(pieces, whole))
    return Result(_relative(mine, out.chunk(world, -2)[rank]), errors, counter.totals())


def run_cases(rank: int, cases: tuple[Case, ...]) -> list[Result]:
    """`run_case` of each case, in order."""
    return [run_case(rank, case) for case in cases]


def expected_bytes(case: Case, world: int) -> dict:
    """The bytes `autopar.costs.ring.Ring` predicts for one rank of `case`."""
    from autopar.costs.ring import balanced, gradient_dtype
    rows = case.length // world
    item = case.dtype.itemsize
    kv = 2 * 2 * case.kv_heads * (case.key_length or case.length) // world * 8 * item
    grad = kv * gradient_dtype(case.dtype).itemsize // item
    half = (rows // 2) * 2 * case.heads * 8 * item if balanced(case.causal, world, rows) else 0
    ring = Ring(0, world, half > 0, kv, grad, half, half)
    totals: dict = {}
    for t in ring.transfers(differentiable=True):
        key = ("send", "cp", "backward" if t.backward else "forward")
        totals[key] = totals.get(key, 0) + t.nbytes
    return totals
