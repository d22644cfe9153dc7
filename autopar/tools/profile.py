"""`autopar profile`: measure the devices and links of a mesh the way training runs them.

Every rank of the mesh measures at once (gloo CPU processes started by `autopar.launch`), so
each figure is what a rank gets while the others are busy too:

- matmul FLOP/s per dtype (float32, bfloat16) over square sizes; the profile's peak is the
  best size's median, the per-size figures are kept under `measured.matmul`;
- memory bandwidth: a copy of `COPY_BYTES`, read and written, bytes / s;
- launch overhead: the median time of an op on one element;
- the AdamW step: seconds per parameter element (`measured.optimizer_s_per_element`);
- per mesh axis, the all-reduce over that axis's process groups at message sizes from KiB
  to MiB, fitted to the cost model's all-reduce, t = 2(n-1) alpha + 2(n-1)/n B / beta,
  by least squares over the sizes: one link level per axis (latency alpha, bandwidth beta);
- the memory of a rank: the host's, shared by the ranks (`memory_bytes`), and what it has
  available (`usable_memory_bytes`: the default budget of plans, `reserve_bytes`).

Each figure is the median over `repeats` timings on each rank, then over the ranks; its
spread (the larger of the relative range of the ranks' medians and of each rank's
interquartile range) is written beside it under `measured.spread`, the all-reduce times
under `measured.all_reduce_s`.
The profile carries `format`, `version` and the `mesh` it was measured on: `Mesh(shape,
names, hardware="file.json")` accepts it for that shape only. The cost model uses the
peak rates, bandwidth, launch overhead and links (with efficiencies of 1: the rates are
achieved ones); the per-size curves, the optimizer figure and the spreads are recorded,
not yet used.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from autopar.errors import HardwareError
from autopar.values.hardware import PROFILE_FORMAT, PROFILE_VERSION, HardwareProfile

MATMUL_SIZES = (256, 512, 1024)
COPY_BYTES = 32 * 2**20
ALL_REDUCE_BYTES = (4 * 2**10, 256 * 2**10, 2**21, 2**23, 2**25)
OPTIMIZER_ELEMENTS = 2**20
# Untimed calls before a collective's timings: its first calls set up buffers and pairs.
WARM_UP = 3


@dataclass(frozen=True)
class Settings:
    """What one profile run measures: matmul sizes, all-reduce message sizes, timings per
    figure. `quick` is the smallest run that still fits every figure (tests)."""

    matmul_sizes: tuple[int, ...] = MATMUL_SIZES
    all_reduce_bytes: tuple[int, ...] = ALL_REDUCE_BYTES
    repeats: int = 9

    @staticmethod
    def quick() -> Settings:
        return Settings(matmul_sizes=(64, 128), all_reduce_bytes=(2**16, 2**22, 2**24),
                        repeats=5)


@dataclass(frozen=True)
class Timing:
    """The median of some timings (seconds) and their spread: (q3 - q1) / median."""

    median: float
    spread: float

    @staticmethod
    def of(seconds: Sequence[float]) -> Timing:
        ordered = sorted(seconds)
        q1, q3 = ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]
        median = statistics.median(ordered)
        return Timing(median, (q3 - q1) / median if median else 0.0)


def _timed(run: Callable[[], object], repeats: int) -> Timing:
    run()  # warm-up: allocation, first-call dispatch
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    return Timing.of(seconds)


def _matmul(n: int, dtype: torch.dtype, repeats: int) -> Timing:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return _timed(lambda: torch.mm(a, b), repeats)


def _device(settings: Settings) -> dict[str, Timing | dict]:
    """This rank's compute figures, as timings (their FLOP or byte counts are implied)."""
    figures: dict[str, Timing | dict] = {}
    for dtype in (torch.float32, torch.bfloat16):
        figures[f"matmul/{dtype}"] = {n: _matmul(n, dtype, settings.repeats)
                                      for n in settings.matmul_sizes}
    source, target = torch.empty(COPY_BYTES // 4), torch.empty(COPY_BYTES // 4)
    figures["copy"] = _timed(lambda: target.copy_(source), settings.repeats)
    one = torch.zeros(1)
    figures["launch"] = _timed(lambda: one.add_(1), 10 * settings.repeats)
    weight = torch.nn.Parameter(torch.randn(OPTIMIZER_ELEMENTS))
    weight.grad = torch.randn(OPTIMIZER_ELEMENTS)
    figures["adamw"] = _timed(torch.optim.AdamW([weight]).step, settings.repeats)
    return figures


def _links(shape: tuple[int, ...], names: tuple[str, ...],
           settings: Settings) -> dict[str, dict[int, Timing]]:
    """This rank's all-reduce timings per mesh axis and message size."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    timings: dict[str, dict[int, Timing]] = {}
    for name, size in zip(names, shape):
        if size == 1:
            continue
        group = mesh.get_group(name)
        timings[name] = {}
        for nbytes in settings.all_reduce_bytes:
            timings[name][nbytes] = _timed_all_reduce(nbytes, group, settings.repeats)
    return timings


def _timed_all_reduce(nbytes: int, group, repeats: int) -> Timing:
    """All-reduces of `nbytes` over `group`, each started together: a barrier over the
    group first, so that no rank's time includes waiting for a late one."""
    import torch.distributed as dist

    buffer = torch.zeros(nbytes // 4)
    seconds = []
    for index in range(repeats + WARM_UP):
        dist.barrier(group=group)
        start = time.perf_counter()
        dist.all_reduce(buffer, group=group)
        if index >= WARM_UP:
            seconds.append(time.perf_counter() - start)
    return Timing.of(seconds)


def measure_rank(rank: int, shape: tuple[int, ...], names: tuple[str, ...],
                 settings: Settings) -> dict:
    """What rank `rank` measures (run on every rank at once by `autopar.launch`)."""
    torch.manual_seed(rank)
    return {"device": _device(settings), "links": _links(shape, names, settings)}


def _combined(timings: Sequence[Timing]) -> Timing:
    """One figure from the ranks' timings: the median of theirs, its spread the larger of
    the spread over the ranks and within each."""
    medians = [t.median for t in timings]
    value = statistics.median(medians)
    across = (max(medians) - min(medians)) / value if value else 0.0
    return Timing(value, max(across, max(t.spread for t in timings)))


def alpha_beta(ranks: int, timings: dict[int, float]) -> tuple[float, float]:
    """(latency, bandwidth) of a link from all-reduce times over `ranks` devices per
    message size: least squares of t = a + b B, then alpha = a / (2 (n-1)) and
    beta = 2 (n-1) / n / b (the cost model's all-reduce). A negative intercept (noise at
    small sizes) reads as no latency."""
    sizes, seconds = list(timings), list(timings.values())
    mean_b, mean_t = statistics.fmean(sizes), statistics.fmean(seconds)
    slope = sum((b - mean_b) * (t - mean_t) for b, t in zip(sizes, seconds)) / sum(
        (b - mean_b) ** 2 for b in sizes)
    if slope <= 0:
        raise HardwareError("all-reduce times do not grow with the message size",
                            expected="times that grow with the bytes moved",
                            got=", ".join(f"{b} B: {t:.3g} s" for b, t in timings.items()),
                            fix="profile again on a machine less loaded, or with more repeats")
    intercept = max(0.0, mean_t - slope * mean_b)
    return intercept / (2 * (ranks - 1)), 2 * (ranks - 1) / ranks / slope


def _host_bytes(field: str) -> int:
    """The host's `MemTotal` or `MemAvailable` (/proc/meminfo), else its physical memory."""
    meminfo = Path("/proc/meminfo")
    for line in meminfo.read_text().splitlines() if meminfo.exists() else ():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def profile(shape: tuple[int, ...], names: tuple[str, ...], *,
            settings: Settings = Settings(), timeout: float = 600.0) -> dict:
    """Measure a mesh of `shape` named `names` on `prod(shape)` local gloo ranks: the
    profile as a dict that `HardwareProfile.from_dict` (and `hardware="file.json"`) reads."""
    from autopar.runtime.launch import launch

    shape, names = tuple(shape), tuple(names)
    if len(shape) != len(names) or any(n < 1 for n in shape) or len(set(names)) != len(names):
        raise HardwareError("the mesh to profile is malformed",
                            expected="one positive size and one distinct name per axis",
                            got=f"shape {shape}, names {names}",
                            fix="e.g. autopar profile --nproc 4 --mesh 2x2 --axis-names dp,tp")
    ranks = launch(measure_rank, math.prod(shape), shape, names, settings, timeout=timeout)
    data = _profile_dict(shape, names, ranks)
    HardwareProfile.from_dict(data, source="the measured profile")  # it must load
    return data


def _profile_dict(shape: tuple[int, ...], names: tuple[str, ...], ranks: list[dict]) -> dict:
    devices = [r["device"] for r in ranks]
    spread: dict[str, float] = {}
    all_reduce: dict[str, dict[int, float]] = {}

    def figure(key: str, work: float, *, size: int | None = None) -> float:
        timing = _combined([d[key] if size is None else d[key][size] for d in devices])
        spread[key if size is None else f"{key}/{size}"] = round(timing.spread, 4)
        return work / timing.median

    matmul = {str(dtype).removeprefix("torch."): {
        n: figure(f"matmul/{dtype}", 2 * n**3, size=n) for n in devices[0][f"matmul/{dtype}"]}
        for dtype in (torch.float32, torch.bfloat16)}
    data = {
        "format": PROFILE_FORMAT, "version": PROFILE_VERSION,
        "name": f"measured-{'x'.join(map(str, shape))}",
        "description": f"measured by autopar profile on {math.prod(shape)} gloo CPU processes "
                       f"of this host, {time.strftime('%Y-%m-%d %H:%M')}",
        "mesh": {"shape": list(shape), "axis_names": list(names)},
        "peak_flops": {dtype: max(curve.values()) for dtype, curve in matmul.items()},
        "memory_bytes": _host_bytes("MemTotal") // math.prod(shape),
        "usable_memory_bytes": _host_bytes("MemAvailable") // math.prod(shape),
        "memory_bandwidth": figure("copy", 2 * COPY_BYTES),
        "compute_efficiency": 1.0, "memory_efficiency": 1.0,
        "launch_overhead_s": 1 / figure("launch", 1.0),
        "links": _link_levels(shape, names, ranks, spread, all_reduce),
    }
    data["measured"] = {"matmul": matmul, "all_reduce_s": all_reduce,
                        "optimizer_s_per_element": 1 / figure("adamw", OPTIMIZER_ELEMENTS),
                        "spread": spread}
    return data


def _link_levels(shape: tuple[int, ...], names: tuple[str, ...], ranks: list[dict],
                 spread: dict[str, float], measured: dict[str, dict[int, float]]) -> list[dict]:
    """One link level per axis of more than one device, innermost first, each spanning the
    devices of its axis and those inside it (the outermost unbounded), so that `Mesh`
    gives every axis its own."""
    levels, spanned = [], 1
    for name, size in reversed(list(zip(names, shape))):
        spanned *= size
        if size == 1:
            continue
        timings = {nbytes: _combined([r["links"][name][nbytes] for r in ranks])
                   for nbytes in ranks[0]["links"][name]}
        measured[name] = {nbytes: t.median for nbytes, t in timings.items()}
        spread.update({f"all_reduce/{name}/{b}": round(t.spread, 4) for b, t in timings.items()})
        latency, bandwidth = alpha_beta(size, {b: t.median for b, t in timings.items()})
        levels.append({"name": name, "devices": spanned, "bandwidth": bandwidth,
                       "latency": latency})
    if not levels:  # a mesh of one device: no link measured; a nominal one
        levels.append({"name": "none", "devices": None, "bandwidth": 1e12, "latency": 0.0})
    levels[-1]["devices"] = None
    return levels


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
