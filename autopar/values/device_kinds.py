"""A mesh of several kinds of device: which kind each device is (`device_kinds`), and the
profile its plan is costed with (`slowest`).

`Mesh(..., hardware=["h100-sxm", "a100-sxm"])` gives one kind per index of the outermost
axis (each kind's devices the block of the mesh at that index), and a list as long as the
mesh's devices one kind per device, in row-major order. A plan splits its work evenly, so
every device of a step runs the same ops on pieces of the same size: the step takes the
slowest device's time, and the memory of the device with the least of it binds. Its costs
are therefore those of one profile made of the slowest of every figure:

    rates (peak FLOP/s per dtype, bandwidths, kernel rates, memory)    min over the kinds
    memory a plan may use (capacity less its reserve)                  min over the kinds
    times (launch and kernel overheads, optimizer, overlap slowdown)   max over the kinds
    each link level (by name, innermost first)                         min bandwidth, max latency

(rates per dtype or kernel family over the keys every kind has). This is exact where one
kind is slower in every figure (an A100 beside an H100), an upper bound of the slowest
device's time otherwise. A pipeline over an axis whose indices hold different
kinds costs each stage on its own rank's kind instead (`pipeline.plan.sub_mesh`), and cuts
the layers in proportion (`split_stages.balanced_cuts` with each stage's unit times): the
faster devices take more layers. Work sized to each device within an axis (uneven batch
or tensor pieces) is not planned yet.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from autopar.errors import MeshError
from autopar.values.hardware import HardwareProfile, LinkLevel, load_hardware


def device_kinds(hardware: Sequence, shape: tuple[int, ...]) -> tuple[HardwareProfile, ...]:
    """Each device's profile, in row-major order, from `hardware`: one name, path or profile
    per index of the outermost axis of `shape`, or one per device; `MeshError` for
    another length (`HardwareError` for a kind without a profile)."""
    size = math.prod(shape)
    given = [load_hardware(kind) for kind in hardware]
    if len(given) == size:
        return tuple(given)
    if len(given) == shape[0]:
        block = size // shape[0]
        return tuple(kind for kind in given for _ in range(block))
    raise MeshError("the hardware list matches neither the outermost axis nor the devices",
                    expected=f"{shape[0]} kinds (one per index of the outermost axis) or "
                             f"{size} (one per device)",
                    got=f"{len(given)} kinds", fix="e.g. hardware=['h100-sxm', 'a100-sxm'] "
                                                   "for a mesh of two nodes")


def slowest(kinds: Sequence[HardwareProfile]) -> HardwareProfile:
    """One profile of the slowest of every figure of `kinds` (module docstring); the kind
    itself when there is one. `MeshError` for kinds of different devices (cuda and cpu)
    or link levels."""
    unique = list(dict.fromkeys(kinds))
    if len(unique) == 1:
        return unique[0]
    levels = {tuple(link.name for link in kind.links) for kind in unique}
    if len({kind.device for kind in unique}) > 1 or len(levels) > 1:
        raise MeshError("the kinds of a mesh must be devices of one type on the same link "
                        "levels", expected="one device type and one set of link levels",
                        got=", ".join(f"{k.name} ({k.device}: "
                                      f"{'/'.join(link.name for link in k.links)})"
                                      for k in unique),
                        fix="give every kind's profile the same link level names")
    first = unique[0]
    return dataclasses.replace(
        first, name="+".join(sorted(kind.name for kind in unique)),
        description="the slowest of every figure of " + ", ".join(k.name for k in unique),
        peak_flops=_least(kind.peak_flops for kind in unique),
        kernel_flops=_least(kind.kernel_flops for kind in unique),
        kernel_bandwidths=_least(kind.kernel_bandwidths for kind in unique),
        kernel_overheads=_most(kind.kernel_overheads for kind in unique),
        memory_bytes=min(kind.memory_bytes for kind in unique),
        usable_memory_bytes=min(kind.memory_bytes - kind.reserve_bytes for kind in unique),
        memory_bandwidth=min(kind.memory_bandwidth for kind in unique),
        compute_efficiency=min(kind.compute_efficiency for kind in unique),
        memory_efficiency=min(kind.memory_efficiency for kind in unique),
        launch_overhead_s=max(kind.launch_overhead_s for kind in unique),
        optimizer_tensor_s=_most_known(kind.optimizer_tensor_s for kind in unique),
        optimizer_element_s=_most_known(kind.optimizer_element_s for kind in unique),
        overlap_slowdown=max(kind.overlap_slowdown for kind in unique),
        links=tuple(_slowest_link([kind.links[i] for kind in unique])
                    for i in range(len(first.links))),
        mesh_shape=None)


def _slowest_link(links: list[LinkLevel]) -> LinkLevel:
    """One level as the slowest of `links` (the same level of each kind) carries it: the
    least bandwidth, the most latency, the fewest devices a group, and the measured
    collectives of the slowest kind's."""
    slow = min(links, key=lambda link: link.bandwidth)
    bounded = [link.devices for link in links if link.devices is not None]
    return dataclasses.replace(slow, latency=max(link.latency for link in links),
                               devices=min(bounded) if bounded else None)


def _least(tables) -> tuple[tuple[str, float], ...]:
    """Per key, the least value of the tables that have it, keeping only keys all have."""
    tables = [dict(table) for table in tables]
    keys = set.intersection(*(set(table) for table in tables))
    return tuple((key, min(table[key] for table in tables)) for key in sorted(keys))


def _most(tables) -> tuple[tuple[str, float], ...]:
    """Per key, the largest value of the tables that have it (an overhead one kind
    measured counts)."""
    merged: dict[str, float] = {}
    for table in tables:
        for key, value in table:
            merged[key] = max(value, merged.get(key, value))
    return tuple(sorted(merged.items()))


def _most_known(values) -> float | None:
    known = [value for value in values if value is not None]
    return max(known) if known else None
