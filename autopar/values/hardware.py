"""Hardware profiles: what one device computes and holds, and how fast devices talk.

Profiles are data, not code: JSON files in `autopar/values/profiles/`, one per device kind, loaded
by name (`load_hardware("h100-sxm")`) or from a path. A profile lists link levels from the
innermost (NVLink inside a node) outwards (InfiniBand between nodes); `devices` is how many
devices one level connects (null: unbounded, the outermost level).
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from autopar.errors import HardwareError

_DTYPE_NAMES = {
    torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16",
    torch.float16: "float16", torch.float8_e4m3fn: "float8", torch.float8_e5m2: "float8",
}


# What a process can't plan for on a device of a datasheet profile: the runtime's context
# and the communicators' buffers (`RESERVE_BYTES`; a CUDA context and NCCL's buffers take
# about 0.5 to 1.5 GiB), and the allocator's fragmentation (`RESERVE_SHARE` of the
# capacity). Assumptions, not measurements: a measured profile gives `usable_memory_bytes`.
RESERVE_BYTES = 2 * 2**30
RESERVE_SHARE = 0.05

# What `autopar profile` writes (`autopar.tools.profile`): its format and version.
PROFILE_FORMAT = "autopar-profile"
PROFILE_VERSION = 3  # 2: per-kind collectives, kernel rates, optimizer and overlap figures;
# 3: the device kind, backward rates of kernel families
DEVICES = ("cuda", "cpu")
# The suffix of a kernel family's backward in `kernel_flops` and `kernel_overhead_s`
# ("attention.backward"): measured where its rate differs from the forward's.
BACKWARD = ".backward"


@dataclass(frozen=True)
class CollectiveFit:
    """A collective kind's measured figures on one link level: the bandwidth (bytes/s) and
    latency (s) that the cost model's formula for that kind fits to its timings, and the
    timings themselves: `points`, (per-rank buffer bytes, seconds) by increasing bytes,
    over groups of `ranks` devices (None: any, as for sends)."""

    kind: str
    bandwidth: float
    latency: float
    points: tuple[tuple[float, float], ...] = ()
    ranks: int | None = None

    def time(self, nbytes: float, n: int) -> float | None:
        """Seconds of one collective of `nbytes` over `n` devices as measured: on the line
        through the two points around it (beyond the last, through the last two), the
        first point's time below them. None where no point was measured on groups of
        `n`."""
        if not self.points or (self.ranks is not None and n != self.ranks):
            return None
        sizes = [size for size, _ in self.points]
        at = min(bisect.bisect_left(sizes, nbytes), len(sizes) - 1)
        if at == 0:
            return self.points[0][1]
        (x0, t0), (x1, t1) = self.points[at - 1], self.points[at]
        return t0 + (t1 - t0) * (nbytes - x0) / (x1 - x0)


@dataclass(frozen=True)
class LinkLevel:
    """One level of the interconnect: `devices` per group (None: unbounded), bytes/s, seconds.
    `collectives` holds measured figures per collective kind (a measured profile's); a kind
    without one uses `bandwidth` and `latency`."""

    name: str
    devices: int | None
    bandwidth: float
    latency: float
    collectives: tuple[CollectiveFit, ...] = ()

    def __post_init__(self) -> None:
        for kind, bandwidth, latency in (("", self.bandwidth, self.latency),
                                         *((c.kind, c.bandwidth, c.latency)
                                           for c in self.collectives)):
            if not bandwidth > 0 or not latency >= 0:
                of = f" ({kind})" if kind else ""
                raise HardwareError(
                    f"link level {self.name!r}{of} has bandwidth {bandwidth}, latency {latency}",
                    expected="bandwidth > 0 bytes/s and latency >= 0 s",
                    got=f"bandwidth={bandwidth}, latency={latency}",
                    fix="correct the profile's links entry, or measure it again")
        for fit in self.collectives:
            sizes = [size for size, _ in fit.points]
            if sizes != sorted(set(sizes)) or any(not t >= 0 for _, t in fit.points):
                raise HardwareError(
                    f"link level {self.name!r} ({fit.kind}) has unordered or negative "
                    "timings", expected="points [bytes, seconds] by increasing bytes, "
                    "seconds >= 0", got=str(fit.points),
                    fix="correct the profile's links entry, or measure it again")

    def measured_time(self, kind: str, nbytes: float, n: int) -> float | None:
        """Seconds of one collective of `kind` moving `nbytes` over `n` devices of this
        level, from the timings measured for it (`CollectiveFit.time`); None unmeasured."""
        for fit in self.collectives:
            if fit.kind == kind:
                return fit.time(nbytes, n)
        return None

    def figures(self, kind: str) -> tuple[float, float]:
        """(bandwidth, latency) that collectives of `kind` achieve on this level."""
        for fit in self.collectives:
            if fit.kind == kind:
                return fit.bandwidth, fit.latency
        return self.bandwidth, self.latency

    def to_dict(self) -> dict:
        data = {"name": self.name, "devices": self.devices, "bandwidth": self.bandwidth,
                "latency": self.latency}
        if self.collectives:
            data["collectives"] = {c.kind: _fit_dict(c) for c in self.collectives}
        return data

    @staticmethod
    def from_dict(data: dict) -> LinkLevel:
        fits = tuple(CollectiveFit(kind, float(f["bandwidth"]), float(f["latency"]),
                                   tuple((float(b), float(t)) for b, t in f.get("points", ())),
                                   f.get("ranks"))
                     for kind, f in sorted(data.get("collectives", {}).items()))
        return LinkLevel(data["name"], data["devices"], float(data["bandwidth"]),
                         float(data["latency"]), fits)


def _fit_dict(fit: CollectiveFit) -> dict:
    data = {"bandwidth": fit.bandwidth, "latency": fit.latency}
    if fit.points:
        data.update(points=[list(point) for point in fit.points], ranks=fit.ranks)
    return data


@dataclass(frozen=True)
class HardwareProfile:
    """Peak rates of one device and the link levels between devices."""

    name: str
    peak_flops: tuple[tuple[str, float], ...]
    memory_bytes: int
    memory_bandwidth: float
    links: tuple[LinkLevel, ...]
    compute_efficiency: float = 0.7
    memory_efficiency: float = 0.8
    launch_overhead_s: float = 5e-6
    description: str = ""
    mesh_shape: tuple[int, ...] | None = None  # a measured profile's: the mesh it was made on
    usable_memory_bytes: int | None = None  # measured: what a process can really hold
    # Measured AdamW (fp32, torch's default implementation on the device): seconds per
    # parameter tensor and per element (`autopar.costs.formulas.optimizer_time`).
    optimizer_tensor_s: float | None = None
    optimizer_element_s: float | None = None
    # The share of a background collective's time that the compute beside it does not hide
    # (0: all of it hidden, the assumption of datasheet profiles; 1: none; a measured
    # profile's figure: both run together against each alone).
    overlap_slowdown: float = 0.0
    # The kind of device the figures are of: "cuda" (fused kernels for composite ops) or
    # "cpu" (composite ops run as their parts: the cost model prices the kernels each op
    # was traced to run, `autopar.passes.capturing.trace_kernels`).
    device: str = "cuda"
    # Whether torch's default optimizer step on the device is the multi-tensor one
    # (foreach: every tensor's temporaries at once, the default on CUDA) or steps one
    # tensor at a time (the default on CPU).
    multi_tensor_optimizer: bool = True
    # Measured FLOP/s of kernels other than matmuls, in float32, by family ("attention",
    # "convolution", and their backwards: "attention.backward", at twice the forward's
    # FLOPs); other dtypes scale by their peak (`flops_per_second`).
    kernel_flops: tuple[tuple[str, float], ...] = ()
    # Measured seconds a kernel of a family ("matmul", "attention", "convolution") takes
    # beyond the launch overhead whatever its size (the intercept of its fit).
    kernel_overheads: tuple[tuple[str, float], ...] = ()
    # Measured bytes/s of a family's kernels when memory-bound ("matmul": a batched
    # matrix-vector product, which streams its matrices slower than an elementwise op).
    kernel_bandwidths: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not self.links:
            raise HardwareError(f"hardware profile {self.name!r} has no link levels",
                                expected="at least one entry in links", got="[]",
                                fix="add the device's interconnect to the profile")
        if self.device not in DEVICES:
            raise HardwareError(f"hardware profile {self.name!r} is of device {self.device!r}",
                                expected=f"device one of {', '.join(DEVICES)}",
                                got=repr(self.device),
                                fix="correct the profile's device, or measure it again")
        if not 0 < self.compute_efficiency <= 1 or not 0 < self.memory_efficiency <= 1:
            raise HardwareError(f"hardware profile {self.name!r} has an efficiency outside (0, 1]",
                                expected="0 < efficiency <= 1",
                                got=f"{self.compute_efficiency}, {self.memory_efficiency}",
                                fix="give efficiencies as fractions of peak")
        rates = {"memory_bytes": self.memory_bytes, "memory_bandwidth": self.memory_bandwidth,
                 **{f"peak_flops.{k}": v for k, v in self.peak_flops}}
        rates.update({f"kernel_flops.{k}": v for k, v in self.kernel_flops})
        rates.update({f"kernel_bandwidth.{k}": v for k, v in self.kernel_bandwidths})
        times = {"launch_overhead_s": self.launch_overhead_s,
                 "optimizer_tensor_s": self.optimizer_tensor_s or 0.0,
                 "optimizer_element_s": self.optimizer_element_s or 0.0,
                 "overlap_slowdown": self.overlap_slowdown,
                 **{f"kernel_overhead_s.{k}": v for k, v in self.kernel_overheads}}
        bad = [f"{k}={v}" for k, v in rates.items() if not v > 0] + [
            f"{k}={v}" for k, v in times.items() if not v >= 0]
        if bad or "float32" not in dict(self.peak_flops):
            raise HardwareError(f"hardware profile {self.name!r} has figures out of range",
                                expected="positive rates and sizes (peak_flops with float32), "
                                         "times and slowdowns >= 0",
                                got=", ".join(bad) or "no float32 in peak_flops",
                                fix="correct the profile, or measure it again with autopar "
                                    "profile")

    def flops_per_second(self, dtype: torch.dtype, family: str = "matmul") -> float:
        """Peak FLOP/s for `dtype`; dtypes without an entry (integers) use float32's. A
        kernel `family` the profile measured runs at its own rate, scaled by the dtype's
        peak over float32's."""
        table = dict(self.peak_flops)
        peak = table.get(_DTYPE_NAMES.get(dtype, "float32"), table["float32"])
        measured = dict(self.kernel_flops).get(family)
        return peak if measured is None else measured * peak / table["float32"]

    def bytes_per_second(self, family: str = "other") -> float:
        """The bytes/s a memory-bound kernel of `family` moves: its measured bandwidth, else
        `memory_bandwidth` at `memory_efficiency`."""
        measured = dict(self.kernel_bandwidths).get(family)
        return (self.memory_bandwidth * self.memory_efficiency if measured is None
                else measured)

    def kernel_overhead(self, family: str) -> float:
        """Seconds a kernel of `family` takes beyond `launch_overhead_s` (0 unmeasured)."""
        return dict(self.kernel_overheads).get(family, 0.0)

    @property
    def reserve_bytes(self) -> int:
        """What a plan leaves free of the capacity by default: the measured capacity less
        what a process can use, or `RESERVE_BYTES` plus `RESERVE_SHARE` of the capacity,
        at most half of it."""
        if self.usable_memory_bytes is not None:
            return max(0, self.memory_bytes - self.usable_memory_bytes)
        return min(self.memory_bytes // 2,
                   RESERVE_BYTES + int(RESERVE_SHARE * self.memory_bytes))

    def to_dict(self) -> dict:
        """The profile as `from_dict` reads it (a measured profile's timings aside)."""
        data = {"name": self.name, "description": self.description,
                "peak_flops": dict(self.peak_flops), "memory_bytes": self.memory_bytes,
                "memory_bandwidth": self.memory_bandwidth,
                "compute_efficiency": self.compute_efficiency,
                "memory_efficiency": self.memory_efficiency,
                "launch_overhead_s": self.launch_overhead_s,
                "links": [link.to_dict() for link in self.links],
                "overlap_slowdown": self.overlap_slowdown,
                "multi_tensor_optimizer": self.multi_tensor_optimizer,
                "device": self.device,
                "kernel_flops": dict(self.kernel_flops),
                "kernel_overhead_s": dict(self.kernel_overheads)}
        if self.kernel_bandwidths:
            data["kernel_bandwidth"] = dict(self.kernel_bandwidths)
        if self.mesh_shape is not None:
            data.update(format=PROFILE_FORMAT, version=PROFILE_VERSION,
                        mesh={"shape": list(self.mesh_shape)})
        optional = {"usable_memory_bytes": self.usable_memory_bytes,
                    "optimizer_tensor_s": self.optimizer_tensor_s,
                    "optimizer_element_s": self.optimizer_element_s}
        return data | {k: v for k, v in optional.items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict, source: str = "<dict>") -> HardwareProfile:
        """The profile `data` describes: a bundled datasheet profile, or one measured by
        `autopar profile` (format "autopar-profile", `version` at most `PROFILE_VERSION`,
        the `mesh` it was measured on)."""
        _check_version(data, source)
        try:
            links = tuple(LinkLevel.from_dict(link) for link in data["links"])
            return cls(
                name=data["name"],
                peak_flops=tuple(sorted((k, float(v)) for k, v in data["peak_flops"].items())),
                memory_bytes=int(data["memory_bytes"]),
                memory_bandwidth=float(data["memory_bandwidth"]),
                links=links,
                compute_efficiency=float(data.get("compute_efficiency", 0.7)),
                memory_efficiency=float(data.get("memory_efficiency", 0.8)),
                launch_overhead_s=float(data.get("launch_overhead_s", 5e-6)),
                description=data.get("description", ""),
                mesh_shape=tuple(int(n) for n in data["mesh"]["shape"]) if "mesh" in data
                else None,
                usable_memory_bytes=int(data["usable_memory_bytes"])
                if "usable_memory_bytes" in data else None,
                **_optional_floats(data, ("optimizer_tensor_s", "optimizer_element_s",
                                          "overlap_slowdown")),
                kernel_flops=_pairs(data.get("kernel_flops", {})),
                kernel_overheads=_pairs(data.get("kernel_overhead_s", {})),
                kernel_bandwidths=_pairs(data.get("kernel_bandwidth", {})),
                multi_tensor_optimizer=_flag(data.get("multi_tensor_optimizer", True)),
                device=str(data.get("device", "cuda")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, HardwareError):
                raise
            raise HardwareError(
                f"hardware profile {source} is malformed: {exc!r}",
                expected="name, peak_flops (with float32), memory_bytes, memory_bandwidth, links",
                got=", ".join(sorted(data)) if isinstance(data, dict) else type(data).__name__,
                fix="compare it with autopar/values/profiles/h100-sxm.json") from exc


def _flag(value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"multi_tensor_optimizer must be true or false, not {value!r}")
    return value


def _pairs(table: dict) -> tuple[tuple[str, float], ...]:
    return tuple(sorted((str(k), float(v)) for k, v in table.items()))


def _optional_floats(data: dict, keys: tuple[str, ...]) -> dict[str, float]:
    return {key: float(data[key]) for key in keys if data.get(key) is not None}


def _check_version(data: object, source: str) -> None:
    if not isinstance(data, dict) or "version" not in data:
        return
    version = data["version"]
    if data.get("format") != PROFILE_FORMAT or not isinstance(version, int) \
            or not 1 <= version <= PROFILE_VERSION:
        raise HardwareError(
            f"hardware profile {source} is of format {data.get('format')!r} version "
            f"{version!r}, which this autopar does not read",
            expected=f"format {PROFILE_FORMAT!r}, version 1 to {PROFILE_VERSION}",
            got=f"format {data.get('format')!r}, version {version!r}",
            fix="measure the profile again with this autopar: autopar profile --nproc N "
                "--mesh SHAPE --out FILE.json")


def available_hardware() -> tuple[str, ...]:
    """Names of the bundled profiles."""
    folder = resources.files("autopar.values") / "profiles"
    return tuple(sorted(p.name.removesuffix(".json") for p in folder.iterdir()
                        if p.name.endswith(".json")))


def load_hardware(name_or_path: str | Path | HardwareProfile) -> HardwareProfile:
    """A bundled profile by name (`"h100-sxm"`), or one read from a JSON file path."""
    if isinstance(name_or_path, HardwareProfile):
        return name_or_path
    text = str(name_or_path)
    if text.endswith(".json") or Path(text).is_file():
        path = Path(text)
        if not path.is_file():
            raise HardwareError(f"hardware profile file {text} does not exist",
                                expected="a readable JSON file", got=text,
                                fix="check the path")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise HardwareError(f"hardware profile {text} is not JSON: {exc}",
                                expected="a JSON object", got=text,
                                fix="compare it with autopar/values/profiles/h100-sxm.json"
                                ) from exc
        return HardwareProfile.from_dict(data, source=text)
    names = available_hardware()
    if text not in names:
        raise HardwareError(f"unknown hardware {text!r}", expected=f"one of {', '.join(names)}",
                            got=repr(text),
                            fix="pick a bundled profile or pass the path of a JSON profile")
    bundled = resources.files("autopar.values") / "profiles" / f"{text}.json"
    data = json.loads(bundled.read_text())
    return HardwareProfile.from_dict(data, source=text)
