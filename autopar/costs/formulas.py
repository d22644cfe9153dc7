"""The cost model: pure functions from sizes and hardware to seconds and bytes.

Compute is a roofline, max(FLOPs / (peak x efficiency), bytes / (bandwidth x efficiency)),
plus a launch floor. Collectives over one mesh axis of n devices, link bandwidth beta and
latency alpha, with B the per-rank buffer (the larger side: the gathered output of an
all-gather, the input of a reduce-scatter):

    all_reduce       2 (n-1)/n B / beta + 2 (n-1) alpha
    all_gather       (n-1)/n B / beta + (n-1) alpha
    reduce_scatter   (n-1)/n B / beta + (n-1) alpha
    all_to_all       (n-1)/n B / beta + (n-1) alpha
    send             B / beta + alpha          (point to point: a pipeline stage's boundary)
    broadcast        B / beta + alpha          (of a scalar: a pipeline's loss, pipelined)

A measured profile's link also holds the timings its figures were fitted to; a size known
as a number is priced by them instead (`CollectiveFit.time`: linear between the measured
sizes), which follows a curve the straight line of the formula does not.

Gradients all-reduced in buckets (`GRADIENT_BUCKET_BYTES`, packed as DDP packs them) share
one call's latency: a gradient of B bytes in a bucket of K pays its bandwidth term and
min(1, B / K) of the latency term (`bucketed_time`).

Redistribution between two shardings is a list of `Transfer`s, one per mesh axis whose
placement changes, and its backward is derived, never guessed: the gradient arriving at a
consumer's input has the input's placement, except that a replicated input of a consumer
whose output is split (Shard or Partial) on that axis receives a Partial gradient, and a
Partial input receives a replicated one; the producer needs its gradient in its own output
placement with Partial read as Replicate. Converting the first into the second gives exactly
the table of docs/DESIGN.md (all-reduce <-> nothing, all-gather <-> reduce-scatter or slice,
slice <-> all-gather, all-to-all <-> all-to-all, replicated use by a split op <-> all-reduce).

Every function accepts plain numbers or sympy expressions for sizes, so the same formulas
are evaluated for the solve and kept symbolic in the plan. A tensor that a split cuts
unevenly is sized by an `uneven.TensorBytes`, and its per-rank figures are the largest
piece's (`autopar.costs.uneven`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import sympy
import torch

from autopar.costs import uneven
from autopar.values.hardware import BACKWARD, HardwareProfile, LinkLevel
from autopar.values.mesh import Mesh
from autopar.values.placement import Partial, Placement, Placements, Replicate, Shard
from autopar.values.specs import Kernels

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send",
               "broadcast")

# Gradients packed into one all-reduce, at most (about DDP's first bucket): the runtime's
# buckets (`autopar.runtime.grad_reduce`) and the cost of their latency (`bucketed_time`).
GRADIENT_BUCKET_BYTES = 1 << 20

# Backward compute of a differentiable op is about twice its forward (two matmuls per matmul).
BACKWARD_FLOPS_FACTOR = 2


def _max(a, b):
    if isinstance(a, sympy.Basic) or isinstance(b, sympy.Basic):
        return sympy.Max(a, b)
    return max(a, b)


_MATMULS = ("mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "einsum", "addbmm")


# Elementwise ops that evaluate a transcendental function per element: on a CPU they are
# bound by its arithmetic (a tanh takes tens of cycles), not by the bytes they stream.
_TRANSCENDENTALS = frozenset({
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "tanh", "sigmoid", "erf",
    "erfc", "erfinv", "gelu", "silu", "mish", "softplus", "elu", "selu", "celu", "sin",
    "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "logit", "hardswish",
})


def kernel_family(target: object) -> str:
    """The family of kernels an op belongs to, for the rate and overhead a profile
    measured for it (`HardwareProfile.flops_per_second`, `kernel_overhead`): "matmul",
    "attention", "convolution", "transcendental" (its FLOPs are its elements), else
    "other"."""
    name = str(target).removeprefix("aten.").split(".")[0]
    if "scaled_dot_product" in name or "flash_attention" in name:
        return "attention"
    if "conv" in name:
        return "convolution"
    if name.rstrip("_") in _TRANSCENDENTALS:
        return "transcendental"
    return "matmul" if name in _MATMULS else "other"


def compute_time(flops, nbytes, dtype: torch.dtype, hardware: HardwareProfile,
                 family: str = "other"):
    """Roofline time of one kernel moving `nbytes` and doing `flops`, with the launch floor
    and its `family`'s measured overhead (`kernel_family`); its FLOPs at that family's
    rate, its bytes at that family's bandwidth (`HardwareProfile.bytes_per_second`):

        max(F / (peak x efficiency), B / (bandwidth x efficiency)) + launch + overhead
    """
    peak = hardware.flops_per_second(dtype, family) * hardware.compute_efficiency
    bandwidth = hardware.bytes_per_second(family)
    return (_max(flops / peak, nbytes / bandwidth) + hardware.launch_overhead_s
            + hardware.kernel_overhead(family))


def training_compute_time(flops, nbytes, dtype: torch.dtype, hardware: HardwareProfile,
                          *, differentiable: bool, recompute: bool = False,
                          family: str = "other", kernels: Kernels | None = None):
    """Forward plus (when the op is on the gradient path) backward compute time; a
    recomputed op runs its forward once more in the backward. The backward does
    `BACKWARD_FLOPS_FACTOR` times the forward's FLOPs, at the rate the profile measured
    for its family's backward (`_backward_family`).

    `kernels`, an op's trace (`autopar.values.specs.Kernels`): `nbytes` are the op's
    reference bytes B, and each direction pays a launch per kernel it runs and moves its
    multiple of B (none at all without a kernel):

        forward   max(F / peak, b_f B / bandwidth) + k_f launch + overhead
        backward  max(2 F / peak, b_b B / bandwidth) + k_b launch + overhead

    Without one, each direction is one kernel moving B (the backward 2 B)."""
    backward_family = _backward_family(hardware, family)
    if kernels is None:
        forward = compute_time(flops, nbytes, dtype, hardware, family)
        backward = compute_time(BACKWARD_FLOPS_FACTOR * flops, BACKWARD_FLOPS_FACTOR * nbytes,
                                dtype, hardware, backward_family)
    else:
        forward = _kernels_time(flops, kernels.forward_bytes * nbytes, kernels.forward,
                                dtype, hardware, family)
        backward = _kernels_time(BACKWARD_FLOPS_FACTOR * flops, kernels.backward_bytes * nbytes,
                                 kernels.backward, dtype, hardware, backward_family)
    if not differentiable:
        return forward
    return forward * (2 if recompute else 1) + backward


def _kernels_time(flops, nbytes, count: int, dtype: torch.dtype, hardware: HardwareProfile,
                  family: str):
    """`compute_time` of `count` kernels that together do `flops` and move `nbytes`: one
    launch each, the family's overhead once; 0 for none."""
    if count == 0:
        return 0
    return (compute_time(flops, nbytes, dtype, hardware, family)
            + (count - 1) * hardware.launch_overhead_s)


