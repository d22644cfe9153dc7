"""What one op or one parameter costs a rank under a strategy: the op's seconds
(`op_compute_time`, `op_time` with a context-parallel attention's ring, `op_ring`), a
parameter's bytes (`stored_parameter_bytes`, `parameter_bytes`) and its optimizer step's
seconds (`parameter_step_time`). Pure functions of a node's meta, its strategy and the
mesh, shared by the problem pass (`build_problem`) and the plan it extracts
(`extract_plan`), which gives the same formulas symbolic sizes."""

from __future__ import annotations

import itertools

import sympy
import torch.fx as fx

from autopar.costs import formulas, uneven
from autopar.costs.compression import codec_bytes, codec_flops, secondary_pieces, state_bytes
from autopar.costs.optimizer_state import OptimizerState
from autopar.costs.ring import Ring, ring_of
from autopar.passes.capturing.gradient_path import tensor_outputs
from autopar.passes.capturing.trace_kernels import priced_kernels
from autopar.passes.strategies.find_strategies import Strategy, op_spec, tensor_inputs
from autopar.rules.attention import RING_TARGETS
from autopar.values.compression import compression_named
from autopar.values.hardware import HardwareProfile
from autopar.values.mesh import Mesh
from autopar.values.placement import Replicate, Shard, Shares, local_shape
from autopar.values.specs import FLOPS, TensorSpec


def op_compute_time(node: fx.Node, strategy: Strategy, mesh: Mesh, *, differentiable: bool,
                    size=lambda value: value):
    """Seconds one rank computes `node` under `strategy` (forward, backward, recompute):
    the node's FLOPs and bytes (on a CPU profile, the kernels it was traced to run:
    `trace_kernels.priced_kernels`), through `size` (a number for the solve, the sympy
    formula for the plan), divided over the axes the strategy splits the work on. 0 for
    ops that launch no kernel (views, metadata; on a CPU, a view whose backward runs one
    pays for it) and for nodes that are not ops."""
    if node.op != "call_function":
        return 0
    kernels, nbytes = priced_kernels(node, mesh.hardware.device)
    flops, nbytes = size(node.meta.get(FLOPS, 0)), size(nbytes)
    if flops == 0 and nbytes == 0:
        return 0
    divisor = formulas.compute_divisor(strategy.inputs, strategy.output, mesh.shape)
    times = []
    for hardware, load in _loads(node, strategy, mesh):
        # Not divided by 1.0 where even: the plan's formula stays a ratio of integers.
        share = divisor if load == 1 else divisor / load
        times.append(formulas.training_compute_time(
            flops / share, nbytes / share, tensor_outputs(node)[0].dtype, hardware,
            differentiable=differentiable, recompute=strategy.recompute,
            family=formulas.kernel_family(node.target), kernels=kernels))
    return times[0] if len(times) == 1 else _slowest(times)


def _loads(node: fx.Node, strategy: Strategy, mesh: Mesh) -> set[tuple[HardwareProfile, float]]:
    """(device kind, load) of the ranks whose time may be the op's (`loads`, over its
    tensors)."""
    specs = [spec for _, spec in tensor_inputs(node)] + [tensor_outputs(node)[0]]
    return loads([uneven.cost_bytes(spec, mesh) for spec in specs],
                 [*strategy.inputs, strategy.output], mesh)


def loads(sizes: list, placements: list, mesh: Mesh) -> set[tuple[HardwareProfile, float]]:
    """(device kind, load) of the ranks whose work may take longest, for an op over
    tensors of `sizes` (`uneven.cost_bytes`) placed `placements`: a rank's load is its work
    over an even share's, the most any of the tensors puts on it (`uneven.imbalance`). On
    an axis with shares that splits a tensor, each index's pieces (of the tensors cut
    there) on its own kind (the slowest there); elsewhere the largest pieces on the mesh's
    profile."""
    weighted = [a for a in range(mesh.ndim) if mesh.shares and mesh.shares[a] is not None
                and any(isinstance(p[a], Shard) for p in placements)]
    if not weighted:
        return {(mesh.hardware, max(uneven.imbalance(size, p, mesh.shape)
                                    for size, p in zip(sizes, placements)))}
    cut = [(size, p) for size, p in zip(sizes, placements)
           if any(isinstance(p[a], Shard) for a in weighted)]
    found = set()
    for indices in itertools.product(*(range(mesh.shape[a]) for a in weighted)):
        coordinate = [None] * mesh.ndim
        for axis, index in zip(weighted, indices):
            coordinate[axis] = index
        load = max(uneven.imbalance(size, p, mesh.shape, tuple(coordinate)) for size, p in cut)
        found.add((mesh.slowest_at(dict(zip(weighted, indices))), load))
    return found


def _slowest(times: list):
    """The largest of `times`, numbers or sympy expressions."""
    if any(isinstance(t, sympy.Basic) and t.free_symbols for t in times):
        return sympy.Max(*times)
    return max(times)


def op_ring(node: fx.Node, strategy: Strategy, mesh: Mesh, size=lambda value: value
            ) -> Ring | None:
    """The ring a context-parallel attention `node` runs under `strategy`, else None, with
    its tensors' bytes through `size` (as in `op_compute_time`)."""
    if node.op != "call_function" or node.target not in RING_TARGETS:
        return None
    return ring_of(op_spec(node), strategy.inputs, strategy.output, mesh.shape,
                   nbytes=lambda spec: size(spec.sym_nbytes))


