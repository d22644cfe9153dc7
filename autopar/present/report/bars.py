"""Horizontal stacked bar charts as inline SVG, the one chart shape every section uses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autopar.present.report.units import esc, num

LABEL_W, BAR_W, VALUE_W = 190.0, 440.0, 260.0
ROW_H, BAR_H, TOP = 24.0, 16.0, 6.0


@dataclass(frozen=True)
class Segment:
    """One coloured piece of a bar; `label` is its hover text."""

    value: float
    colour: str
    label: str


@dataclass(frozen=True)
class Bar:
    """One row: its label, segments stacked left to right, and the text after the bar.
    `css` adds classes to the row (e.g. `nofit`); `background` draws an empty track of that
    value behind the segments (a capacity)."""

    label: str
    segments: tuple[Segment, ...]
    text: str
    css: str = ""
    background: float | None = None


@dataclass(frozen=True)
class Marker:
    """A vertical dashed line across all rows at `value`, labelled."""

    value: float
    label: str


def bar_chart(bars: list[Bar], *, css_id: str, markers: tuple[Marker, ...] = (),
              scale: Callable[[float], float] | None = None) -> str:
    """An SVG chart with one row per bar, all on one linear scale from 0 to the largest value
    (of segment sums, backgrounds and markers). Rows are `<g class="bar-row">`."""
    top = TOP + (14.0 if markers else 0.0)
    largest = max([sum(s.value for s in b.segments) for b in bars]
                  + [b.background or 0.0 for b in bars] + [m.value for m in markers] + [0.0])
    to_x = scale or (lambda v: BAR_W * v / largest if largest > 0 else 0.0)
    rows = []
    for k, bar in enumerate(bars):
        y = top + k * ROW_H
        parts = [f'<text class="bar-label" x="{num(LABEL_W - 8)}" y="{num(y + BAR_H / 2)}">'
                 f'{esc(bar.label)}</text>']
        if bar.background is not None:
            parts.append(f'<rect class="track" x="{num(LABEL_W)}" y="{num(y)}" '
                         f'width="{num(to_x(bar.background))}" height="{num(BAR_H)}"/>')
        x = LABEL_W
        for segment in bar.segments:
            # A nonzero value always shows, however small against the scale.
            width = max(to_x(segment.value), 2.0) if segment.value > 0 else 0.0
            parts.append(f'<rect class="seg" x="{num(x)}" y="{num(y)}" width="{num(width)}" '
                         f'height="{num(BAR_H)}" fill="{segment.colour}">'
                         f'<title>{esc(segment.label)}</title></rect>')
            x += width
        end = max(x, LABEL_W + to_x(bar.background or 0.0)) + 6
        parts.append(f'<text class="bar-value" x="{num(end)}" y="{num(y + BAR_H / 2)}">'
                     f'{esc(bar.text)}</text>')
        rows.append(f'<g class="bar-row {esc(bar.css)}" data-label="{esc(bar.label)}">'
                    f'{"".join(parts)}</g>')
    height = top + len(bars) * ROW_H + 4
    lines = "".join(
        f'<line class="marker" x1="{num(LABEL_W + to_x(m.value))}" y1="{num(top - 4)}" '
        f'x2="{num(LABEL_W + to_x(m.value))}" y2="{num(height)}"/>'
        f'<text class="marker-text" x="{num(LABEL_W + to_x(m.value))}" y="{num(top - 7)}">'
        f'{esc(m.label)}</text>' for m in markers)
    width = LABEL_W + BAR_W + VALUE_W
    return (f'<svg class="chart" id="{esc(css_id)}" width="{num(width)}" height="{num(height)}" '
            f'viewBox="0 0 {num(width)} {num(height)}">{"".join(rows)}{lines}</svg>')