def _backward_family(hardware: HardwareProfile, family: str) -> str:
    """The family whose measured rate a backward of `family` runs at: "<family>.backward"
    where the profile measured one, else the forward's."""
    backward = f"{family}{BACKWARD}"
    return backward if backward in dict(hardware.kernel_flops) else family


def send_time(nbytes, link: LinkLevel):
    """B / beta + alpha: one point-to-point send of `nbytes` over `link` (a pipeline stage's
    boundary, a step of an attention ring), at the figures the link has for sends."""
    measured = _measured(link, "send", nbytes, 2)
    if measured is not None:
        return measured
    bandwidth, latency = link.figures("send")
    return nbytes / bandwidth + latency


def _measured(link: LinkLevel, kind: str, nbytes, n: int) -> float | None:
    """The link's measured time of the collective (`LinkLevel.measured_time`), for sizes
    known as numbers; None where it has none (the formula's figures then price it)."""
    if isinstance(nbytes, sympy.Basic):
        return None
    return link.measured_time(kind, nbytes, n)


def collective_time(kind: str, nbytes, n: int, link: LinkLevel):
    """alpha-beta time of one collective over `n` devices of `link`, at the bandwidth and
    latency the link has for `kind` (`LinkLevel.figures`); `nbytes` per rank as above."""
    assert kind in COLLECTIVES, kind
    if n == 1:
        return 0
    if kind == "send":
        return send_time(nbytes, link)
    measured = _measured(link, kind, nbytes, n)
    if measured is not None:
        return measured
    bandwidth, latency = link.figures(kind)
    if kind == "broadcast":
        return nbytes / bandwidth + latency
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    return steps * nbytes / (n * bandwidth) + steps * latency


