"""Convolutions: conv1d, conv2d, conv3d and convolution (what nn.ConvNd exports to), and
conv_transpose1d/2d/3d (what nn.ConvTransposeNd exports to).

A convolution is a product over channels and the kernel window, done at every output
position: `out[n, o] = sum_c conv(x[n, c], W[o, c]) + bias[o]`, with x = [N, C_in, *space],
W = [C_out, C_in, *kernel] (W = [C_in, C_out, *kernel] when transposed: `convolution` with
`transposed=True`, and every conv_transpose). Over one mesh axis:

- batch (data parallel): x `S(0)`, W and bias `R` -> output `S(0)`;
- output channels (tensor parallel): x `R`, W and bias split on C_out -> output `S(1)`;
- input channels (the contraction): x `S(1)`, W split on C_in -> each rank holds a summand,
  output `P`; a bias `R` there would be added once per rank, so it is `P` too (the caller
  converts the replicated parameter to a summand, as for the row split of `linear`);
- x `P` with W `R` -> `P` (linear in x), bias `P` likewise.

Spatial dims are never split: a window at a chunk's border reads the neighbour's rows (a
halo exchange the lowering does not do). Grouped convolutions (`groups > 1`) are split on
the batch only: a channel split would have to cut along group boundaries and change the
`groups` argument per rank. An unbatched input (no N dim) has channels at dim 0.
"""

from __future__ import annotations

import torch

from autopar.rules.base import AxisStrategy, OpSpec, Rule
from autopar.rules.common import P, R, S, argument, by_name, finish, is_float

aten = torch.ops.aten


_TRANSPOSED = frozenset({aten.conv_transpose1d, aten.conv_transpose2d, aten.conv_transpose3d})


def _convolution(op: OpSpec) -> list[AxisStrategy]:
    x, w, out = argument(op, "input"), argument(op, "weight"), op.outputs[0]
    transposed = (getattr(op.target, "overloadpacket", None) in _TRANSPOSED
                  or bool(argument(op, "transposed", False)))
    batched = x.ndim == w.ndim
    channel = 1 if batched else 0
    # The weight's C_out and C_in dims swap places in a transposed convolution.
    w_out, w_in = (1, 0) if transposed else (0, 1)

    def placed(px, pw, pb, po) -> AxisStrategy:
        # A missing bias has no tensor slot: `by_name` places only the tensors present.
        return by_name(op, {"input": px, "weight": pw, "bias": pb}, po)

    strategies = []
    if batched and x.shape[0] > 1:
        strategies.append(placed(S(0), R, R, S(0)))
    if argument(op, "groups", 1) == 1:
        if out.shape[channel] > 1:
            strategies.append(placed(R, S(w_out), S(0), S(channel)))
        if x.shape[channel] > 1 and is_float(out):
            strategies.append(placed(S(channel), S(w_in), P, P))
    if is_float(x) and is_float(out):
        strategies.append(placed(P, R, P, P))
    return finish(strategies)


RULES: dict[object, Rule] = {
    # Packets: the `.padding` overloads ("same"/"valid") split the same way.
    aten.conv1d: _convolution,
    aten.conv2d: _convolution,
    aten.conv3d: _convolution,
    aten.convolution.default: _convolution,
    aten.conv_transpose1d.default: _convolution,
    aten.conv_transpose2d.input: _convolution,
    aten.conv_transpose3d.input: _convolution,
}
