"""Ring attention: scaled_dot_product_attention with the sequence split over a mesh axis.

Rank r of the axis's c ranks holds chunk r of the queries, keys and values along their
length (obligation 5 of `autopar.rules`). The forward passes the key/value blocks around
the ring, rank r sending to r+1 and receiving from r-1, the transfer of the next block
running while the current one is attended to; the partial results are merged by their
log-sum-exp (the online softmax):

    lse = logaddexp(lse_1, lse_2),  out = out_1 exp(lse_1 - lse) + out_2 exp(lse_2 - lse)

The backward runs the ring again with each block's dK, dV travelling with it (accumulated in
fp32 for half types; the last send, complete, in the inputs' dtype), so that they arrive
back where the block started after c sends; each block's gradients come from the
attention kernel's backward given the merged output and log-sum-exp, which makes them the
block's exact share. Under a causal mask (`autopar.costs.ring.balanced`) rank r first swaps
the second half of its queries with rank c-1-r: it then holds the positions of one early
and one late half, and every rank attends to as many key positions as every other. Causal
masking compares global positions: a query half and a key half are fully visible, masked
on the diagonal (the same half), or skipped. A boolean attention mask comes split with the
queries, its key columns whole: each step reads the columns of the block at hand (every
block is then computed, masked or not, and the ranks' work is equal without a swap).

The blocks run through the fused attention kernels where the device has them with a
log-sum-exp output (CPU: `_scaled_dot_product_flash_attention_for_cpu`), otherwise through
the explicit softmax. Every send is counted on the `CommCounter` as the cost model's
`send`, with the bytes of `autopar.costs.ring.Ring.transfers`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.function import once_differentiable
from torch.distributed.device_mesh import DeviceMesh

from autopar.costs.ring import balanced, gradient_dtype
from autopar.runtime.axis_ops import axis_name
from autopar.runtime.counter import CommCounter

aten = torch.ops.aten

# A piece of a rank's queries or of a key block: (first row, rows, first global position).
Piece = tuple[int, int, int]


class _Ring:
    """The ring of one rank: its group, neighbours, counter and the layout of its queries."""

    def __init__(self, mesh: DeviceMesh, axis: int, counter: CommCounter, *, causal: bool,
                 scale: float | None, rows: int, key_rows: int) -> None:
        self.group = mesh.get_group(axis)
        self.size, self.rank = mesh.size(axis), mesh.get_local_rank(axis)
        self.counter, self.axis_name = counter, axis_name(mesh, axis)
        self.causal, self.scale, self.rows, self.key_rows = causal, scale, rows, key_rows
        self.balanced = balanced(causal, self.size, rows)
        self.first = (rows + 1) // 2  # rows of the first half; the second is swapped

    def peer(self, axis_rank: int) -> int:
        """Global rank of `axis_rank` (modulo the ring) on this rank's axis."""
        return dist.get_global_rank(self.group, axis_rank % self.size)

    def queries(self) -> list[Piece]:
        """The pieces of the queries this rank attends for, with their global positions."""
        rows, r = self.rows, self.rank
        if not self.causal:
            return [(0, rows, 0)]
        if not self.balanced:
            return [(0, rows, r * rows)]
        partner = self.size - 1 - r
        return [(0, self.first, r * rows),
                (self.first, rows - self.first, partner * rows + self.first)]

    def keys(self, owner: int) -> list[Piece]:
        """The pieces of the key block of axis rank `owner`: its halves when balanced (each
        query piece is a half), else the whole block."""
        start = owner * self.key_rows
        if not self.balanced:
            return [(0, self.key_rows, start)]
        return [(0, self.first, start), (self.first, self.rows - self.first,
                                         start + self.first)]

    def pairs(self, owner: int):
        """(query piece, key piece, causal diagonal) of the block of `owner` to attend."""
        for q in self.queries():
            for k in self.keys(owner):
                if not self.causal or k[2] + k[1] <= q[2]:
                    yield q, k, False
                elif k[2] == q[2]:
                    yield q, k, True  # same positions: the causal diagonal

    def send(self, tensors: list[torch.Tensor], to: int, source: int, direction: str):
        """Start sending `tensors` to axis rank `to` and receiving as many (of the same
        shapes) from `source`; returns (the receive buffers, the handle to `_wait` on)."""
        sent = [t.contiguous() for t in tensors]
        received = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in sent]
        ops = [dist.P2POp(dist.isend, t, self.peer(to), self.group) for t in sent]
        ops += [dist.P2POp(dist.irecv, b, self.peer(source), self.group) for b in received]
        self.counter.record("send", self.axis_name, direction,
                            sum(t.numel() * t.element_size() for t in sent))
        # The sent tensors stay referenced until the work is waited on.
        return received, (dist.batch_isend_irecv(ops), sent)

    def shift(self, tensors: list[torch.Tensor], direction: str):
        """Start passing `tensors` one rank on around the ring (see `send`)."""
        return self.send(tensors, self.rank + 1, self.rank - 1, direction)

    def swap_halves(self, t: torch.Tensor, direction: str) -> torch.Tensor:
        """`t` with its second half of rows exchanged with the mirror rank's (balanced)."""
        if not self.balanced:
            return t
        partner = self.size - 1 - self.rank
        second = t.narrow(-2, self.first, self.rows - self.first)
        (received,), handle = self.send([second], partner, partner, direction)
        _wait(handle)
        return torch.cat([t.narrow(-2, 0, self.first), received], dim=-2)