def bucketed_time(kind: str, nbytes, n: int, link: LinkLevel, bucket_bytes: int):
    """`collective_time` of a buffer of `nbytes` sent as part of a bucket of `bucket_bytes`
    (one collective for all the buffers packed into it): its bandwidth term, and the share
    min(1, nbytes / bucket_bytes) of the one latency term the bucket pays. A size kept
    symbolic pays the whole latency."""
    whole = collective_time(kind, nbytes, n, link)
    if isinstance(nbytes, sympy.Basic) or bucket_bytes <= 0 or nbytes >= bucket_bytes:
        return whole
    return whole - (1 - nbytes / bucket_bytes) * collective_time(kind, 0, n, link)


def optimizer_traffic(itemsize: int, state_bytes: float) -> float:
    """Bytes an optimizer step moves per parameter element: the parameter read and
    written, its gradient read, its master copy and states (`state_bytes` per element)
    read and written: 3 itemsize + 2 state_bytes (AdamW in fp32: 28)."""
    return 3 * itemsize + 2 * state_bytes


ADAMW_FP32_TRAFFIC = optimizer_traffic(4, 8)


def optimizer_time(elements, itemsize: int, state_bytes: float, hardware: HardwareProfile):
    """Seconds of the optimizer's step for one parameter piece of `elements`:

        measured   t_tensor + elements x t_element x traffic / ADAMW_FP32_TRAFFIC
        datasheet  launch + elements x traffic / (bandwidth x memory efficiency)

    with `traffic = optimizer_traffic(itemsize, state_bytes)`: a profile's AdamW figures
    scaled by the bytes this optimizer moves, else a memory-bound kernel (an assumption:
    a fused or multi-tensor step, one launch per tensor)."""
    if elements == 0:
        return 0
    traffic = optimizer_traffic(itemsize, state_bytes)
    if hardware.optimizer_element_s is not None:
        per_element = hardware.optimizer_element_s * traffic / ADAMW_FP32_TRAFFIC
        return (hardware.optimizer_tensor_s or 0.0) + elements * per_element
    bandwidth = hardware.bytes_per_second()
    return hardware.launch_overhead_s + elements * traffic / bandwidth


@dataclass(frozen=True)
class Transfer:
    """One collective over one mesh axis; `nbytes` is the per-rank buffer B of the formulas."""

    kind: str
    axis: int
    nbytes: object
    backward: bool

    def time(self, mesh: Mesh, bucket_bytes: int = 0):
        """Its `collective_time` on `mesh`; as part of a bucket when `bucket_bytes` > 0
        (`bucketed_time`)."""
        return bucketed_time(self.kind, self.nbytes, mesh.shape[self.axis],
                             mesh.axis_links[self.axis], bucket_bytes)


def _local_bytes(nbytes, placements: Placements, mesh_shape: tuple[int, ...]):
    if isinstance(nbytes, uneven.TensorBytes):
        return uneven.piece_bytes(nbytes, placements, mesh_shape)
    return _divide(nbytes, _pieces(placements, mesh_shape))


def _pieces(placements: Placements, mesh_shape: tuple[int, ...]) -> int:
    """How many pieces `placements` cut a tensor into: the product of the Shard axes' sizes."""
    pieces = 1
    for placement, size in zip(placements, mesh_shape):
        if isinstance(placement, Shard):
            pieces *= size
    return pieces


def _divide(nbytes, pieces: int):
    if isinstance(nbytes, int) and nbytes % pieces == 0:
        return nbytes // pieces  # keep byte counts exact integers where they divide
    return nbytes / pieces


