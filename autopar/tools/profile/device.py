"""What one device computes, measured on one rank while every other rank measures too.

Each figure is a `Timing` of a kernel whose work is known from its size, so that the
profile can turn it into a rate:

- `matmul/<dtype>`: square matmuls, n x n by n x n (2 n^3 FLOPs), per size n;
- `matvec/<n>`: a batched matrix-vector product, `MATVEC_BATCH` n x n matrices by n x 1
  (memory-bound: 4 (n^2 + 2n) bytes per matrix), per size n;
- `elementwise`: an out-of-place add of two fp32 tensors (12 bytes per element moved),
  per element count; `transcendental`: a tanh (one FLOP per element, by annotate's
  count), per element count, and `transcendental.backward` its backward; `copy`: one
  copy of `COPY_BYTES`, read and written;
- `attention/<s>`: fp32 attention over sequences of s (`ATTENTION_SHAPE` the rest);
  `convolution/<side>`: an fp32 3x3 convolution of images side x side (`CONVOLUTION_SHAPE`);
  `attention.backward/<s>`, `convolution.backward/<side>`: their backwards alone, to
  every input (twice the forward's FLOPs, by the cost model's convention);
- `launch`: one op on one element (the dispatch floor); `autograd_op`: an op of a chain
  recorded by autograd, its forward and backward, per op (what an op costs the way
  training runs it);
- `adamw/<e>`: torch's AdamW step over `ADAMW_TENSORS` tensors of e elements, per tensor;
- `allocator_overhead`: what the allocator holds for many tensors of mixed sizes over
  their bytes, less one (the resident memory of a CPU process; reserved over allocated
  bytes on CUDA).

On CUDA every timing waits for the device (`torch.cuda.synchronize`) before it starts and
before it ends.
"""

from __future__ import annotations

import functools
import itertools
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from autopar.tools.profile.timing import Timing, timed

COPY_BYTES = 32 * 2**20
ADAMW_TENSORS = 8
AUTOGRAD_CHAIN = 32
# (batch, heads, head dim) of the attention kernel, non-causal.
ATTENTION_SHAPE = (4, 4, 64)
# (batch, channels in = out, kernel) of the convolution.
CONVOLUTION_SHAPE = (8, 32, 3)
MATMUL_DTYPES = (torch.float32, torch.bfloat16)
MATVEC_BATCH = 64
# A kernel's calls cycle through copies of its inputs of at least this many bytes in all
# (more than a CPU's last-level cache), at most `MAX_COPIES` of them.
COLD_BYTES = 64 * 2**20
MAX_COPIES = 4096
LOW_PRECISION_LARGEST = 256


def attention_flops(seq: int) -> float:
    """QK^T and the weighted sum of V: 2 matmuls of 2 b h s^2 d FLOPs."""
    batch, heads, dim = ATTENTION_SHAPE
    return 4 * batch * heads * seq * seq * dim


def matvec_bytes(n: int) -> float:
    """What a batched matrix-vector product reads and writes (fp32): the matrices, the
    vectors and the results."""
    return 4 * MATVEC_BATCH * (n * n + 2 * n)


def convolution_flops(side: int) -> float:
    batch, channels, kernel = CONVOLUTION_SHAPE
    return 2 * batch * channels * side * side * channels * kernel * kernel


