"""The pipeline of a pipelined plan: a timeline of every stage's forward and backward (a
zero-bubble schedule's input and weight gradients apart; a forward-only plan's forwards
alone) per micro-batch on each pipeline rank (`autopar.costs.schedule.timeline`, from the
cost model), and the stages' table. Empty for a plan without a pipeline."""

from __future__ import annotations

from autopar.costs.schedule import timeline
from autopar.present.report.palette import swatch
from autopar.present.report.units import esc, ms, num, size
from autopar.values.pipeline import SCHEDULES
from autopar.values.plan import Plan

# Colour and name of each kind of timeline slot (`autopar.values.pipeline.Slot`).
KINDS = {"F": ("#5dade2", "forward"), "B": ("#e67e22", "backward"),
         "W": ("#58d68d", "weight gradient")}
LABEL_W, WIDTH, ROW_H, BAR_H, TOP = 90.0, 760.0, 30.0, 22.0, 22.0


def _timeline_svg(plan: Plan) -> str:
    record = plan.pipeline
    assert record is not None
    slots = timeline([s.time_s for s in record.stages], record.microbatches, record.ranks,
                     SCHEDULES[record.schedule], training=plan.training)
    end = max(slot.end for slot in slots)
    to_x = lambda t: LABEL_W + WIDTH * t / end  # noqa: E731 - a scale
    height = TOP + record.ranks * ROW_H + 20
    parts = [f'<text class="bar-label" x="{num(LABEL_W - 8)}" y="{num(TOP + k * ROW_H + 15)}">'
             f'rank {k}</text>' for k in range(record.ranks)]
    for slot in slots:
        y = TOP + slot.rank * ROW_H
        colour, name = KINDS[slot.kind]
        x, w = to_x(slot.start), max(1.0, to_x(slot.end) - to_x(slot.start))
        label = (f"stage {slot.stage}, micro-batch {slot.microbatch}: "
                 f"{name} {ms(slot.end - slot.start)}")
        parts.append(f'<g class="pp-op" data-kind="{slot.kind}" data-stage="{slot.stage}" '
                     f'data-microbatch="{slot.microbatch}"><rect x="{num(x)}" y="{num(y)}" '
                     f'width="{num(w)}" height="{num(BAR_H)}" fill="{colour}"/>'
                     f'<text x="{num(x + w / 2)}" y="{num(y + 15)}" class="pp-text">'
                     f'{slot.microbatch}</text><title>{esc(label)}</title></g>')
    parts.append(f'<text class="dim" x="{num(LABEL_W)}" y="{num(height - 4)}">0</text>'
                 f'<text class="dim" x="{num(LABEL_W + WIDTH)}" y="{num(height - 4)}" '
                 f'text-anchor="end">{esc(ms(end))}</text>')
    width = LABEL_W + WIDTH + 20
    return (f'<svg id="pipeline-timeline" width="{num(width)}" height="{num(height)}" '
            f'viewBox="0 0 {num(width)} {num(height)}" role="img" '
            f'aria-label="pipeline timeline">{"".join(parts)}</svg>')


def _stage_table(plan: Plan) -> str:
    record = plan.pipeline
    assert record is not None
    rows = "".join(
        f"<tr><td>{s.index}</td><td>{s.rank}</td><td>{esc(s.blocks[0])}"
        f"{'' if s.blocks[0] == s.blocks[1] else ' .. ' + esc(s.blocks[1])}</td>"
        f"<td>{esc(ms(s.time_s))}</td><td>{s.in_flight}</td><td>{esc(size(s.memory_bytes))}"
        f"</td></tr>" for s in record.stages)
    return ('<table id="pipeline-stages"><thead><tr><th>stage</th><th>rank</th><th>blocks'
            '</th><th>per micro-batch</th><th>in flight</th><th>memory</th></tr></thead>'
            f'<tbody>{rows}</tbody></table>')


def pipeline_section(plan: Plan) -> str:
    """The timeline and the stages, or "" without a pipeline."""
    record = plan.pipeline
    if record is None:
        return ""
    splits = SCHEDULES[record.schedule].splits_backward
    kinds = KINDS if plan.training else {"F": KINDS["F"]}  # a forward has no backward lanes
    legend = "".join(swatch(colour, "input gradient" if kind == "B" and splits else name)
                     for kind, (colour, name) in kinds.items() if kind != "W" or splits)
    return (f'<section id="pipeline"><h2>Pipeline <span class="dim">over {esc(record.axis)}: '
            f'{esc(record.schedule)}, {record.microbatches} micro-batches, '
            f'{len(record.stages)} stages, predicted bubble {record.bubble:.1%} · each box is '
            f'one stage\'s work on one micro-batch (its number), from the cost model</span>'
            f'</h2><div class="legend">{legend}</div>{_timeline_svg(plan)}'
            f'{_stage_table(plan)}</section>')