def axis_collective(src: Placement, dst: Placement) -> str | None:
    """The collective that turns `src` into `dst` on one axis (None: free, a local op)."""
    if src == dst or isinstance(dst, Partial) or (isinstance(src, Replicate)
                                                  and isinstance(dst, Shard)):
        return None  # R -> P keeps the value on one rank (zeros elsewhere); R -> S slices
    if isinstance(src, Partial):
        return "all_reduce" if isinstance(dst, Replicate) else "reduce_scatter"
    assert isinstance(src, Shard)
    return "all_gather" if isinstance(dst, Replicate) else "all_to_all"


Step = tuple[int, Placement, Placement]  # (mesh axis, placement before, placement after)


def conversion_steps(src: Placements, dst: Placements) -> tuple[Step, ...] | None:
    """The per-axis steps turning `src` into `dst`, in execution order, or None.

    Steps that cut the buffer (to Shard) go first, outer axes first; the others (gathers,
    reductions) innermost axis first. A dim sharded over axes a < b is cut outer axis first
    (a rank holds chunk i_a * n_b + i_b, DTensor's order), so a step touching dim d is one
    collective only on the innermost axis that shards d: when the order needs anything else
    (a shard moving between axes, an outer axis changing under an inner one) the conversion
    is not a sequence of single-axis collectives and None says so.
    """
    return _conversion_steps(tuple(src), tuple(dst))


# Pure in hashable placements: planning asks for the same pairs again and again.
@functools.lru_cache(maxsize=1 << 16)
def _conversion_steps(src: Placements, dst: Placements) -> tuple[Step, ...] | None:
    changed = [axis for axis in range(len(src)) if src[axis] != dst[axis]]
    order = sorted(changed, key=lambda axis: (0, axis) if isinstance(dst[axis], Shard)
                   else (1, -axis))
    current = list(src)
    steps = []
    for axis in order:
        for placement in (src[axis], dst[axis]):
            if isinstance(placement, Shard) and Shard(placement.dim) in current[axis + 1:]:
                return None
        steps.append((axis, src[axis], dst[axis]))
        current[axis] = dst[axis]
    return tuple(steps)


@dataclass(frozen=True)
class CollectiveStep:
    """One collective of a redistribution, whatever the tensor's size: `kind` over mesh
    `axis`, run while the tensor is cut into `pieces` (the product of its Shard axes'
    sizes), so that a rank holds 1/pieces of it, turning placements `before` into `after`
    (which only uneven pieces read: steps equal otherwise are the same step)."""

    kind: str
    axis: int
    pieces: int
    before: Placements = field(default=(), compare=False)
    after: Placements = field(default=(), compare=False)

    def buffer_bytes(self, nbytes, mesh_shape: tuple[int, ...]):
        """B of the formulas for a tensor of `nbytes` (global): the rank's piece,
        nbytes / pieces (an exact integer where it divides), times n for an all-gather,
        whose output is the larger side; rank 0's padded buffer for uneven pieces."""
        if isinstance(nbytes, uneven.TensorBytes):
            return uneven.buffer_bytes(nbytes, self.kind, self.axis, self.before, self.after,
                                       mesh_shape)
        before = _divide(nbytes, self.pieces)
        return before * mesh_shape[self.axis] if self.kind == "all_gather" else before


# Pure in hashable placements and the mesh shape: an edge's cost matrix asks for the same
# pairs for every tensor size.
@functools.lru_cache(maxsize=1 << 16)
def collective_plan(src: Placements, dst: Placements, mesh_shape: tuple[int, ...]
                    ) -> tuple[CollectiveStep, ...] | None:
    """The collectives turning a tensor sharded `src` into `dst`, in execution order and
    independent of its size (`redistribute` sizes them), or None when no sequence of
    single-axis collectives does (see `conversion_steps`). All three arguments are tuples
    (it is memoized on them)."""
    steps = _conversion_steps(src, dst)
    if steps is None:
        return None
    current = list(src)
    plan = []
    for axis, s, d in steps:
        kind = axis_collective(s, d)
        before = tuple(current)
        current[axis] = d
        if kind is not None:
            plan.append(CollectiveStep(kind, axis, _pieces(before, mesh_shape), before,
                                       tuple(current)))
    return tuple(plan)


