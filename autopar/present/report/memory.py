"""Per-device memory: the plan's peak against its memory limit and the device's capacity."""

from __future__ import annotations

import itertools

from autopar.present.report.bars import Bar, Marker, Segment, bar_chart
from autopar.present.report.units import esc, size
from autopar.values.plan import Plan

# Beyond this many devices one row stands for all of them: every rank runs the same program.
MAX_ROWS = 16
_FITS, _OVER = "#2e86de", "#c0392b"


def _devices(plan: Plan) -> list[str]:
    mesh = plan.mesh
    if mesh.size > MAX_ROWS:
        return [f"each of {mesh.size} devices"]
    return [" ".join(f"{a}={i}" for a, i in zip(mesh.axis_names, coords))
            for coords in itertools.product(*(range(n) for n in mesh.shape))]


def memory_section(plan: Plan) -> str:
    """Bars of peak memory per device on a track of the device's capacity, with the limit
    the solver was held to marked."""
    capacity = float(plan.mesh.hardware.memory_bytes)
    peak, limit = plan.peak_memory_bytes, plan.memory_limit_bytes
    over = peak > limit
    colour = _OVER if over else _FITS
    text = f"{size(peak)} peak · {peak / capacity:.1%} of {size(capacity)}"
    bars = [Bar(label, (Segment(peak, colour, f"peak {size(peak)}"),), text,
                css="over" if over else "", background=capacity) for label in _devices(plan)]
    markers = (Marker(limit, f"limit {size(limit)}"),)
    if abs(limit - capacity) > 1e-6 * capacity:
        markers += (Marker(capacity, f"capacity {size(capacity)}"),)
    verdict = ("exceeds the memory limit" if over else "fits within the memory limit")
    return (f'<section id="memory"><h2>Memory per device</h2>'
            f'<p>Peak <b>{size(peak)}</b> {verdict} of <b>{size(limit)}</b>; the '
            f'{esc(plan.mesh.hardware.name)} device holds {size(capacity)}.</p>'
            f'{bar_chart(bars, css_id="memory-chart", markers=markers)}</section>')
