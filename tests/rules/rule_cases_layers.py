"""Representative calls of the pooling, interpolation and recurrent ops (see `rule_cases`):
batch and channel sizes divisible by 4, spatial sizes that windows and scales do not
divide, unbatched inputs, several layers and directions."""

from __future__ import annotations

import torch
from rule_cases import call, f

aten = torch.ops.aten

POOLING = [
    call("max_pool1d", aten.max_pool1d.default, f(4, 8, 10), [3], [2], [1]),
    call("max_pool2d", aten.max_pool2d.default, f(4, 8, 6, 6), [2, 2]),
    call("max_pool2d_unbatched", aten.max_pool2d.default, f(8, 6, 6), [3, 3], [1, 1], [1, 1]),
    call("max_pool3d", aten.max_pool3d.default, f(2, 4, 4, 4, 4), [2, 2, 2]),
    call("max_pool1d_indices", aten.max_pool1d_with_indices.default, f(4, 8, 9), [2]),
    call("max_pool2d_indices", aten.max_pool2d_with_indices.default, f(4, 8, 7, 7), [3, 3],
         [2, 2], [1, 1], [1, 1], True),
    call("max_pool3d_indices", aten.max_pool3d_with_indices.default, f(2, 4, 4, 4, 4),
         [2, 2, 2], [1, 1, 1]),
    call("avg_pool1d", aten.avg_pool1d.default, f(4, 8, 10), [3], [2], [1], False, False),
    call("avg_pool2d", aten.avg_pool2d.default, f(4, 8, 7, 7), [3, 3], [2, 2], [1, 1], True,
         False),
    call("avg_pool2d_divisor", aten.avg_pool2d.default, f(8, 6, 6), [2, 2],
         divisor_override=3),
    call("avg_pool3d", aten.avg_pool3d.default, f(2, 4, 4, 4, 4), [2, 2, 2]),
    call("adaptive_avg_pool1d", aten.adaptive_avg_pool1d.default, f(4, 8, 10), [3]),
    call("adaptive_avg_pool2d", aten.adaptive_avg_pool2d.default, f(4, 8, 7, 7), [3, 3]),
    call("adaptive_avg_pool2d_global", aten.adaptive_avg_pool2d.default, f(8, 5, 5), [1, 1]),
    call("_adaptive_avg_pool2d", aten._adaptive_avg_pool2d.default, f(4, 8, 6, 6), [4, 4]),
    call("adaptive_avg_pool3d", aten.adaptive_avg_pool3d.default, f(2, 4, 5, 5, 5), [2, 2, 2]),
    call("adaptive_max_pool1d", aten.adaptive_max_pool1d.default, f(4, 8, 10), [3]),
    call("adaptive_max_pool2d", aten.adaptive_max_pool2d.default, f(4, 8, 7, 7), [3, 3]),
    call("adaptive_max_pool3d", aten.adaptive_max_pool3d.default, f(2, 4, 5, 5, 5), [2, 2, 2]),
]

UPSAMPLE = [
    call("nearest1d", aten.upsample_nearest1d.vec, f(4, 8, 5), None, [2.0]),
    call("nearest2d_size", aten.upsample_nearest2d.vec, f(4, 8, 3, 3), [5, 7], None),
    call("nearest2d_default", aten.upsample_nearest2d.default, f(4, 8, 3, 3), [6, 6]),
    call("nearest3d", aten.upsample_nearest3d.vec, f(2, 4, 2, 2, 2), None, [2.0, 2.0, 2.0]),
    call("nearest_exact2d", aten._upsample_nearest_exact2d.vec, f(4, 8, 3, 3), None,
         [1.5, 1.5]),
    call("linear1d", aten.upsample_linear1d.vec, f(4, 8, 5), None, False, [2.0]),
    call("bilinear2d_corners", aten.upsample_bilinear2d.vec, f(4, 8, 3, 3), None, True,
         [2.0, 2.0]),
    call("bilinear2d_size", aten.upsample_bilinear2d.vec, f(4, 8, 3, 3), [5, 7], False, None),
    call("bilinear2d_default", aten.upsample_bilinear2d.default, f(4, 8, 3, 3), [6, 6], False),
    call("bilinear2d_aa", aten._upsample_bilinear2d_aa.vec, f(4, 8, 6, 6), [3, 3], False, None),
    call("bicubic2d", aten.upsample_bicubic2d.vec, f(4, 8, 3, 3), [6, 6], False, None),
    call("trilinear3d", aten.upsample_trilinear3d.vec, f(2, 4, 2, 2, 2), None, False,
         [2.0, 2.0, 2.0]),
]


def _weights(gates: int, inputs: int, hidden: int, layers: int = 1, directions: int = 1,
             biases: bool = True, proj: int = 0) -> list[torch.Tensor]:
    """The flat `params` list of an RNN, in nn.LSTM/GRU/RNN order: per layer and direction
    W_ih, W_hh, then b_ih, b_hh, then W_hr (projection)."""
    params = []
    out = proj or hidden
    for layer in range(layers):
        width = inputs if layer == 0 else out * directions
        for _ in range(directions):
            params += [f(gates * hidden, width), f(gates * hidden, out)]
            if biases:
                params += [f(gates * hidden), f(gates * hidden)]
            if proj:
                params.append(f(proj, hidden))
    return params


RECURRENT = [
    # input [T, B, in], hx [layers * directions, B, hidden]: sequence first. `train` False:
    # in training these ops are random ops to the lowering (see `recurrent`).
    call("lstm", aten.lstm.input, f(5, 4, 3), [f(1, 4, 6), f(1, 4, 6)], _weights(4, 3, 6),
         True, 1, 0.0, False, False, False),
    call("lstm_2layers_bidirectional", aten.lstm.input, f(3, 4, 3),
         [f(4, 4, 4), f(4, 4, 4)], _weights(4, 3, 4, layers=2, directions=2), True, 2, 0.5,
         False, True, False),
    call("lstm_proj", aten.lstm.input, f(3, 4, 3), [f(1, 4, 2), f(1, 4, 5)],
         _weights(4, 3, 5, proj=2), True, 1, 0.0, False, False, False),
    call("lstm_batch_first", aten.lstm.input, f(4, 3, 3), [f(1, 4, 6), f(1, 4, 6)],
         _weights(4, 3, 6), True, 1, 0.0, False, False, True),
    call("lstm_train_dropout", aten.lstm.input, f(3, 4, 3), [f(2, 4, 4), f(2, 4, 4)],
         _weights(4, 3, 4, layers=2), True, 2, 0.5, True, False, False),
    call("gru", aten.gru.input, f(5, 4, 3), f(1, 4, 6), _weights(3, 3, 6), True, 1, 0.0, False,
         False, False),
    call("gru_2layers_no_bias", aten.gru.input, f(3, 8, 3), f(2, 8, 4),
         _weights(3, 3, 4, layers=2, biases=False), False, 2, 0.0, False, False, False),
    call("gru_bidirectional", aten.gru.input, f(3, 4, 3), f(2, 4, 4),
         _weights(3, 3, 4, directions=2), True, 1, 0.0, False, True, False),
    call("rnn_tanh", aten.rnn_tanh.input, f(4, 4, 3), f(1, 4, 5), _weights(1, 3, 5), True, 1,
         0.0, False, False, False),
    call("rnn_relu", aten.rnn_relu.input, f(4, 4, 3), f(1, 4, 5), _weights(1, 3, 5), True, 1,
         0.0, False, False, False),
]

CASES = POOLING + UPSAMPLE + RECURRENT
