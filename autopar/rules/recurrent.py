"""Recurrent layers: lstm, gru, rnn_tanh, rnn_relu, in their `.input` overloads (what nn.LSTM,
nn.GRU and nn.RNN export to on padded batches; `.data` takes packed sequences).

`lstm(input, hx=[h0, c0], params, has_biases, num_layers, dropout, train, bidirectional,
batch_first) -> (output, h_n, c_n)`; gru and rnn take `hx` = h0 alone and return
(output, h_n). Shapes: input [T, B, in] ([B, T, in] with batch_first), h0, c0, h_n and c_n
[layers * directions, B, hidden], output [T, B, directions * hidden] ([B, T, ...] with
batch_first). An unbatched call is exported with a batch of one (unsqueeze, then squeeze).

Every sample runs its own recurrence with the same weights, so the batch splits exactly:
input, h0 and c0 split on their batch dim, every weight and bias `R` (its gradient is then a
summand on each rank, all-reduced), every output split on its batch dim. The contract gives
all the outputs of an op one placement, so the split is offered where they agree: with
batch_first=False the batch is dim 1 of input, output, h_n and c_n alike (input `S(1)`, hx
`S(1)` -> `S(1)`). With batch_first=True the output's batch is dim 0 and h_n's dim 1: no one
placement describes them, and the rule offers nothing. `DECOMPOSITIONS` (run by capture)
therefore rewrites a batch_first call as the sequence-first one between two transposes,
which is what ATen does inside the op (views, no copy): the views' rules carry the batch
split across them.

Never offered: the time dim (the recurrence runs through it in order), the hidden dim (each
gate reads the whole previous hidden state through W_hh), `P` (the gates are not linear).

These ops are tagged `nondeterministic_seeded`: in training, with dropout > 0 and more than
one layer, they draw a dropout mask between layers inside the kernel. A rank running the op
on its samples would draw a mask of its own, not its chunk of the whole batch's (obligation
4 of `autopar.rules`), so the split is offered only when no number is drawn, and only when
the lowering agrees (`common.draws`, which the lowering asks before running a split
random op, and which refuses what it cannot reproduce).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autopar.rules.base import AxisStrategy, OpSpec, Rule
from autopar.rules.common import S, argument, by_name, draws, finish

aten = torch.ops.aten


def _draws_nothing(op: OpSpec) -> bool:
    """No dropout mask: eval mode, a zero probability, or one layer (dropout only applies
    between layers); and the lowering sees it so too."""
    quiet = (not argument(op, "train") or argument(op, "dropout") == 0
             or argument(op, "num_layers") == 1)
    return quiet and not draws(op.target, tuple(op.args), dict(op.kwargs))


def _recurrent(op: OpSpec) -> list[AxisStrategy]:
    x = argument(op, "input")
    if x.ndim != 3 or argument(op, "batch_first", False) or x.shape[1] <= 1:
        return []
    if not _draws_nothing(op):
        return []
    return finish([by_name(op, {"input": S(1), "hx": S(1)}, S(1))])


def _sequence_first(op: object) -> Callable:
    """Decomposition of a batch_first `op` call: transpose in, sequence-first op, transpose
    the output back (h_n and c_n are laid out the same either way)."""

    def decompose(x, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                  batch_first):
        if not batch_first or x.dim() != 3:
            return NotImplemented
        outputs = op(aten.transpose.int(x, 0, 1), hx, params, has_biases, num_layers, dropout,
                     train, bidirectional, False)
        return (aten.transpose.int(outputs[0], 0, 1), *outputs[1:])

    return decompose


_OPS = (aten.lstm.input, aten.gru.input, aten.rnn_tanh.input, aten.rnn_relu.input)

RULES: dict[object, Rule] = dict.fromkeys(_OPS, _recurrent)

DECOMPOSITIONS: dict[object, Callable] = {op: _sequence_first(op) for op in _OPS}
