"""The solver's plan against standard hand-written strategies (data parallel, ZeRO-3,
Megatron, ...) evaluated under the same cost model: step time and peak memory bars, with the
strategies that do not fit in memory marked, and a table of the details."""

from __future__ import annotations

from autopar.present.report.bars import Bar, Marker, Segment, bar_chart
from autopar.present.report.cost import COMM, COMPUTE
from autopar.present.report.palette import swatch
from autopar.present.report.units import esc, ms, size
from autopar.values.plan import HandStrategyRecord, Plan

PLAN_NAME = "autopar plan"
_MEMORY, _NOFIT = "#2e86de", "#c0392b"
OTHER = "#b2babb"


def _time_bar(name: str, step: float, compute: float | None, comm: float | None,
              fits: bool) -> Bar:
    if compute is not None and comm is not None:
        # What is left of the step is the optimizer's step (and, for a pipeline, its bubble).
        rest = max(0.0, step - compute - comm)
        segments = (Segment(compute, COMPUTE, f"compute {ms(compute)}"),
                    Segment(comm, COMM, f"comm {ms(comm)}"),
                    Segment(rest, OTHER, f"optimizer and idle {ms(rest)}"))
    else:
        segments = (Segment(step, COMPUTE, f"step {ms(step)}"),)
    text = ms(step) + ("" if fits else " · does not fit in memory")
    return Bar(name, segments, text, css="" if fits else "nofit")


def _charts(plan: Plan, records: list[HandStrategyRecord]) -> str:
    usable = [h for h in records if h.step_time_s is not None]
    # Bars show the exposed communication: the part hidden behind compute adds no time.
    times = [_time_bar(PLAN_NAME, plan.step_time_s, plan.compute_s, plan.exposed_comm_s,
                       plan.peak_memory_bytes <= plan.memory_limit_bytes)]
    times += [_time_bar(h.name, h.step_time_s, h.compute_s,
                        None if h.comm_s is None else h.comm_s - h.hidden_comm_s, h.fits)
              for h in usable]
    memory = [Bar(PLAN_NAME, (Segment(plan.peak_memory_bytes, _MEMORY, "peak"),),
                  size(plan.peak_memory_bytes))]
    memory += [Bar(h.name, (Segment(h.peak_memory_bytes, _MEMORY if h.fits else _NOFIT,
                                    "peak"),),
                   size(h.peak_memory_bytes) + ("" if h.fits else " · does not fit"),
                   css="" if h.fits else "nofit")
               for h in usable if h.peak_memory_bytes is not None]
    limit = (Marker(plan.memory_limit_bytes, f"limit {size(plan.memory_limit_bytes)}"),)
    legend = (swatch(COMPUTE, "compute") + swatch(COMM, "communication")
              + swatch(OTHER, "optimizer and idle"))
    return (f'<h3>Step time</h3><div class="legend">{legend}<span class="swatch nofit-key">'
            f'<i></i>does not fit in memory</span></div>'
            f'{bar_chart(times, css_id="hand-time-chart")}'
            f'<h3>Peak memory per device</h3>'
            f'{bar_chart(memory, css_id="hand-memory-chart", markers=limit)}')


def _table(records: list[HandStrategyRecord]) -> str:
    rows = []
    for h in records:
        comm = "; ".join(f"{kind} {axis} {direction} {size(nbytes)}"
                         for kind, axis, direction, nbytes in h.comm_bytes) or "none"
        step = ms(h.step_time_s) if h.step_time_s is not None else "n/a"
        peak = size(h.peak_memory_bytes) if h.peak_memory_bytes is not None else "n/a"
        fits = "yes" if h.fits else "<b class='bad'>no</b>"
        rows.append(f"<tr class='{'' if h.fits else 'nofit'}'><th>{esc(h.name)}</th>"
                    f"<td>{esc(h.description)}</td><td>{step}</td><td>{peak}</td>"
                    f"<td>{fits}</td><td>{esc(comm)}</td><td>{esc(h.note)}</td></tr>")
    return (f'<table id="hand-table" class="grid"><thead><tr><th>strategy</th>'
            f'<th>description</th><th>step</th><th>peak memory</th><th>fits</th>'
            f'<th>communication per device</th><th>note</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def hand_section(plan: Plan) -> str:
    """The comparison, or a note that no hand strategy was evaluated for this plan."""
    records = list(plan.hand_strategies)
    if not records:
        return ('<section id="hand"><h2>Against hand-written strategies</h2>'
                '<p class="note" id="hand-none">Hand strategies were not evaluated for this '
                'plan, so there is nothing to compare it with.</p></section>')
    return (f'<section id="hand"><h2>Against hand-written strategies <span class="dim">same '
            f'model, mesh and cost model</span></h2>{_charts(plan, records)}'
            f'{_table(records)}</section>')
