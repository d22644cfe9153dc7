"""`Mesh`: the logical device grid a model is parallelized over.

A mesh is a shape (`(2, 8)`), one name per axis (`("dp", "tp")`) and a hardware profile,
or a list of them: one kind of device per index of the outermost axis, or per device
(`autopar.values.device_kinds`: the plan is costed with the slowest of every figure).
Each axis is carried by one link level of the profile. By default the innermost axes are
intra-node: walking from the last axis outwards, an axis stays on the innermost level while
the devices it and the axes inside it span fit in one group of that level; `links=` names the
level of every axis explicitly instead.

An axis over an outer level whose groups hold k > 1 devices of each inner group (a flat
axis of 64 GPUs on hosts of 8: k = 8) moves data through k links at once: NCCL runs one
ring per channel, each crossing the outer level at a different device, so its bandwidth is

    min(inner bandwidth, k x outer bandwidth),   k = min(n, inner devices / stride)

with n the axis's size and stride the devices the axes inside it span. An axis with one
device per inner group (the outer axis of (16, 8) on hosts of 8) keeps the outer level's
figure. A level with measured collectives (a profile made by `autopar profile`) is taken
as measured: its figures are already the axis's.

`shares` sizes the pieces an axis cuts: None per axis (or for the mesh) is DTensor's
chunking, a tuple of weights (one per index) cuts in proportion to them
(`autopar.values.placement.chunk_sizes`), and "even" says DTensor's chunking everywhere,
decided. Left None on a mesh whose devices differ along an axis, the planner weighs that
axis's pieces by its devices' speed (`autopar.planning.shares`).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass, field, replace

import torch

from autopar.errors import MeshError
from autopar.values.device_kinds import device_kinds, slowest
from autopar.values.hardware import HardwareProfile, LinkLevel, available_hardware, load_hardware


@dataclass(frozen=True)
class Mesh:
    """A validated device mesh. `hardware` may be given as a profile name or path, or a
    list of them (module docstring); it then holds the profile the plan is costed with,
    and `kinds` each device's, in row-major order (None for a mesh of one kind)."""

    shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    hardware: HardwareProfile | str | list | tuple = "cpu"
    links: tuple[str, ...] | None = None
    shares: tuple | str | None = None
    axis_links: tuple[LinkLevel, ...] = field(init=False, repr=False, compare=False)
    kinds: tuple[HardwareProfile, ...] | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        shape = (self.shape,) if isinstance(self.shape, int) else tuple(self.shape)
        names = (self.axis_names,) if isinstance(self.axis_names, str) else tuple(self.axis_names)
        if not shape or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in shape):
            raise MeshError("invalid mesh shape", expected="a tuple of positive integers",
                            got=repr(self.shape), fix="e.g. Mesh((2, 4), ('dp', 'tp'))")
        if len(names) != len(shape):
            raise MeshError("mesh shape and axis names differ in length",
                            expected=f"{len(shape)} axis names for shape {shape}",
                            got=repr(names), fix="give one name per mesh axis")
        if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            raise MeshError("mesh axis names must be distinct non-empty strings",
                            expected="e.g. ('dp', 'tp')", got=repr(names),
                            fix="rename the repeated axis")
        if isinstance(self.hardware, (list, tuple)):
            kinds = device_kinds(self.hardware, shape)
            object.__setattr__(self, "kinds", kinds if len(set(kinds)) > 1 else None)
            hardware = slowest(kinds)
        else:
            hardware = load_hardware(self.hardware)
        if hardware.mesh_shape is not None and not _part_of(shape, hardware.mesh_shape):
            measured = "x".join(map(str, hardware.mesh_shape))
            raise MeshError(f"hardware profile {hardware.name!r} was measured on a mesh of "
                            f"shape {measured}, not this one",
                            expected=f"a mesh of shape {measured}, or of some of its axes",
                            got=repr(shape),
                            fix=f"use a mesh of shape {measured}, or measure this one: "
                                f"autopar profile --nproc {math.prod(shape)} --mesh "
                                f"{'x'.join(map(str, shape))} --out FILE.json")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "axis_names", names)
        object.__setattr__(self, "hardware", hardware)
        axis_links = tuple(_through_channels(hardware, link, math.prod(shape[i + 1:]), size)
                           for i, (link, size) in enumerate(
                               zip(self._resolve_links(hardware), shape)))
        object.__setattr__(self, "axis_links", axis_links)
        object.__setattr__(self, "links", tuple(link.name for link in axis_links))
        object.__setattr__(self, "shares", _checked_shares(self.shares, shape))

    def with_shares(self, shares: tuple | str | None) -> Mesh:
        """This mesh with `shares` (module docstring)."""
        hardware = list(self.kinds) if self.kinds is not None else self.hardware
        return replace(self, hardware=hardware, shares=shares)

    def mixed_axes(self) -> tuple[int, ...]:
        """The axes along which the devices differ in kind."""
        if self.kinds is None:
            return ()
        return tuple(axis for axis in range(self.ndim)
                     if len({self.kinds_at(axis, i) for i in range(self.shape[axis])}) > 1)

    def _resolve_links(self, hardware: HardwareProfile) -> tuple[LinkLevel, ...]:
        by_name = {link.name: link for link in hardware.links}
        if self.links is not None:
            links = tuple(self.links)
            unknown = [name for name in links if name not in by_name]
            if len(links) != len(self.shape) or unknown:
                raise MeshError("mesh links do not match the mesh or the hardware",
                                expected=f"{len(self.shape)} names out of {sorted(by_name)}",
                                got=repr(links), fix="name one link level per mesh axis")
            return tuple(by_name[name] for name in links)
        resolved: list[LinkLevel] = []
        spanned, level = 1, 0
        for size in reversed(self.shape):
            spanned *= size
            while (hardware.links[level].devices is not None
                   and spanned > hardware.links[level].devices):
                level += 1
                if level == len(hardware.links):
                    raise MeshError("the mesh is larger than the hardware's outermost link level",
                                    expected=f"at most {hardware.links[-1].devices} devices",
                                    got=f"{math.prod(self.shape)}",
                                    fix="add an unbounded outer link level to the profile")
            resolved.append(hardware.links[level])
        return tuple(reversed(resolved))

    @property
    def size(self) -> int:
        """Number of devices."""
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def kinds_at(self, axis: int, index: int) -> tuple[HardwareProfile, ...]:
        """The kinds of the devices at `index` of axis `axis`, each once (the mesh's one
        profile, for a mesh of one kind)."""
        if self.kinds is None:
            return (self.hardware,)
        devices = torch.arange(self.size).reshape(self.shape).select(axis, index).flatten()
        return tuple(dict.fromkeys(self.kinds[i] for i in devices.tolist()))

    def slowest_at(self, indices: dict[int, int]) -> HardwareProfile:
        """The profile of the slowest devices at the given index of each given axis."""
        return _slowest_at(self, tuple(sorted(indices.items())))

    def axis_index(self, name: str) -> int:
        """Position of the axis called `name`."""
        if name not in self.axis_names:
            raise MeshError(f"no mesh axis named {name!r}", expected=f"one of {self.axis_names}",
                            got=repr(name), fix="use a name given to Mesh(...)")
        return self.axis_names.index(name)

    def describe(self) -> str:
        """`"2x8 (dp:infiniband, tp:nvlink) on h100-sxm"`, and the pieces of an axis with
        shares (`"; dp pieces 3:3:1:1"`)."""
        axes = ", ".join(f"{n}={s}:{link.name}"
                         for n, s, link in zip(self.axis_names, self.shape, self.axis_links))
        weighted = [f"{name} pieces {':'.join(map(str, weights))}" for name, weights in
                    zip(self.axis_names, self.shares or ()) if weights is not None]
        sized = f"; {', '.join(weighted)}" if weighted else ""
        if self.kinds is None:
            return f"{'x'.join(map(str, self.shape))} ({axes}) on {self.hardware.name}{sized}"
        counts = Counter(kind.name for kind in self.kinds)
        mixed = " + ".join(f"{count} {name}" for name, count in counts.items())
        return (f"{'x'.join(map(str, self.shape))} ({axes}) on {mixed}, costed at the slowest"
                f"{sized}")

    def to_dict(self) -> dict:
        """The mesh as JSON data: a bundled profile by its name, any other (measured, or
        read from a file) whole, so that the mesh reads back wherever the plan goes."""
        kinds = [self.hardware] if self.kinds is None else self.kinds
        named = [_named(kind) for kind in kinds]
        data = {"shape": list(self.shape), "axis_names": list(self.axis_names),
                "hardware": named[0] if self.kinds is None else named,
                "links": [link.name for link in self.axis_links]}
        if self.shares is not None:
            data["shares"] = [None if w is None else list(w) for w in self.shares]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Mesh:
        hardware = data["hardware"]
        if isinstance(hardware, list):
            hardware = [HardwareProfile.from_dict(kind, source="the plan's mesh")
                        if isinstance(kind, dict) else kind for kind in hardware]
        elif isinstance(hardware, dict):
            hardware = HardwareProfile.from_dict(hardware, source="the plan's mesh")
        shares = data.get("shares")
        return cls(tuple(data["shape"]), tuple(data["axis_names"]), hardware,
                   tuple(data["links"]),
                   None if shares is None else tuple(None if w is None else tuple(w)
                                                     for w in shares))