def redistribute(nbytes, src: Placements, dst: Placements, mesh_shape: tuple[int, ...],
                 *, backward: bool = False) -> tuple[Transfer, ...] | None:
    """Collectives that turn a tensor of `nbytes` (global) sharded `src` into `dst`, or None
    when no sequence of single-axis collectives does (`collective_plan`, sized by
    `CollectiveStep.buffer_bytes`)."""
    plan = collective_plan(tuple(src), tuple(dst), tuple(mesh_shape))
    if plan is None:
        return None
    return tuple(Transfer(step.kind, step.axis, step.buffer_bytes(nbytes, mesh_shape), backward)
                 for step in plan)


def arriving_grad(input_placements: Placements, consumer_output: Placements) -> Placements:
    """Placement of the gradient a consumer hands back for one of its inputs."""
    grads = []
    for placement, out in zip(input_placements, consumer_output):
        if isinstance(placement, Partial):
            grads.append(Replicate())
        elif isinstance(placement, Replicate) and not isinstance(out, Replicate):
            grads.append(Partial())
        else:
            grads.append(placement)
    return tuple(grads)


def needed_grad(output_placements: Placements) -> Placements:
    """Placement a producer needs its output's gradient in (Partial reads as Replicate)."""
    return tuple(Replicate() if isinstance(p, Partial) else p for p in output_placements)


def edge_transfers(nbytes, src: Placements, dst: Placements, consumer_output: Placements,
                   mesh_shape: tuple[int, ...], *, requires_grad: bool,
                   regather: bool = False, recompute: bool = False,
                   regather_from: Placements | None = None
                   ) -> tuple[Transfer, ...] | None:
    """Forward and (for tensors on the gradient path) backward collectives of one edge, or
    None when the edge can't be carried out by single-axis collectives.

    `regather` is for parameters stored sharded (ZeRO-3/FSDP) whose consumer keeps them for
    its backward: the gathered copy is freed after the forward and gathered again for the
    backward, so it never counts against memory and its all-gathers are paid twice (only
    gathers can be repeated that way: other conversions of such an edge are refused).
    `recompute` is for a consumer whose output is computed again in the backward: its
    inputs' forward collectives run again there (once, shared with a regather).
    `regather_from`: where a regather gathers from instead of `src`, a copy kept since the
    forward (`autopar.costs.compression.secondary_copy`); its gathers alone are repeated.
    """
    forward = redistribute(nbytes, src, dst, mesh_shape)
    if forward is None:
        return None
    regather = regather and requires_grad
    if regather and any(t.kind != "all_gather" for t in forward):
        return None
    if regather and regather_from is not None and not recompute:
        again = redistribute(nbytes, regather_from, dst, mesh_shape, backward=True)
        if again is None or any(t.kind != "all_gather" for t in again):
            return None
    else:
        again = (tuple(Transfer(t.kind, t.axis, t.nbytes, True) for t in forward)
                 if regather or recompute else ())
    if not requires_grad:
        return forward + again
    backward = redistribute(nbytes, arriving_grad(dst, consumer_output), needed_grad(src),
                            mesh_shape, backward=True)
    return None if backward is None else forward + again + backward


def compute_divisor(inputs: tuple[Placements, ...], output: Placements,
                    mesh_shape: tuple[int, ...]) -> int:
    """How many ways an op's work is divided: axes where its output is Shard, or Partial
    from a Sharded input (a contraction split). Partial from Partial inputs is not divided."""
    divisor = 1
    for axis, (out, size) in enumerate(zip(output, mesh_shape)):
        if isinstance(out, Shard) or (isinstance(out, Partial) and any(
                isinstance(placements[axis], Shard) for placements in inputs)):
            divisor *= size
    return divisor


def local_bytes(nbytes, placements: Placements, mesh_shape: tuple[int, ...]):
    """Bytes one rank holds of a tensor of `nbytes` (global) sharded `placements`."""
    return _local_bytes(nbytes, placements, mesh_shape)
