"""Context-parallel attention: the ring one rank runs, its bytes and its exposed time.

An attention node whose strategy splits the keys along their length over a mesh axis of c
devices (`rules.attention.context_axis`) runs `autopar.runtime.ring_attention` over that
axis. Rank r holds chunk r of the queries, keys and values. With, per rank, Q and O its
query and output bytes, KV its key plus value bytes and G the bytes of their gradients as
accumulated (fp32 for half types, else their dtype):

    forward    c - 1 sends of KV            the key/value blocks, one ring step each
    backward   c - 1 sends of KV + G, and   the blocks again, each with its dK, dV, which
               one of KV                    end where the block started (the last send
                                            complete, in the inputs' dtype)
    balanced   forward Q h and O h,         causal attention with c even: rank r swaps the
               backward O h and Q h         second half of its queries (h = floor(l/2) / l
                                            of them, l its rows) with rank c-1-r and the
                                            outputs back, so every rank holds the positions
                                            of a first and a last half: equal causal work

The ring overlaps each step's transfer with that step's compute, a c-th of the node's
(balanced: every step does the same share of the work on average):

    forward  = t_f + (c - 1) max(0, x(KV) - t_f / c) + x(Q h) + x(O h)
    backward = t_b + (c - 1) max(0, x(KV + G) - t_b / c) + x(KV) + x(O h) + x(Q h)

where t_f, t_b are the node's forward and backward compute and x(B) = B / beta + alpha a
send over the axis (`formulas.send_time`). The swaps and the last dK, dV send wait for
their data: exposed.

The ring also runs many kernels where the op ran one: per pair of a query piece and a key
block it attends to (c pairs, 2c + 1 balanced: half a's queries see a + 1 key halves), the
attention kernel and the merge's elementwise ops forward (`FORWARD_LAUNCHES`), the kernel
and three accumulations backward (`BACKWARD_LAUNCHES`), each at the hardware's launch
overhead (`Ring.launch_seconds`): on short sequences that outweighs what the ring saves.
The blocks in flight (two of KV in the forward, two of KV and of G in the backward) are
transient workspace, not modelled as memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from autopar.costs.formulas import Transfer, _divide, _max, local_bytes, send_time
from autopar.rules.attention import context_axis
from autopar.rules.base import OpSpec
from autopar.rules.common import argument, tensor_slots
from autopar.values.hardware import HardwareProfile
from autopar.values.mesh import Mesh
from autopar.values.placement import Placements

# Kernel launches per attended block: forward the kernel and the merge (logaddexp, two
# exps, a multiply, an add, a copy), backward the kernel and the dQ, dK, dV accumulations.
FORWARD_LAUNCHES, BACKWARD_LAUNCHES = 7, 4


def balanced(causal: bool, ranks: int, rows: int) -> bool:
    """Whether a ring of `ranks` over local chunks of `rows` query rows swaps half of them
    with the mirror rank: causal attention only, an even ring (the middle rank of an odd
    one would have no partner), at least two rows."""
    return causal and ranks % 2 == 0 and rows >= 2


def gradient_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype dK and dV are accumulated and passed in around the ring."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@dataclass(frozen=True)
class Ring:
    """One context-parallel attention node's ring, per rank (bytes may be sympy formulas)."""

    axis: int
    ranks: int
    balanced: bool
    kv_bytes: object  # local keys plus values
    grad_bytes: object  # their gradients, in `gradient_dtype`
    query_half_bytes: object  # the queries swapped with the mirror rank (0 unless balanced)
    output_half_bytes: object

    @property
    def blocks(self) -> int:
        """Pairs of a query piece and a key piece attended to by the busiest rank."""
        return 2 * self.ranks + 1 if self.balanced else self.ranks

    def launch_seconds(self, hardware: HardwareProfile, *, differentiable: bool) -> float:
        """The launch overhead of the ring's kernels beyond the one the op's compute time
        counts, forward and backward (module docstring)."""
        launches = self.blocks * FORWARD_LAUNCHES - 1
        if differentiable:
            launches += self.blocks * BACKWARD_LAUNCHES - 1
        return launches * hardware.launch_overhead_s

    def transfers(self, *, differentiable: bool) -> tuple[Transfer, ...]:
        """The sends of one forward (and backward, when `differentiable`), in order."""
        def send(nbytes, backward: bool) -> Transfer:
            return Transfer("send", self.axis, nbytes, backward)

        steps = self.ranks - 1
        forward = [send(self.kv_bytes, False) for _ in range(steps)]
        if self.balanced:
            forward = [send(self.query_half_bytes, False), *forward,
                       send(self.output_half_bytes, False)]
        if not differentiable:
            return tuple(forward)
        backward = [send(self.kv_bytes + self.grad_bytes, True) for _ in range(steps)]
        backward.append(send(self.kv_bytes, True))
        if self.balanced:
            backward = [send(self.output_half_bytes, True), *backward,
                        send(self.query_half_bytes, True)]
        return (*forward, *backward)

    def exposed_seconds(self, forward_s, backward_s, mesh: Mesh, *, differentiable: bool):
        """Seconds of communication the compute does not hide (module docstring), given the
        node's forward and backward compute seconds."""
        link = mesh.axis_links[self.axis]

        def send(nbytes):
            return send_time(nbytes, link)

        steps = self.ranks - 1
        swaps = send(self.query_half_bytes) + send(self.output_half_bytes) \
            if self.balanced else 0
        total = steps * _max(0, send(self.kv_bytes) - forward_s / self.ranks) + swaps
        if differentiable:
            total += steps * _max(0, send(self.kv_bytes + self.grad_bytes)
                                  - backward_s / self.ranks)
            total += send(self.kv_bytes) + swaps
        return total


def ring_of(op: OpSpec, inputs: tuple[Placements, ...], output: Placements,
            mesh_shape: tuple[int, ...], nbytes=lambda spec: spec.nbytes) -> Ring | None:
    """The ring of attention `op` under a strategy with input placements `inputs` and
    output placements `output`, or None when it runs no ring. `nbytes(spec)` gives a
    tensor's global bytes (numbers, or the sympy formulas of a graph with symbolic sizes)."""
    axis = context_axis(op, inputs)
    if axis is None:
        return None
    slots = {name: (spec, placements)
             for (name, spec), placements in zip(tensor_slots(op), inputs)}

    def local(name: str):
        spec, placements = slots[name]
        return local_bytes(nbytes(spec), placements, mesh_shape)

    def gradient(name: str):
        dtype = slots[name][0].dtype
        return _divide(local(name) * gradient_dtype(dtype).itemsize, dtype.itemsize)

    ranks = mesh_shape[axis]
    rows = slots["query"][0].shape[-2] // ranks
    is_balanced = balanced(bool(argument(op, "is_causal", False)), ranks, rows)
    swapped = rows // 2 if is_balanced else 0
    out = local_bytes(nbytes(op.outputs[0]), output, mesh_shape)
    return Ring(axis, ranks, is_balanced, local("key") + local("value"),
                gradient("key") + gradient("value"), _divide(local("query") * swapped, rows),
                _divide(out * swapped, rows))