@functools.lru_cache(maxsize=1024)
def _slowest_at(mesh: Mesh, indices: tuple[tuple[int, int], ...]) -> HardwareProfile:
    kinds = [kind for axis, index in indices for kind in mesh.kinds_at(axis, index)]
    return slowest(kinds)


def _checked_shares(shares, shape: tuple[int, ...]):
    """`shares` as a tuple with one entry per axis (None, or a tuple of positive integer
    weights, one per index), None where not given; "even" is every axis None."""
    if shares is None:
        return None
    if shares == "even":
        return (None,) * len(shape)
    entries = tuple(shares) if isinstance(shares, (list, tuple)) else ()
    ok = len(entries) == len(shape) and all(
        weights is None or (isinstance(weights, (list, tuple)) and len(weights) == size
                            and all(isinstance(w, int) and not isinstance(w, bool) and w > 0
                                    for w in weights))
        for weights, size in zip(entries, shape))
    if not ok:
        raise MeshError("invalid mesh shares",
                        expected=f"'even', or one entry per axis of {shape}: None, or one "
                                 "positive integer weight per index",
                        got=repr(shares), fix="e.g. shares=(None, (3, 3, 1, 1)) on a 2x4 mesh")
    return tuple(None if w is None else tuple(w) for w in entries)