class _Kernels:
    """The timed kernels of one device. Each kernel's calls cycle through copies of its
    inputs that together exceed `COLD_BYTES` (`pooled`), so that a call reads inputs no
    recent call left in the caches, as a step's ops mostly do."""

    def __init__(self, device: str, repeats: int, align) -> None:
        self.device, self.repeats, self.align = torch.device(device), repeats, align
        self.sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)

    def randn(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, dtype=dtype, device=self.device)

    def time(self, run) -> Timing:
        return timed(run, self.repeats, sync=self.sync, align=self.align)

    def pooled(self, kernel, make_inputs, nbytes: int | None = None) -> Timing:
        """`kernel(*inputs)` timed, each call on the next of enough sets of
        `make_inputs()` to hold `COLD_BYTES` (one set where one holds that much); a set
        holds its tensors' bytes, or `nbytes`."""
        first = make_inputs()
        nbytes = nbytes or sum(t.numel() * t.element_size() for t in first)
        sets = [first] + [make_inputs() for _ in range(min(MAX_COPIES, COLD_BYTES // nbytes))]
        cycle = itertools.cycle(sets)
        return self.time(lambda: kernel(*next(cycle)))

    def matmul(self, n: int, dtype: torch.dtype) -> Timing:
        return self.pooled(torch.mm, lambda: (self.randn(n, n, dtype=dtype),
                                              self.randn(n, n, dtype=dtype)))

    def matvec(self, n: int) -> Timing:
        return self.pooled(torch.bmm, lambda: (self.randn(MATVEC_BATCH, n, n),
                                               self.randn(MATVEC_BATCH, n, 1)))

    def elementwise(self, elements: int) -> Timing:
        return self.pooled(torch.add, lambda: (self.randn(elements), self.randn(elements)))

    def copy(self) -> Timing:
        source, target = self.randn(COPY_BYTES // 4), self.randn(COPY_BYTES // 4)
        return self.time(lambda: target.copy_(source))

    def family(self, name: str, size: int, *, backward: bool = False) -> Timing:
        """A kernel family's forward (or `backward`) at `size`: "attention" over sequences
        of `size`, "convolution" of images `size` x `size`, "transcendental" (a tanh) of
        `size` elements."""
        if name == "attention":
            batch, heads, dim = ATTENTION_SHAPE
            run, make_inputs = F.scaled_dot_product_attention, lambda: tuple(
                self.randn(batch, heads, size, dim) for _ in range(3))
        elif name == "convolution":
            batch, channels, kernel = CONVOLUTION_SHAPE
            run = functools.partial(F.conv2d, padding=kernel // 2)

            def make_inputs() -> tuple[torch.Tensor, torch.Tensor]:
                return (self.randn(batch, channels, size, size),
                        self.randn(channels, channels, kernel, kernel))
        else:
            assert name == "transcendental", name
            run, make_inputs = torch.tanh, lambda: (self.randn(size),)
        return self.backward(run, make_inputs) if backward else self.pooled(run, make_inputs)

    def backward(self, forward, make_inputs) -> Timing:
        """The backward alone of `forward(*inputs)` to every input, from a gradient of
        ones, each call on the next of a pool of graphs kept between calls (`pooled`)."""
        def graph() -> tuple[torch.Tensor, ...]:
            leaves = [t.requires_grad_() for t in make_inputs()]
            out = forward(*leaves)
            return out, torch.ones_like(out), *leaves

        return self.pooled(lambda out, grad, *leaves: torch.autograd.grad(
            out, leaves, grad, retain_graph=True), graph)

    def launch(self) -> Timing:
        one = torch.zeros(1, device=self.device)
        return self.time(lambda: one.add_(1))

    def autograd_op(self) -> Timing:
        """Forward and backward of a chain of tiny ops, per op and direction."""
        leaf = torch.ones(16, device=self.device, requires_grad=True)

        def chain() -> None:
            x = leaf
            for _ in range(AUTOGRAD_CHAIN):
                x = x * 1.0001
            x.sum().backward()

        timing = self.time(chain)
        return timing.per(2 * AUTOGRAD_CHAIN)

    def adamw(self, elements: int) -> Timing:
        def optimizer() -> tuple[torch.optim.Optimizer]:
            weights = [torch.nn.Parameter(self.randn(elements)) for _ in range(ADAMW_TENSORS)]
            for weight in weights:
                weight.grad = self.randn(elements)
            adamw = torch.optim.AdamW(weights)
            adamw.step()  # its states are made on the first step
            return (adamw,)

        # What one step touches: each weight, its gradient and AdamW's two states.
        nbytes = 4 * ADAMW_TENSORS * elements * 4
        return self.pooled(lambda opt: opt.step(), optimizer, nbytes).per(ADAMW_TENSORS)


def _resident_bytes() -> int:
    statm = Path("/proc/self/statm")
    if not statm.exists():
        return 0
    return int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def allocator_overhead(seed: int, device: str = "cpu") -> float:
    """What the allocator holds for 400 tensors of 1 KiB to 1 MiB (log-uniform, touched)
    over their own bytes, less one: resident bytes on CPU (0 where they can't be read),
    reserved bytes on CUDA."""
    generator = torch.Generator().manual_seed(seed)
    sizes = [int(2 ** (10 + 10 * float(u))) // 4 for u in torch.rand(400, generator=generator)]
    requested = sum(n * 4 for n in sizes)
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        held = [torch.ones(n, device=device) for n in sizes]
        grown = torch.cuda.memory_reserved() - before
        del held
        return max(0.0, grown / requested - 1)
    before = _resident_bytes()
    held = [torch.ones(n) for n in sizes]
    grown = _resident_bytes() - before
    del held
    return max(0.0, grown / requested - 1) if before else 0.0


def device_figures(settings, seed: int, device: str = "cpu", align=lambda: None) -> dict:
    """This rank's compute timings on `device` (see the module docstring), by figure;
    `align` (a barrier of the ranks) starts each timing on every rank at once."""
    kernels = _Kernels(device, settings.repeats, align)
    # Low-precision matmuls can be much slower than float32 on a CPU without units for
    # them: their curve stops at LOW_PRECISION_LARGEST.
    figures: dict = {f"matmul/{dtype}": {n: kernels.matmul(n, dtype)
                                         for n in settings.matmul_sizes
                                         if dtype == torch.float32 or n <= LOW_PRECISION_LARGEST}
                     for dtype in MATMUL_DTYPES}
    figures["matvec"] = {n: kernels.matvec(n) for n in settings.matvec_sizes}
    figures["elementwise"] = {n: kernels.elementwise(n) for n in settings.elementwise_sizes}
    figures["copy"] = kernels.copy()
    for family, sizes in (("attention", settings.attention_sizes),
                          ("convolution", settings.convolution_sizes),
                          ("transcendental", settings.elementwise_sizes)):
        for backward in (False, True):
            figures[family + (".backward" if backward else "")] = {
                n: kernels.family(family, n, backward=backward) for n in sizes}
    figures["launch"] = kernels.launch()
    figures["autograd_op"] = kernels.autograd_op()
    figures["adamw"] = {n: kernels.adamw(n) for n in settings.optimizer_sizes}
    figures["allocator_overhead"] = allocator_overhead(seed, device)
    return figures