def op_time(node: fx.Node, strategy: Strategy, mesh: Mesh, *, differentiable: bool,
            size=lambda value: value):
    """`op_compute_time`, plus for a context-parallel attention its ring's extra kernel
    launches and the part of its transfers its compute does not hide
    (`autopar.costs.ring`)."""
    both = op_compute_time(node, strategy, mesh, differentiable=differentiable, size=size)
    ring = op_ring(node, strategy, mesh, size)
    if ring is None:
        return both
    forward = op_compute_time(node, strategy, mesh, differentiable=False, size=size)
    return (both + ring.launch_seconds(mesh.hardware, differentiable=differentiable)
            + ring.exposed_seconds(forward, both - forward, mesh,
                                   differentiable=differentiable))


def stored_parameter_bytes(spec: TensorSpec, placements, mesh_shape: tuple[int, ...],
                           optimizer: OptimizerState, shares: Shares = None
                           ) -> tuple[float, float]:
    """(bytes of a parameter's stored piece, which its gradient has too; bytes of its
    master copy and optimizer states) on the rank holding the largest, stored as
    `placements` on a mesh of `mesh_shape` cut by `shares`."""
    stored = formulas.local_bytes(uneven.tensor_bytes(spec, mesh_shape, shares), placements,
                                  mesh_shape)
    return stored, stored // spec.itemsize * optimizer.element_bytes(spec.dtype)


def parameter_step_time(spec: TensorSpec, placements, mesh: Mesh, optimizer: OptimizerState):
    """Seconds of the optimizer's step for a parameter stored as `placements`: on the
    slowest rank, its stored piece on its own kind (`formulas.optimizer_time`, `loads`)."""
    size = uneven.cost_bytes(spec, mesh)
    even = formulas.local_bytes(spec.nbytes, placements, mesh.shape) / spec.itemsize
    return max(formulas.optimizer_time(even * load, spec.dtype.itemsize,
                                       optimizer.element_bytes(spec.dtype), hardware)
               for hardware, load in loads([size], [placements], mesh))


def compression_time(spec: TensorSpec, strategy: Strategy, mesh: Mesh, *, trained: bool = True):
    """Seconds a parameter's compressed collectives add to a step besides their bytes (0
    without one, `autopar.costs.compression`): encoding and decoding, memory-bound passes
    over the whole tensor (an upper bound where it is split otherwise too; a `trained`
    parameter gathered in int8 twice, for the forward and again for the backward, unless
    the backward gathers hpz's copy), hpz's cut, and for PowerSGD its products and the
    latency of its second all-reduce."""
    if strategy.compression is None:
        return 0
    compression = compression_named(strategy.compression)
    local = local_shape(spec.shape, strategy.output, mesh.shape)
    moved = codec_bytes(compression, spec.numel, spec.itemsize,
                        2 if trained and not compression.keeps_copy else 1,
                        secondary_pieces(strategy.output, mesh.shape))
    seconds = formulas.compute_time(codec_flops(compression, local), moved, spec.dtype,
                                    mesh.hardware)
    if "low-rank" in compression.kinds:
        seconds += max((formulas.collective_time("all_reduce", 0, n, link)
                        for n, link, placement in zip(mesh.shape, mesh.axis_links,
                                                      strategy.output)
                        if isinstance(placement, Replicate)), default=0)
    return seconds


def parameter_bytes(spec: TensorSpec, strategy: Strategy, mesh: Mesh, optimizer: OptimizerState,
                    saving_uses: int, uses: int, *, gradient: bool = True,
                    trained: bool = True, in_flight: int = 1) -> float:
    """Bytes one rank holds for a parameter: its stored piece, gradient (unless not
    `gradient`), master copy and optimizer states (all stored as `strategy.output`; a frozen
    parameter, not `trained`, has only its piece), plus, when it is kept gathered, one
    gathered copy for each use that saves it for the backward (ZeRO-2), or a gathered copy
    and its whole gradient for each of its `uses` (ZeRO-1, kept for the step), and what a
    compression keeps between steps (`compression.state_bytes`: PowerSGD's) or for the
    backward ("hpz": its copy, cut n ways, for each use that saves it and each of the
    `in_flight` micro-batches whose backward is pending, charged for the step as ZeRO-2's
    are, and as if gathered whole: an upper bound where a use reads it split otherwise
    too)."""
    stored, states = stored_parameter_bytes(spec, strategy.output, mesh.shape, optimizer,
                                            mesh.shares)
    total = (2 if gradient else 1) * stored + states if trained else stored
    if strategy.compression is not None and trained:
        compression = compression_named(strategy.compression)
        total += state_bytes(compression, local_shape(spec.shape, strategy.output, mesh.shape),
                             spec.itemsize)
        if compression.keeps_copy:  # 1 piece: no copy (`secondary_pieces`)
            pieces = secondary_pieces(strategy.output, mesh.shape)
            total += (in_flight * saving_uses * uneven.cost_bytes(spec, mesh) / pieces
                      if pieces > 1 else 0)
    if strategy.gathered is not None:
        copies = (2 if trained else 1) * uses if strategy.whole_gradient else saving_uses
        total += copies * formulas.local_bytes(uneven.cost_bytes(spec, mesh),
                                               strategy.gathered, mesh.shape)
    return total