def _named(hardware: HardwareProfile) -> str | dict:
    """A bundled profile by its name, any other (measured, or read from a file) whole."""
    bundled = hardware.name in available_hardware() and load_hardware(hardware.name) == hardware
    return hardware.name if bundled else hardware.to_dict()


def _through_channels(hardware: HardwareProfile, link: LinkLevel, stride: int,
                      size: int) -> LinkLevel:
    """`link` as an axis of `size` devices, `stride` apart, sees it (module docstring)."""
    levels = [level.name for level in hardware.links]
    index = levels.index(link.name) if link.name in levels else 0
    if index == 0 or link.collectives:
        return link
    inner = hardware.links[index - 1]
    if inner.devices is None or stride >= inner.devices or inner.devices % stride:
        return link
    channels = min(size, inner.devices // stride)
    return replace(link, bandwidth=min(inner.bandwidth, channels * link.bandwidth))


def _part_of(shape: tuple[int, ...], measured: tuple[int, ...]) -> bool:
    """Whether a mesh of `shape` is the measured mesh or made of some of its axes, in
    order (a pipeline stage's mesh, one device): its axes of more than one device are a
    subsequence of the measured mesh's."""
    remaining = iter(measured)
    return all(any(size == other for other in remaining) for size in shape if size > 1)
