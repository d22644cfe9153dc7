"""`autopar profile`: measure the devices and links of a mesh the way training runs them.

Every rank of the mesh measures at once (gloo CPU processes started by `autopar.launch`),
so each figure is what a rank gets while the others are busy too: the device's kernels
(`device.py`), then each collective kind over each mesh axis and the slowdown of compute
beside communication (`links.py`). Each figure is the mean of its timings on each rank,
then over the ranks (`timing.py` says why the mean); the figures are fitted to the cost
model's formulas (`fit.py`):

- `peak_flops` per dtype: the rate of the matmul fit t = t0 + 2n^3 / rate over the sizes;
  attention, convolution and transcendental (a tanh's elements per second) rates (fp32),
  forward and backward, under `kernel_flops`;
- `memory_bandwidth`: the rate of the elementwise fit t = t0 + bytes / rate; under
  `kernel_bandwidth`, matmuls' when memory-bound (the batched matrix-vector fit's);
- `launch_overhead_s`: an op recorded by autograd, per direction (the floor every kernel
  of a training step pays);
- `optimizer_tensor_s`, `optimizer_element_s`: AdamW, t / tensor = t_tensor + e t_element;
- `overlap_slowdown`: the share of background all-reduces that matmuls beside them do not
  hide (`fit.exposed_share`: both together against each alone);
- per mesh axis, one link level (innermost first, each spanning its axis and those inside
  it, the outermost unbounded) with the all-reduce fit as its bandwidth and latency and
  every kind's own fit under `collectives`, with its timings (`points`, made
  non-decreasing, on groups of `ranks`), which price the sizes between them;
- `memory_bytes`: the host's memory over the ranks; `usable_memory_bytes`: what the host
  has available over the ranks, less the allocator's measured overhead (the default
  budget of plans, `reserve_bytes`).

Every timing's spread (the larger of the relative range of the ranks' medians and of each
rank's interquartile range) is written under `measured.spread`, the timings themselves
under `measured`. The profile carries `format`, `version` and the `mesh` it was measured
on: `Mesh(shape, names, hardware="file.json")` accepts it for that shape only.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from autopar.costs.formulas import BACKWARD_FLOPS_FACTOR
from autopar.errors import HardwareError
from autopar.tools.profile.device import (
    ADAMW_TENSORS,
    COPY_BYTES,
    MATMUL_DTYPES,
    attention_flops,
    convolution_flops,
    device_figures,
    matvec_bytes,
)
from autopar.tools.profile.fit import alpha_beta, collective_fit, exposed_share, line, monotone
from autopar.tools.profile.links import KINDS, axis_figures, overlap_figures
from autopar.tools.profile.timing import Timing, combined
from autopar.values.hardware import BACKWARD, PROFILE_FORMAT, PROFILE_VERSION, HardwareProfile

__all__ = ["Settings", "alpha_beta", "profile", "write_profile", "measure_rank"]


@dataclass(frozen=True)
class Settings:
    """What one profile run measures: kernel and message sizes, timings per figure.
    `quick` is the smallest run that still fits every figure (tests)."""

    matmul_sizes: tuple[int, ...] = (64, 128, 256, 512, 1024)
    matvec_sizes: tuple[int, ...] = (64, 128, 256, 512)
    elementwise_sizes: tuple[int, ...] = (2**10, 2**14, 2**18, 2**22)
    optimizer_sizes: tuple[int, ...] = (2**8, 2**14, 2**18)
    attention_sizes: tuple[int, ...] = (32, 128, 512)
    convolution_sizes: tuple[int, ...] = (8, 16, 32, 64)
    message_bytes: tuple[int, ...] = (2**10, 2**14, 2**16, 2**18, 2**20, 2**22, 2**25, 2**27)
    repeats: int = 9

    @staticmethod
    def quick() -> Settings:
        return Settings(matmul_sizes=(64, 128), matvec_sizes=(64, 256),
                        elementwise_sizes=(2**10, 2**16),
                        attention_sizes=(32, 128), convolution_sizes=(8, 32),
                        optimizer_sizes=(2**8, 2**18), message_bytes=(2**12, 2**18, 2**22),
                        repeats=5)


def measure_rank(rank: int, shape: tuple[int, ...], names: tuple[str, ...],
                 settings: Settings, device: str = "cpu") -> dict:
    """What rank `rank` measures (run on every rank at once by `autopar.launch`; a mesh of
    one device in the calling process)."""
    import torch.distributed as dist

    torch.manual_seed(rank)
    if math.prod(shape) == 1:
        return {"device": device_figures(settings, seed=rank, device=device), "links": {},
                "overlap": None, "memory": _device_memory(device)}
    from torch.distributed.device_mesh import init_device_mesh

    figures = device_figures(settings, seed=rank, device=device, align=dist.barrier)

    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    links = {name: axis_figures(mesh, name, n, settings)
             for name, n in zip(names, shape) if n > 1}
    return {"device": figures, "links": links, "overlap": overlap_figures(settings.repeats),
            "memory": _device_memory(device)}


def _device_memory(device: str) -> tuple[int, int]:
    """(capacity, available) bytes of one rank's device: a GPU's as its driver reports
    them; a CPU process's share of the host's (`MemTotal`, `MemAvailable`), shared by
    the ranks (`_profile_dict` divides)."""
    if torch.device(device).type == "cuda":
        free, total = torch.cuda.mem_get_info()
        return total, free
    return _host_bytes("MemTotal"), _host_bytes("MemAvailable")


def profile(shape: tuple[int, ...], names: tuple[str, ...], *,
            settings: Settings = Settings(), timeout: float = 600.0, device: str = "cpu",
            progress: Callable[[str], None] | None = None) -> dict:
    """Measure a mesh of `shape` named `names` on `prod(shape)` local gloo ranks (a mesh of
    one device in this process, on `device`: "cpu" or "cuda"): the profile as a dict that
    `HardwareProfile.from_dict` (and `hardware="file.json"`) reads. `progress` is told what
    is measured (before the ranks start, and when they are done)."""
    from autopar.runtime.launch import launch

    shape, names = tuple(shape), tuple(names)
    if len(shape) != len(names) or any(n < 1 for n in shape) or len(set(names)) != len(names):
        raise HardwareError("the mesh to profile is malformed",
                            expected="one positive size and one distinct name per axis",
                            got=f"shape {shape}, names {names}",
                            fix="e.g. autopar profile --nproc 4 --mesh 2x2 --axis-names dp,tp")
    say = progress or (lambda text: None)
    say(f"{math.prod(shape)} ranks measure kernels ({len(settings.matmul_sizes)} matmul "
        f"sizes, 2 dtypes), then {len(KINDS)} collective kinds over "
        f"{sum(n > 1 for n in shape)} axes at {len(settings.message_bytes)} sizes")
    if torch.device(device).type == "cuda" and math.prod(shape) > 1:
        raise HardwareError("local processes profile CPU meshes only",
                            expected="a mesh of one GPU, or a CPU mesh",
                            got=f"shape {shape} on {device}",
                            fix="profile one GPU (--mesh 1); a multi-GPU mesh runs under "
                                "torchrun")
    if math.prod(shape) == 1:
        ranks = [measure_rank(0, shape, names, settings, device)]
    else:
        ranks = launch(measure_rank, math.prod(shape), shape, names, settings,
                       timeout=timeout)
    say("fitting the figures")
    data = _profile_dict(shape, names, ranks, device)
    HardwareProfile.from_dict(data, source="the measured profile")  # it must load
    return data


class _Figures:
    """The ranks' timings of one profile run, combined figure by figure, each figure's
    spread noted as it is read."""

    def __init__(self, ranks: list[dict]) -> None:
        self.ranks, self.spread = ranks, {}

    def timing(self, path: tuple) -> Timing:
        def get(rank: dict):
            for key in path:
                rank = rank[key]
            return rank
        result = combined([get(r) for r in self.ranks])
        self.spread["/".join(map(str, path[1:] if path[0] == "device" else path))] = round(
            result.spread, 4)
        return result

    def curve(self, path: tuple) -> dict[int, float]:
        sizes = self.ranks[0]
        for key in path:
            sizes = sizes[key]
        return {size: self.timing((*path, size)).mean for size in sizes}


def _profile_dict(shape: tuple[int, ...], names: tuple[str, ...], ranks: list[dict],
                  device: str = "cpu") -> dict:
    figures = _Figures(ranks)
    matmul = {str(dtype).removeprefix("torch."): figures.curve(("device", f"matmul/{dtype}"))
              for dtype in MATMUL_DTYPES}
    dispatch = figures.timing(("device", "launch")).mean
    # family -> (intercept, seconds per FLOP) of its fit; a backward does
    # BACKWARD_FLOPS_FACTOR times its forward's FLOPs.
    kernels = {"matmul": line({2 * n**3: t for n, t in matmul["float32"].items()})}
    for family, flops in (("attention", attention_flops), ("convolution", convolution_flops),
                          ("transcendental", lambda n: n)):
        for name, factor in ((family, 1), (f"{family}{BACKWARD}", BACKWARD_FLOPS_FACTOR)):
            kernels[name] = line({factor * flops(n): t
                                  for n, t in figures.curve(("device", name)).items()})
    elementwise = figures.curve(("device", "elementwise"))
    adamw = figures.curve(("device", "adamw"))
    tensor_s, element_s = line(adamw)
    overhead = statistics.median(r["device"]["allocator_overhead"] for r in ranks)
    data = {
        "format": PROFILE_FORMAT, "version": PROFILE_VERSION,
        "name": f"measured-{'x'.join(map(str, shape))}",
        "description": f"measured by autopar profile on {math.prod(shape)} {device} "
                       f"processes of this host, {time.strftime('%Y-%m-%d %H:%M')}",
        "mesh": {"shape": list(shape), "axis_names": list(names)},
        "peak_flops": {dtype: 1 / line({2 * n**3: t for n, t in curve.items()})[1]
                       for dtype, curve in matmul.items()},
        "kernel_flops": {family: 1 / slope for family, (_, slope) in kernels.items()
                         if family != "matmul"},
        "kernel_overhead_s": {family: max(0.0, t0 - dispatch)
                              for family, (t0, _) in kernels.items()},
        "kernel_bandwidth": {"matmul": 1 / line({matvec_bytes(n): t for n, t in
                                                 figures.curve(("device", "matvec")).items()})[1]},
        **_memory(ranks, device, overhead),
        "memory_bandwidth": 1 / line({12 * n: t for n, t in elementwise.items()})[1],
        "compute_efficiency": 1.0, "memory_efficiency": 1.0,
        "launch_overhead_s": figures.timing(("device", "autograd_op")).mean,
        "optimizer_tensor_s": tensor_s, "optimizer_element_s": element_s,
        "overlap_slowdown": _exposed_share(figures, ranks),
        # torch's default step: multi-tensor (foreach) on CUDA, one tensor at a time else.
        "multi_tensor_optimizer": torch.device(device).type == "cuda",
        "device": torch.device(device).type,
        "links": _link_levels(shape, names, figures),
    }
    data["measured"] = {
        "matmul_s": matmul, "elementwise_s": elementwise, "adamw_s_per_tensor": adamw,
        "copy_bytes_per_s": 2 * COPY_BYTES / figures.timing(("device", "copy")).mean,
        "dispatch_s": dispatch,
        "allocator_overhead": overhead, "adamw_tensors": ADAMW_TENSORS,
        "collectives_s": {name: {kind: figures.curve(("links", name, kind))
                                 for kind in ranks[0]["links"][name]}
                          for name in ranks[0]["links"]},
        "spread": figures.spread}
    return data


def _memory(ranks: list[dict], device: str, overhead: float) -> dict[str, int]:
    """A rank's capacity and what it can use: a GPU's own (the free memory less the
    allocator's overhead); a CPU rank's share of the host's."""
    total, free = ranks[0]["memory"]
    share = len(ranks) if torch.device(device).type == "cpu" else 1
    return {"memory_bytes": total // share,
            "usable_memory_bytes": int(free / share / (1 + overhead))}


def _exposed_share(figures: _Figures, ranks: list[dict]) -> float:
    if ranks[0]["overlap"] is None:
        return 0.0
    return exposed_share(*(figures.timing(("overlap", k)).mean for k in range(3)))


def _link_levels(shape: tuple[int, ...], names: tuple[str, ...], figures: _Figures
                 ) -> list[dict]:
    """One link level per axis of more than one device (see the module docstring)."""
    levels, spanned = [], 1
    for name, size in reversed(list(zip(names, shape))):
        spanned *= size
        if size == 1:
            continue
        fits = {}
        for kind in figures.ranks[0]["links"][name]:
            curve = figures.curve(("links", name, kind))
            latency, bandwidth = collective_fit(kind, size, curve)
            fits[kind] = {"bandwidth": bandwidth, "latency": latency,
                          "points": [list(point) for point in monotone(curve)],
                          "ranks": None if kind == "send" else size}
        levels.append({"name": name, "devices": spanned, **fits["all_reduce"],
                       "collectives": fits})
    if not levels:  # a mesh of one device: no link measured; a nominal one
        levels.append({"name": "none", "devices": None, "bandwidth": 1e12, "latency": 0.0})
    levels[-1]["devices"] = None
    return levels


def _host_bytes(field: str) -> int:
    """The host's `MemTotal` or `MemAvailable` (/proc/meminfo), else its physical memory."""
    meminfo = Path("/proc/meminfo")
    for text in meminfo.read_text().splitlines() if meminfo.exists() else ():
        if text.startswith(f"{field}:"):
            return int(text.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def write_profile(data: dict, path: str | Path) -> Path:
    """Write a measured profile as JSON to `path`."""
    target = Path(path)
    try:
        target.write_text(json.dumps(data, indent=1))
    except OSError as exc:
        raise HardwareError(f"cannot write the profile to {path}: {exc.strerror or exc}",
                            expected="a writable file path", got=str(path),
                            fix="choose a path in an existing, writable directory") from exc
    return target
