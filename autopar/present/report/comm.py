"""Communication by collective kind, mesh axis and layer: a table and stacked bars."""

from __future__ import annotations

from collections import defaultdict

from autopar.present.report.bars import Bar, Segment, bar_chart
from autopar.present.report.layers import group_layers, layer_nodes
from autopar.present.report.palette import series_colour, swatch
from autopar.present.report.units import esc, ms, size
from autopar.values.plan import Plan

Key = tuple[str, str]  # (collective kind, mesh axis)


def _per_layer(plan: Plan) -> tuple[list[Key], list[tuple[str, dict, dict]]]:
    """The (kind, axis) columns in use, and per layer its bytes and seconds by column."""
    rows = []
    keys: set[Key] = set()
    for layer in group_layers(plan):
        nbytes: dict[Key, float] = defaultdict(float)
        seconds: dict[Key, float] = defaultdict(float)
        for node in layer_nodes(plan, layer):
            for t in node.transfers:
                nbytes[(t.kind, t.axis)] += t.nbytes
                seconds[(t.kind, t.axis)] += t.seconds
        keys |= set(nbytes)
        rows.append((layer.name, nbytes, seconds))
    return sorted(keys), rows


def _table(keys: list[Key], rows: list[tuple[str, dict, dict]]) -> str:
    head = "".join(f"<th>{esc(kind)}<br><span class='dim'>axis {esc(axis)}</span></th>"
                   for kind, axis in keys)
    body = []
    for name, nbytes, seconds in rows:
        if not nbytes:
            continue
        cells = "".join(f'<td title="{ms(seconds[k])}">{size(nbytes[k]) if k in nbytes else ""}'
                        f'</td>' for k in keys)
        body.append(f"<tr><th>{esc(name)}</th>{cells}<td>{size(sum(nbytes.values()))}</td>"
                    f"<td>{ms(sum(seconds.values()))}</td></tr>")
    totals = "".join(f"<td>{size(sum(r[1].get(k, 0.0) for r in rows))}</td>" for k in keys)
    body.append(f"<tr class='total'><th>total</th>{totals}"
                f"<td>{size(sum(sum(r[1].values()) for r in rows))}</td>"
                f"<td>{ms(sum(sum(r[2].values()) for r in rows))}</td></tr>")
    return (f'<table id="comm-table" class="grid"><thead><tr><th>layer</th>{head}'
            f'<th>bytes</th><th>time</th></tr></thead><tbody>{"".join(body)}</tbody></table>')


def _directions(plan: Plan) -> str:
    rows = "".join(f"<tr><td>{esc(kind)}</td><td>{esc(axis)}</td><td>{esc(direction)}</td>"
                   f"<td>{size(nbytes)}</td></tr>"
                   for (kind, axis, direction), nbytes in plan.comm_bytes().items())
    return (f'<table id="comm-directions" class="grid"><thead><tr><th>collective</th>'
            f'<th>axis</th><th>direction</th><th>bytes per device</th></tr></thead>'
            f'<tbody>{rows}</tbody></table>')


def comm_section(plan: Plan) -> str:
    """The section; says so plainly when the plan communicates nothing."""
    keys, rows = _per_layer(plan)
    if not keys:
        return ('<section id="comm"><h2>Communication</h2><p class="note" id="comm-none">'
                'This plan communicates nothing: every tensor stays where it is made.</p>'
                '<table id="comm-table" class="grid"></table></section>')
    colours = {k: series_colour(n) for n, k in enumerate(keys)}
    bars = [Bar(name, tuple(Segment(seconds[k], colours[k],
                                    f"{k[0]} on {k[1]}: {ms(seconds[k])}, {size(nbytes[k])}")
                            for k in keys if k in seconds),
                f"{ms(sum(seconds.values()))} · {size(sum(nbytes.values()))}")
            for name, nbytes, seconds in rows if nbytes]
    legend = "".join(swatch(colours[k], f"{k[0]} on {k[1]}") for k in keys)
    passes = "forward + backward" if plan.training else "forward"
    return (f'<section id="comm"><h2>Communication <span class="dim">per device, {passes}; '
            f'bytes are per-rank buffers</span></h2>{_table(keys, rows)}'
            f'<h3>Time by layer</h3><div class="legend">{legend}</div>'
            f'{bar_chart(bars, css_id="comm-chart")}'
            f'<h3>By direction</h3>{_directions(plan)}</section>')
