"""Representative calls of the convolution (and transposed convolution), group_norm and
instance_norm ops (see `rule_cases`)."""

from __future__ import annotations

import torch
from rule_cases import call, f, pos

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
    call("conv_transpose1d", aten.conv_transpose1d.default, f(4, 8, 5), f(8, 4, 3), f(4), [2]),
    call("conv_transpose2d", aten.conv_transpose2d.input, f(4, 8, 5, 5), f(8, 4, 3, 3), f(4),
         [2, 2], [1, 1], [1, 1]),
    call("conv_transpose2d_grouped", aten.conv_transpose2d.input, f(4, 8, 5, 5),
         f(8, 2, 3, 3), None, [1, 1], [0, 0], [0, 0], 2),
    call("conv_transpose2d_unbatched", aten.conv_transpose2d.input, f(8, 5, 5),
         f(8, 4, 3, 3), f(4)),
    call("conv_transpose3d", aten.conv_transpose3d.input, f(2, 4, 3, 3, 3), f(4, 4, 2, 2, 2),
         f(4), [2, 2, 2]),
    call("group_norm", aten.group_norm.default, f(4, 8, 3, 3), 4, f(8), f(8), 1e-5),
    call("group_norm_plain", aten.group_norm.default, f(4, 8, 5), 2),
    call("instance_norm", aten.instance_norm.default, f(4, 8, 5, 5), None, None, None, None,
         True, 0.1, 1e-5, False),
    call("instance_norm_affine", aten.instance_norm.default, f(4, 8, 5), f(8), f(8), None,
         None, True, 0.1, 1e-5, False),
    call("instance_norm_running", aten.instance_norm.default, f(4, 8, 4, 4), f(8), f(8), f(8),
         pos(8), False, 0.1, 1e-5, False, frozen=(3, 4)),
]

