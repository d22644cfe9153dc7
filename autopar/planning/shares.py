"""Pieces sized to the devices: the shares of a mesh axis whose devices differ in kind.

An axis along which the devices differ (an H100 node and an A100 node) cuts what it splits
in proportion to each index's speed, so that every device finishes its piece at about the
same time. Where the step's work is separable along the axis (data parallelism: each op
works sample by sample), the exact rule gives index i a weight inversely proportional to
the time its devices (the slowest of them) take for the whole step on one device:

    weight_i = round(SCALE x T_fastest / T_i)

with T_i the cost model's own compute time of every op of the graph, unsplit, on that kind
(`op_costs.op_compute_time`): the proportion follows the model's mix of compute- and
memory-bound ops, not one datasheet ratio. The weights are then the batch's pieces under
them (64 samples at 25 : 9 over 4 + 4 devices: 12, 12, 12, 12, 4, 4, 4, 4), so that the batch
splits exactly in proportion, and so does every dim a view merges it into (batch x
positions): their pieces line up (`find_strategies`). The solver then chooses, with these
pieces, what to split on the axis. A mesh given shares, or "even", is planned as it is.
"""

from __future__ import annotations

import math

import torch.fx as fx

from autopar.passes.capturing.capture import is_training
from autopar.passes.problem.op_costs import op_compute_time
from autopar.passes.strategies.find_strategies import Strategy, is_decision, tensor_inputs
from autopar.values.hardware import HardwareProfile
from autopar.values.mesh import Mesh
from autopar.values.placement import Replicate, chunk_sizes
from autopar.values.specs import ROLE, TENSOR, TensorSpec

# The fastest index's weight: a share is rounded to 1% of it.
SCALE = 100


def speed_shares(gm: fx.GraphModule, mesh: Mesh) -> Mesh:
    """`mesh` with shares on each axis along which its devices differ, from their speed on
    `gm` (module docstring); `mesh` itself when it has shares already or is of one kind."""
    mixed = mesh.mixed_axes()
    if mesh.shares is not None or not mixed:
        return mesh
    shares: list[tuple[int, ...] | None] = [None] * mesh.ndim
    batch = _batch(gm)
    for axis in mixed:
        times = [step_compute(gm, mesh.slowest_at({axis: index}))
                 for index in range(mesh.shape[axis])]
        weights = tuple(max(1, round(SCALE * min(times) / t)) for t in times)
        pieces = chunk_sizes(batch, len(weights), weights) if batch else (0,)
        weights = pieces if min(pieces) > 0 else weights
        if len(set(weights)) > 1:  # equal weights: DTensor's chunks, which stored tensors take
            divisor = math.gcd(*weights)
            shares[axis] = tuple(w // divisor for w in weights)
    return mesh.with_shares(tuple(shares))


def _batch(gm: fx.GraphModule) -> int:
    """Dim 0 of the first user input that has one (0: none)."""
    for node in gm.graph.nodes:
        spec = node.meta.get(TENSOR)
        if node.op == "placeholder" and node.meta.get(ROLE) == "input" \
                and isinstance(spec, TensorSpec) and spec.ndim and spec.sym_shape is None:
            return spec.shape[0]
    return 0


def step_compute(gm: fx.GraphModule, hardware: HardwareProfile) -> float:
    """Seconds one device of `hardware` computes every op of `gm`, nothing split."""
    alone = Mesh((1,), ("x",), hardware=hardware)
    training = is_training(gm)
    total = 0.0
    for node in gm.graph.nodes:
        if node.op == "call_function" and is_decision(node):
            whole = (Replicate(),)
            strategy = Strategy(tuple(whole for _ in tensor_inputs(node)), whole)
            total += float(op_compute_time(node, strategy, alone, differentiable=training))
    return total
