"""The plan's predictions against a measured run (`autopar.measure`): the step split by op
group, predicted and measured, as stacked bars with the measured median marked; each
rank's peak memory against the plan's; and the table of every figure with its ratio."""

from __future__ import annotations

from collections.abc import Sequence

from autopar.present.report.bars import Bar, Marker, Segment, bar_chart
from autopar.present.report.palette import series_colour, swatch
from autopar.present.report.units import esc, ms, size
from autopar.values.measurement import (
    GROUPS,
    Comparison,
    Measurement,
    compare,
    ranks_of,
)
from autopar.values.plan import Plan

PREDICTED, MEASURED = "#5dade2", "#e67e22"


def _step_bar(label: str, rows: list[Comparison], value, total: float) -> Bar:
    """A bar of the groups' seconds (`value(row)`), stacked in `GROUPS` order."""
    segments = tuple(Segment(value(row), series_colour(i), f"{row.quantity} {ms(value(row))}")
                     for i, row in enumerate(rows))
    return Bar(label, segments, ms(total))


def _step_chart(rows: tuple[Comparison, ...], profiled: float) -> str:
    step = rows[0]
    groups = [row for row in rows if row.quantity in GROUPS]
    bars = [_step_bar("predicted", groups, lambda r: r.predicted, step.predicted),
            _step_bar("measured (profiled)", groups, lambda r: r.measured, profiled)]
    markers = (Marker(step.measured, f"measured median {ms(step.measured)}"),)
    legend = "".join(swatch(series_colour(i), name) for i, name in enumerate(GROUPS))
    return (f'<h3>Step time by op group</h3><div class="legend">{legend}</div>'
            f'{bar_chart(bars, css_id="measured-step-chart", markers=markers)}')


def _memory_chart(rows: tuple[Comparison, ...]) -> str:
    bars = []
    for row in (r for r in rows if r.unit == "B"):
        rank = row.quantity.rsplit(" ", 1)[-1]
        bars.append(Bar(f"rank {rank} predicted", (Segment(row.predicted, PREDICTED,
                                                           "predicted peak"),),
                        size(row.predicted)))
        ratio = "" if row.ratio is None else f" · {row.ratio:.2f}x predicted"
        bars.append(Bar(f"rank {rank} measured", (Segment(row.measured, MEASURED,
                                                          "measured peak"),),
                        size(row.measured) + ratio))
    # No marker of the memory limit: far above a small run's peaks, it would squash the
    # bars being compared (the memory section draws it).
    legend = swatch(PREDICTED, "predicted") + swatch(MEASURED, "measured")
    return (f'<h3>Peak memory per rank</h3><div class="legend">{legend}</div>'
            f'{bar_chart(bars, css_id="measured-memory-chart")}')


def _table(rows: tuple[Comparison, ...]) -> str:
    cells = []
    for row in rows:
        shown = size if row.unit == "B" else ms
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x"
        cells.append(f"<tr><th>{esc(row.quantity)}</th><td>{shown(row.predicted)}</td>"
                     f"<td>{shown(row.measured)}</td><td>{ratio}</td>"
                     f"<td>{esc(row.note)}</td></tr>")
    return ('<table id="measured-table" class="grid"><thead><tr><th>quantity</th>'
            '<th>predicted</th><th>measured</th><th>measured/predicted</th>'
            f'<th>how measured</th></tr></thead><tbody>{"".join(cells)}</tbody></table>')


def measured_section(plan: Plan, measured: Measurement | Sequence[Measurement]) -> str:
    """The section comparing `plan` with `measured` (one rank's measurement or a list)."""
    ranks = ranks_of(measured)
    rows = compare(plan, ranks)
    profiled = sum(m.profiled_step_s for m in ranks) / len(ranks)
    first = ranks[0]
    return (f'<section id="measured"><h2>Predicted against measured <span class="dim">'
            f'{len(ranks)} rank(s), {first.steps} timed steps after {first.warmup} warm-up, '
            f'on {esc(first.device)}</span></h2>'
            f'<p>Measured step <b>{ms(rows[0].measured)}</b> (median, spread '
            f'{max(ranks, key=lambda m: m.median_s).spread:.1%}) against a predicted '
            f'<b>{ms(rows[0].predicted)}</b>. Op groups: the predicted step against one '
            f'profiled step ({ms(profiled)}, profiler overhead included).</p>'
            f'{_step_chart(rows, profiled)}{_memory_chart(rows)}{_table(rows)}'
            '</section>')
