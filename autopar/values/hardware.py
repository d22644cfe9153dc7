"""Hardware profiles: what one device computes and holds, and how fast devices talk.

Profiles are data, not code: JSON files in `autopar/values/profiles/`, one per device kind, loaded
by name (`load_hardware("h100-sxm")`) or from a path. A profile lists link levels from the
innermost (NVLink inside a node) outwards (InfiniBand between nodes); `devices` is how many
devices one level connects (null: unbounded, the outermost level).
"""

from __future__ import annotations

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
PROFILE_VERSION = 1


@dataclass(frozen=True)
class LinkLevel:
    """One level of the interconnect: `devices` per group (None: unbounded), bytes/s, seconds."""

    name: str
    devices: int | None
    bandwidth: float
    latency: float

    def __post_init__(self) -> None:
        if self.bandwidth <= 0 or self.latency < 0:
            raise HardwareError(
                f"link level {self.name!r} has bandwidth {self.bandwidth}, latency {self.latency}",
                expected="bandwidth > 0 bytes/s and latency >= 0 s",
                got=f"bandwidth={self.bandwidth}, latency={self.latency}",
                fix="correct the profile's links entry")


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

    def __post_init__(self) -> None:
        if not self.links:
            raise HardwareError(f"hardware profile {self.name!r} has no link levels",
                                expected="at least one entry in links", got="[]",
                                fix="add the device's interconnect to the profile")
        if not 0 < self.compute_efficiency <= 1 or not 0 < self.memory_efficiency <= 1:
            raise HardwareError(f"hardware profile {self.name!r} has an efficiency outside (0, 1]",
                                expected="0 < efficiency <= 1",
                                got=f"{self.compute_efficiency}, {self.memory_efficiency}",
                                fix="give efficiencies as fractions of peak")

    def flops_per_second(self, dtype: torch.dtype) -> float:
        """Peak FLOP/s for `dtype`; dtypes without an entry (integers) use float32's."""
        table = dict(self.peak_flops)
        return table.get(_DTYPE_NAMES.get(dtype, "float32"), table["float32"])

    @property
    def reserve_bytes(self) -> int:
        """What a plan leaves free of the capacity by default: the measured capacity less
        what a process can use, or `RESERVE_BYTES` plus `RESERVE_SHARE` of the capacity,
        at most half of it."""
        if self.usable_memory_bytes is not None:
            return max(0, self.memory_bytes - self.usable_memory_bytes)
        return min(self.memory_bytes // 2,
                   RESERVE_BYTES + int(RESERVE_SHARE * self.memory_bytes))

    @classmethod
    def from_dict(cls, data: dict, source: str = "<dict>") -> HardwareProfile:
        """The profile `data` describes: a bundled datasheet profile, or one measured by
        `autopar profile` (format "autopar-profile", `version` at most `PROFILE_VERSION`,
        the `mesh` it was measured on)."""
        _check_version(data, source)
        try:
            links = tuple(LinkLevel(**link) for link in data["links"])
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
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, HardwareError):
                raise
            raise HardwareError(
                f"hardware profile {source} is malformed: {exc!r}",
                expected="name, peak_flops (with float32), memory_bytes, memory_bandwidth, links",
                got=", ".join(sorted(data)) if isinstance(data, dict) else type(data).__name__,
                fix="compare it with autopar/values/profiles/h100-sxm.json") from exc


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
