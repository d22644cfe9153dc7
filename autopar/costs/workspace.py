"""Kernel workspaces: memory a kernel allocates while it runs and frees before it returns,
besides its outputs and what it saves for the backward. One rank's bytes, from the local
bytes of the kernel's operands (x the input, w the weight, y the output):

    convolution, forward     max(x, y) + w
    convolution, backward    max(2 max(x, y), w)

A convolution kernel works on its operands in a layout of its own: torch's CPU convolution
(oneDNN) reorders the larger of its activations and the weight into blocked copies in the
forward, and in the backward two activation-sized buffers (the incoming gradient reordered,
the input's gradient before it is reordered back), or the weight's when that is larger.
These are what a rank's allocator measured around each convolution (2 to 128 channels,
strides 1 and 2, kernels 1 and 3), within 10% of the larger activation except where the
input is much smaller than the output (a first layer of 3 channels: 1.32 of the output
where the formula says 2). cuDNN's workspaces are of the same order for its default
algorithms; on a GPU they are an assumption, not a measurement. Every other family has no
workspace: its intermediates are ops of the graph, charged as such.
"""

from __future__ import annotations

from dataclasses import dataclass

# The kernel families (`formulas.kernel_family`) that allocate a workspace.
FAMILIES = frozenset({"convolution"})


@dataclass(frozen=True)
class Workspace:
    """Bytes one rank's kernel holds while it runs, in the forward and in the backward."""

    forward: float = 0.0
    backward: float = 0.0


def kernel_workspace(family: str, operands: tuple[float, ...], output: float) -> Workspace:
    """The `Workspace` of a kernel of `family` (`formulas.kernel_family`) whose tensor
    operands hold `operands` bytes on one rank (in the op's argument order) and its output
    `output` bytes (module docstring)."""
    if family not in FAMILIES or len(operands) < 2:
        return Workspace()
    activation, weight = max(operands[0], output), operands[1]
    return Workspace(activation + weight, max(2 * activation, weight))
