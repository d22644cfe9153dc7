"""Representative calls of the convolution and group_norm ops (see `rule_cases`)."""

from __future__ import annotations

import torch
from rule_cases import call, f

aten = torch.ops.aten

CASES = [
    call("conv2d_bias", aten.conv2d.default, f(4, 8, 6, 6), f(12, 8, 3, 3), f(12), [2, 2],
         [1, 1]),
    call("conv2d", aten.conv2d.default, f(4, 8, 6, 6), f(4, 8, 1, 1), None, [2, 2]),
    call("conv2d_same", aten.conv2d.padding, f(4, 4, 5, 5), f(8, 4, 3, 3), f(8), [1, 1],
         "same"),
    call("conv2d_unbatched", aten.conv2d.default, f(8, 6, 6), f(4, 8, 3, 3), f(4)),
    call("conv2d_dilated", aten.conv2d.default, f(4, 4, 9, 9), f(8, 4, 3, 3), None, [1, 1],
         [2, 2], [2, 2]),
    call("conv2d_grouped", aten.conv2d.default, f(4, 8, 6, 6), f(8, 4, 3, 3), f(8), [1, 1],
         [1, 1], [1, 1], 2),
    call("conv1d", aten.conv1d.default, f(4, 8, 10), f(4, 8, 3), f(4)),
    call("conv3d", aten.conv3d.default, f(2, 4, 4, 4, 4), f(4, 4, 2, 2, 2)),
    call("convolution", aten.convolution.default, f(4, 8, 6, 6), f(4, 8, 3, 3), f(4), [1, 1],
         [1, 1], [1, 1], False, [0, 0], 1),
    call("conv_transposed", aten.convolution.default, f(4, 8, 5, 5), f(8, 4, 3, 3), f(4),
         [2, 2], [1, 1], [1, 1], True, [1, 1], 1),
    call("group_norm", aten.group_norm.default, f(4, 8, 3, 3), 4, f(8), f(8), 1e-5),
    call("group_norm_plain", aten.group_norm.default, f(4, 8, 5), 2),
]