def _wait(handle) -> None:
    works, _ = handle
    for work in works:
        work.wait()


def _stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype outputs and log-sum-exps are merged in: fp32, fp64 for fp64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rows(t: torch.Tensor, piece: Piece) -> torch.Tensor:
    return t.narrow(-2, piece[0], piece[1])


def _block_bias(bias: torch.Tensor | None, q: Piece, k: Piece) -> torch.Tensor | None:
    """The rows of query piece `q` and the columns of key piece `k` (global positions) of
    a rank's mask bias, where it has them (a broadcast dim stays)."""
    if bias is None:
        return None
    if bias.shape[-2] > 1:
        bias = _rows(bias, q)
    # The CPU kernels read a mask view's rows with the whole row's stride: contiguous.
    return bias.narrow(-1, k[2], k[1]).contiguous() if bias.shape[-1] > 1 else bias


def _grouped(k: torch.Tensor, heads: int) -> torch.Tensor:
    """Key or value heads repeated to the query's `heads` (grouped-query attention)."""
    return k if k.shape[-3] == heads else k.repeat_interleave(heads // k.shape[-3], dim=-3)


def _ungrouped(grad: torch.Tensor, heads: int) -> torch.Tensor:
    """The gradient of `_grouped`: the query heads' gradients summed per key head."""
    if grad.shape[-3] == heads:
        return grad
    shape = grad.shape
    return grad.reshape(*shape[:-3], heads, shape[-3] // heads, *shape[-2:]).sum(-3)


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask (True: attend) as the bias the kernels add to the scores."""
    if mask is None:
        return None
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
        ~mask, float("-inf"))


def _attend(q, k, v, bias, diagonal: bool, scale):
    """(output, log-sum-exp in `_stats_dtype` with a trailing dim of 1) of one block; a
    row the `bias` masks entirely gives zeros and -inf."""
    k, v = _grouped(k, q.shape[-3]), _grouped(v, q.shape[-3])
    if q.device.type == "cpu":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, diagonal, attn_mask=bias, scale=scale)
        lse = lse.to(_stats_dtype(q.dtype)).unsqueeze(-1)
    else:
        scores = _scores(q, k, bias, diagonal, scale)
        lse = scores.logsumexp(-1, keepdim=True)
        out = (scores - lse).exp().to(v.dtype) @ v
    if bias is not None:
        # The CPU kernel gives a row masked everywhere an output of zeros and a log-sum-exp
        # of 0, where the merge needs -inf.
        dead = (bias == float("-inf")).all(-1, keepdim=True)
        lse = lse.masked_fill(dead, float("-inf"))
        out = out.masked_fill(lse == float("-inf"), 0)
    return out, lse


def _scores(q, k, bias, diagonal: bool, scale):
    stats = _stats_dtype(q.dtype)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q.to(stats) @ k.to(stats).transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.to(stats)
    if diagonal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return scores


def _attend_backward(dout, q, k, v, bias, out, lse, diagonal: bool, scale):
    """(dq, dk, dv) of one block, given the merged `out` and `lse` of the queries."""
    heads = q.shape[-3]
    kg, vg = _grouped(k, heads), _grouped(v, heads)
    if q.device.type == "cpu":
        dq, dk, dv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, kg, vg, out, lse.squeeze(-1), 0.0, diagonal, attn_mask=bias,
            scale=scale)
    else:
        stats, scale_ = lse.dtype, q.shape[-1] ** -0.5 if scale is None else scale
        p = (_scores(q, kg, bias, diagonal, scale) - lse).exp()
        dout_, out_ = dout.to(stats), out.to(stats)
        dv = p.transpose(-1, -2) @ dout_
        ds = p * (dout_ @ vg.to(stats).transpose(-1, -2)
                  - (dout_ * out_).sum(-1, keepdim=True))
        dq = (ds @ kg.to(stats)) * scale_
        dk = (ds.transpose(-1, -2) @ q.to(stats)) * scale_
    return dq, _ungrouped(dk, k.shape[-3]), _ungrouped(dv, v.shape[-3])


class _RingAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                bias: torch.Tensor | None, ring: _Ring):
        q_held = ring.swap_halves(q, "forward")
        stats = _stats_dtype(q.dtype)
        out = torch.zeros(*q_held.shape[:-1], v.shape[-1], dtype=stats, device=q.device)
        lse = torch.full((*q_held.shape[:-1], 1), float("-inf"), dtype=stats,
                         device=q.device)
        block = [k, v]
        for step in range(ring.size):
            owner = (ring.rank - step) % ring.size
            shift = ring.shift(block, "forward") if step < ring.size - 1 else None
            for qp, kp, diagonal in ring.pairs(owner):
                part, part_lse = _attend(_rows(q_held, qp), _rows(block[0], kp),
                                         _rows(block[1], kp), _block_bias(bias, qp, kp),
                                         diagonal, ring.scale)
                _merge(_rows(out, qp), _rows(lse, qp), part, part_lse)
            if shift is not None:
                block, handle = shift
                _wait(handle)
        out = out.to(q.dtype)
        ctx.save_for_backward(q_held, k, v, bias, out, lse)
        ctx.ring = ring
        return ring.swap_halves(out, "forward")

    @staticmethod
    @once_differentiable
    def backward(ctx, dout: torch.Tensor):
        ring: _Ring = ctx.ring
        q, k, v, bias, out, lse = ctx.saved_tensors
        dout = ring.swap_halves(dout.contiguous(), "backward")
        accumulate = gradient_dtype(k.dtype)
        dq = torch.zeros(q.shape, dtype=_stats_dtype(q.dtype), device=q.device)
        block, grads = [k, v], None
        for step in range(ring.size):
            owner = (ring.rank - step) % ring.size
            shift = ring.shift(block, "backward") if step < ring.size - 1 else None
            dk = torch.zeros(k.shape, dtype=accumulate, device=k.device)
            dv = torch.zeros(v.shape, dtype=accumulate, device=v.device)
            for qp, kp, diagonal in ring.pairs(owner):
                part_q, part_k, part_v = _attend_backward(
                    _rows(dout, qp), _rows(q, qp), _rows(block[0], kp), _rows(block[1], kp),
                    _block_bias(bias, qp, kp), _rows(out, qp), _rows(lse, qp), diagonal,
                    ring.scale)
                _rows(dq, qp).add_(part_q)
                _rows(dk, kp).add_(part_k)
                _rows(dv, kp).add_(part_v)
            if grads is not None:
                (dk_in, dv_in), handle = grads
                _wait(handle)
                dk, dv = dk + dk_in, dv + dv_in
            if step == ring.size - 1:  # complete: home in the inputs' dtype
                dk, dv = dk.to(k.dtype), dv.to(v.dtype)
            grads = ring.shift([dk, dv], "backward")
            if shift is not None:
                block, handle = shift
                _wait(handle)
        (dk, dv), handle = grads
        _wait(handle)
        dq = ring.swap_halves(dq.to(q.dtype), "backward")
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None


def _merge(out: torch.Tensor, lse: torch.Tensor, part: torch.Tensor,
           part_lse: torch.Tensor) -> None:
    """Fold a block's (output, log-sum-exp [..., rows, 1]) into the running ones, in
    place."""
    merged = torch.logaddexp(lse, part_lse)
    empty = merged == float("-inf")  # no key seen yet: weights 0, not exp(-inf + inf)
    out.mul_(torch.where(empty, 0, (lse - merged).exp())).add_(
        part.to(out.dtype) * torch.where(empty, 0, (part_lse - merged).exp()))
    lse.copy_(merged)


class RingAttention(nn.Module):
    """`scaled_dot_product_attention(q, k, v, attn_mask, is_causal=..., scale=...,
    enable_gqa=...)` of a rank's sequence chunks over mesh axis `axis` (module docstring):
    q, k, v are its chunks, a boolean `attn_mask` its query rows with every key column.
    Holds no state."""

    def __init__(self, mesh: DeviceMesh, axis: int, counter: CommCounter, *,
                 is_causal: bool = False, scale: float | None = None) -> None:
        super().__init__()
        self.mesh, self.axis, self.counter = mesh, axis, counter
        self.is_causal, self.scale = is_causal, scale

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        ring = _Ring(self.mesh, self.axis, self.counter, causal=self.is_causal,
                     scale=self.scale, rows=query.shape[-2], key_rows=key.shape[-2])
        shape = query.shape
        q, k, v = (t.reshape(-1, *t.shape[-3:]) if t.ndim >= 3 else t.reshape(1, 1, *t.shape)
                   for t in (query, key, value))
        out = _RingAttention.apply(q, k, v, _additive(attn_mask, query.dtype), ring)
        return out.reshape(*shape[:-1], value.shape[-1])

    def extra_repr(self) -> str:
        return f"axis={self.axis}, is_causal={self.is_causal}"
