"""Text rendering of a `Plan`: per op group placements and costs (groups by `layer_pattern`
in the order the model runs them, as `autopar.present.report.layers` defines both; long
module paths shortened to distinct labels, a legend under the table), the totals, the bytes
moved, and, when the plan carries them, the hand strategies it is compared with, and for a
pipeline its stages; then the plan's warnings, each once. Given a measurement
(`autopar.measure`), the predicted step, op groups and peak memory next to the measured
ones (`measured_table`).

Scaling efficiency is the compute-only lower bound of the step time (the step's compute on
one device divided by the number of devices: perfect splitting, nothing moved) over a
predicted step time (`autopar.values.plan.scaling_efficiency`)."""

from __future__ import annotations

import io
from collections import Counter, defaultdict
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from autopar.present.report.layers import group_layers, layer_nodes, layer_pattern
from autopar.present.report.overview import planning_time
from autopar.present.report.units import ms as _ms_text
from autopar.present.report.units import size as _size
from autopar.values.compression import compression_named
from autopar.values.measurement import Comparison, Measurement, compare, ranks_of
from autopar.values.plan import (
    SINGLE_DEVICE,
    HandStrategyRecord,
    NodePlan,
    Plan,
    SolverReport,
    scaling_efficiency,
)

# The "op group" column shows a layer pattern whole up to this share of the table's width;
# a longer one keeps its end (what tells two sibling groups apart) after an ellipsis.
_GROUP_SHARE = 0.3
_ELLIPSIS = "…"


def _ms(seconds: float) -> str:
    """Milliseconds without the unit, for columns headed "ms" (`_ms_text` adds it)."""
    return _ms_text(seconds).removesuffix(" ms")


def _placements(node: NodePlan) -> str:
    inputs = " ".join(f"[{p}]" for p in node.inputs)
    return f"{inputs} -> [{node.output}]" if inputs else f"[{node.output}]"


def _groups(plan: Plan) -> dict[str, list[NodePlan]]:
    """The plan's nodes by layer pattern (`layer_pattern`, `TOP` for the model's own), in
    the order the model runs them (`group_layers`)."""
    return {group.name: layer_nodes(plan, group)
            for group in group_layers(plan, layer_pattern)}


def _shortened(parts: list[str], head: int, limit: int) -> str:
    """`head` first parts, an ellipsis, then as many last parts as keep the label within
    `limit` (at least one); the whole pattern once nothing is left to elide."""
    def label(tail: int) -> str:
        if head + tail >= len(parts):
            return ".".join(parts)
        return ".".join(parts[:head]) + _ELLIPSIS + ".".join(parts[-tail:])

    tail = 1
    while head + tail + 1 < len(parts) and len(label(tail + 1)) <= limit:
        tail += 1
    return label(tail)


def group_labels(patterns: list[str], limit: int) -> dict[str, str]:
    """A label per pattern, at most `limit` characters where it can be: the whole pattern,
    or an ellipsis and as many of its last dotted parts as fit ("…layer.*.SelfAttention.q":
    the end tells sibling groups apart). Labels are distinct: patterns whose labels would
    read the same keep their first parts too, one more at a time ("m.encoder…SelfAttention.q"
    and "m.decoder…SelfAttention.q"), up to the whole (distinct) pattern."""
    parts = {p: p.split(".") for p in patterns}
    head = {p: 0 for p in patterns}

    def label(pattern: str) -> str:
        if len(pattern) <= limit:
            return pattern
        return _shortened(parts[pattern], head[pattern], limit)

    while True:
        labels = {p: label(p) for p in patterns}
        same: dict[str, list[str]] = defaultdict(list)
        for pattern, text in labels.items():
            same[text].append(pattern)
        # A label that clashes is shortened (whole patterns are distinct): keep more parts.
        clashes = [p for group in same.values() if len(group) > 1 for p in group]
        if not clashes:
            return labels
        for pattern in clashes:
            head[pattern] += 1


_LEGEND = ("Rows in the order the model runs them; repeated blocks share a row (layers.* "
           "for layers.0, layers.1, ...). x: how many modules the row stands for; its ms and "
           "memory (parameters with gradients and optimizer state, kept activations) are "
           "their sum, per device and step. Placements: R replicated, S(d) split on dim d, "
           "P partial sums.")


def _step(plan: Plan) -> str:
    """What the plan's times and bytes are of."""
    return "one training step" if plan.training else "one forward, inference"


def _group_table(plan: Plan, width: int) -> Table:
    axes = ",".join(plan.mesh.axis_names)
    legend = _LEGEND if plan.training else _LEGEND.replace(
        "parameters with gradients and optimizer state, kept activations", "parameters, "
        "activations live in the forward").replace("per device and step", "per device")
    table = Table(title=f"Plan for {plan.model} on {plan.mesh.describe()}", title_justify="left",
                  caption=legend, caption_justify="left")
    groups = _groups(plan)
    labels = group_labels(list(groups), max(16, int(width * _GROUP_SHARE)))
    table.add_column("op group", no_wrap=True,
                     min_width=max((len(text) for text in labels.values()), default=8))
    table.add_column("x", justify="right")
    table.add_column(f"heaviest op: placements per axis ({axes})")
    for name in ("compute ms", "comm ms", "memory"):
        table.add_column(name, justify="right")
    for pattern, nodes in groups.items():
        ops = [n for n in nodes if n.role == "op"] or nodes
        heaviest = max(ops, key=lambda n: (n.compute_s, n.comm_s))
        modules = {n.module for n in nodes}
        table.add_row(labels[pattern], str(len(modules)),
                      f"{heaviest.op.removeprefix('aten.')} {_placements(heaviest)}",
                      _ms(sum(n.compute_s for n in nodes)), _ms(sum(n.comm_s for n in nodes)),
                      _size(sum(n.memory_bytes for n in nodes)))
    return table


def _totals_table(plan: Plan) -> Table:
    table = Table(title=f"Totals (per device, {_step(plan)})", title_justify="left")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    solver = plan.solver
    training = plan.training
    rows = [
        (_latency_label(plan), _ms_text(plan.step_time_s)),
        ("  compute", _ms_text(plan.compute_s)),
        ("  communication, exposed", _ms_text(plan.exposed_comm_s)),
        ("  communication, hidden", f"{_ms_text(plan.hidden_comm_s)} "
         f"({'overlaps the backward' if training else 'behind compute'})"),
        ("peak memory", f"{_size(plan.peak_memory_bytes)} of {_size(plan.memory_limit_bytes)}"),
        ("  memory budget", _budget(plan)),
        *((("scaling efficiency", f"{efficiency:.1%}"),)
          if (efficiency := scaling_efficiency(plan, plan.step_time_s)) is not None else ()),
        *((("predicted MFU (bf16 peak)", f"{plan.mfu:.1%}"),) if plan.mfu is not None else ()),
        *((("micro-batches per step", str(plan.microbatches)),
           ("recomputed in the backward", _recomputed(plan))) if training else ()),
        *((("KV cache", f"{_size(plan.kv_cache_bytes)} per device, "
                        f"{plan.kv_cache_tokens:,} tokens in all"),)
          if plan.kv_cache_bytes else ()),
        *((("objective: throughput", _throughput(plan)),) if plan.serving else ()),
        *((("predicted time to first token", f"{_ms_text(plan.prefill_s)} for "
            f"{plan.prefill_tokens:,}-token prompts, peak {_size(plan.prefill_peak_bytes)}"
            + _placed_for(plan)),)
          if plan.prefill_tokens else ()),
        *((("outputs", "whole on every device" if plan.outputs == "whole" else
            "left split as placed (DTensors)"),) if not training else ()),
        ("context parallel", describe_context_parallel(plan)),
        ("parameter storage", _storage(plan)),
        *((("split unevenly", _uneven(plan)),) if any(n.pieces for n in plan.nodes) else ()),
        *((("compressed", _compressed(plan)),) if any(n.compression for n in plan.nodes)
          else ()),
        ("optimizer", plan.optimizer),
        ("solver", f"{solver.status}, gap {solver.gap:.2%}, {solver.wall_time_s:.2f} s, "
                   f"{solver.decisions} decisions ({solver.tied} tied)"),
        *((("planning time", planning_time(solver)),) if solver.time_limit_s else ()),
        *((("without the memory limit", _memory_free(solver)),)
          if solver.memory_free is not None else ()),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def _latency_label(plan: Plan) -> str:
    """A training plan's step, a forward's latency, a decode program's per output token
    (a forward of one token per sequence over a KV cache)."""
    if plan.training:
        return "predicted step time"
    return "predicted latency, per output token" if plan.kv_cache_bytes else \
        "predicted latency"


def _placed_for(plan: Plan) -> str:
    """Whose placements of the weights and the cache a decode plan with its prefill took,
    when not the decode program's own."""
    return {"prefill": "; weights and cache placed for the prefill",
            "both": "; weights and cache placed for both, planned as one problem"}.get(
        plan.placed_for, "")


def _throughput(plan: Plan) -> str:
    """The tokens a second each batch tried serves, the plan's batch marked."""
    kept = plan.serving_batch
    return ", ".join(f"{'*' if batch == kept else ''}{batch} sequences: "
                     + (f"{served:,.0f} tokens/s" if served else "does not fit")
                     for batch, served in plan.serving)


def _memory_free(solver: SolverReport) -> str:
    """The solver's objective without the memory limit, and how much more the plan's is."""
    added = solver.objective / solver.memory_free - 1 if solver.memory_free > 0 else 0.0
    return f"objective {solver.memory_free:.4g} (the plan's is {added:.1%} more)"


def _budget(plan: Plan) -> str:
    """The budget as the device's capacity less what it leaves free (the reserve, by
    default: context, communicators, fragmentation; or what a given budget leaves)."""
    capacity = plan.mesh.hardware.memory_bytes
    left = capacity - plan.memory_limit_bytes
    if left < 0:
        return f"{_size(plan.memory_limit_bytes)}, above the device's {_size(capacity)}"
    return f"{_size(capacity)} device less {_size(left)} reserved"


def _recomputed(plan: Plan) -> str:
    ops = [n for n in plan.nodes if n.recompute]
    if not ops:
        return "nothing"
    kinds = sorted({n.op.removeprefix("aten.").split(".")[0] for n in ops})
    return f"{len(ops)} ops ({', '.join(kinds)})"


def describe_context_parallel(plan: Plan) -> str:
    """The attentions that run on a ring, by mesh axis: the nodes whose own transfers are
    sends (an edge's conversion is never one), but over the pipeline axis, where a
    stage's last op sends its output to the next stage."""
    axes: dict[str, int] = defaultdict(int)
    stages = plan.pipeline.axis if plan.pipeline is not None else None
    for node in plan.nodes:
        ring = {t.axis for t in node.transfers if t.kind == "send" and t.axis != stages}
        for axis in ring:
            axes[axis] += 1
    return ", ".join(f"{count} attention(s) on a ring over {axis}"
                     for axis, count in sorted(axes.items())) or "none"


def _storage(plan: Plan) -> str:
    """Parameters by how they are stored: replicated, sharded and gathered at each use
    (ZeRO-3), sharded and kept gathered from use to backward (ZeRO-2), or kept gathered
    for the step with a whole gradient (ZeRO-1)."""
    counts: dict[str, int] = defaultdict(int)
    for node in plan.nodes:
        if node.role == "parameter":
            if node.whole_gradient:
                counts["gathered for the step, whole gradient (ZeRO-1)"] += 1
            elif node.gathered:
                counts["kept gathered (ZeRO-2)"] += 1
            elif "S" in node.output:
                counts["sharded"] += 1
            else:
                counts["replicated"] += 1
    return ", ".join(f"{count} {kind}" for kind, count in sorted(counts.items())) or "none"


def _uneven(plan: Plan) -> str:
    """How many tensors are split into pieces of different lengths, and the pieces of the
    largest stored one (else the first)."""
    uneven = [n for n in plan.nodes if n.pieces]
    stored = [n for n in uneven if n.role in ("parameter", "buffer")]
    shown = max(stored, key=lambda n: n.memory_bytes) if stored else uneven[0]
    name = shown.module if shown.role in ("parameter", "buffer") else shown.name
    return f"{len(uneven)} tensors; {name} {shown.output}, {shown.pieces}"


def _compressed(plan: Plan) -> str:
    """What the plan compresses, by compression: how many parameters' gradients, and the
    expected error (`autopar.values.compression`)."""
    counts = Counter(n.compression for n in plan.nodes if n.compression)
    return "; ".join(f"{count} parameters' {compression_named(name).compresses} ({name}): "
                     f"{compression_named(name).error}" for name, count in sorted(counts.items()))


def _pipeline_table(plan: Plan) -> Table:
    """The stages of a pipelined plan: where they run, their blocks, time per micro-batch,
    micro-batches held and memory, under the schedule, micro-batches and bubble."""
    record = plan.pipeline
    assert record is not None
    table = Table(title=f"Pipeline over {record.axis}: {record.schedule}, "
                        f"{record.microbatches} micro-batches, {len(record.stages)} stages "
                        f"({record.virtual} per rank), bubble {record.bubble:.1%}",
                  title_justify="left")
    axis, mixed = plan.mesh.axis_index(record.axis), plan.mesh.kinds is not None
    for name in ("stage", "rank", *(("devices",) if mixed else ()), "blocks",
                 "ms per micro-batch", "in flight", "memory"):
        table.add_column(name, justify="left" if name in ("blocks", "devices") else "right")
    for stage in record.stages:
        blocks = stage.blocks[0] if stage.blocks[0] == stage.blocks[1] else \
            f"{stage.blocks[0]} .. {stage.blocks[1]}"
        kinds = "+".join(kind.name for kind in plan.mesh.kinds_at(axis, stage.rank))
        table.add_row(str(stage.index), str(stage.rank), *((kinds,) if mixed else ()), blocks,
                      _ms(stage.time_s), str(stage.in_flight), _size(stage.memory_bytes))
    work = "forward and backward" if plan.training else "forward"
    table.caption = (f"ms: {work} of one micro-batch with the stage's sends; "
                     "in flight: micro-batches whose activations the stage holds at its peak; "
                     "memory per device. The rows above sum every stage.")
    return table


def _comm_table(plan: Plan) -> Table:
    title = "Bytes moved per device" + (
        ", summed over the pipeline ranks" if plan.pipeline is not None else "")
    table = Table(title=title, title_justify="left")
    for name in ("collective", "axis", "direction", "bytes"):
        table.add_column(name, justify="right" if name == "bytes" else "left")
    for (kind, axis, direction), nbytes in plan.comm_bytes().items():
        table.add_row(kind, axis, direction, _size(nbytes))
    if not plan.comm_bytes():
        table.add_row("none", "", "", "0 B")
    return table


_SHORT = {"all_reduce": "AR", "all_gather": "AG", "reduce_scatter": "RS", "all_to_all": "A2A",
          "send": "P2P", "broadcast": "BC"}


def _by_kind_and_axis(rows) -> str:
    totals: dict[tuple[str, str], float] = defaultdict(float)
    for kind, axis, _, nbytes in rows:
        totals[(kind, axis)] += nbytes
    return "\n".join(f"{_SHORT[kind]} {axis} {_size(nbytes)}"
                     for (kind, axis), nbytes in sorted(totals.items())) or "none"


def _hand_row(plan: Plan, record: HandStrategyRecord) -> tuple[str, ...]:
    if record.step_time_s is None:
        return (record.name, "-", "-", "-", "-", "-", "n/a")
    efficiency = scaling_efficiency(plan, record.step_time_s)
    return (record.name, _ms(record.step_time_s), f"{record.step_time_s / plan.step_time_s:.2f}x",
            "-" if efficiency is None else f"{efficiency:.1%}",
            f"{_size(record.peak_memory_bytes)} / {_size(plan.memory_limit_bytes)}",
            _by_kind_and_axis(record.comm_bytes), "fits" if record.fits else "over memory")


def _hand_table(plan: Plan) -> Table:
    table = Table(title=f"Compared with hand strategies (per device, {_step(plan)})",
                  title_justify="left", show_lines=True)
    for name in ("strategy", "step ms", "vs plan", "scaling eff.", "peak memory / capacity",
                 "bytes moved", "memory"):
        table.add_column(name, justify="right" if name in ("step ms", "vs plan",
                                                           "scaling eff.") else "left")
    efficiency = scaling_efficiency(plan, plan.step_time_s)
    table.add_row("autopar plan", _ms(plan.step_time_s), "1.00x",
                  "-" if efficiency is None else f"{efficiency:.1%}",
                  f"{_size(plan.peak_memory_bytes)} / {_size(plan.memory_limit_bytes)}",
                  _by_kind_and_axis((k, a, d, b) for (k, a, d), b in plan.comm_bytes().items()),
                  "fits")
    records = sorted(plan.hand_strategies, key=lambda r: r.name == SINGLE_DEVICE)
    for record in records:
        table.add_row(*_hand_row(plan, record))
    return table


def _hand_notes(plan: Plan) -> list[str]:
    notes = [f"{r.name}: {r.note}" for r in plan.hand_strategies if r.note]
    return [*notes, "scaling eff. = (one device's compute / devices) / step time. bytes moved "
                    "per device, forward + backward: AR all-reduce, AG all-gather, RS "
                    "reduce-scatter, A2A all-to-all, P2P sends (between pipeline stages, "
                    "around attention rings), BC broadcast (summed over a pipeline's "
                    "ranks). Hand strategies are the "
                    "cheapest plans within their roles, solved with no memory limit (Megatron "
                    "3D within it when some choice of micro-batches fits)."]


def _value(row: Comparison, value: float) -> str:
    return _size(value) if row.unit == "B" else _ms_text(value)


def measured_table(plan: Plan, measured: Measurement | Sequence[Measurement]) -> Table:
    """Predicted against measured (`autopar.values.measurement.compare`): the step time,
    each op group, and each rank's peak memory, with measured/predicted."""
    ranks = ranks_of(measured)
    first = ranks[0]
    table = Table(title=f"Predicted against measured ({len(ranks)} "
                        f"{'rank' if len(ranks) == 1 else 'ranks'}, {first.steps} timed steps "
                        f"after {first.warmup} warm-up, on {first.device})",
                  title_justify="left")
    for name in ("quantity", "predicted", "measured", "measured/predicted", "how measured"):
        table.add_column(name, justify="right" if name in ("predicted", "measured",
                                                           "measured/predicted") else "left")
    for row in compare(plan, ranks):
        quantity = row.quantity if row.quantity.startswith(("step", "peak")) \
            else f"  {row.quantity}"
        table.add_row(quantity, _value(row, row.predicted), _value(row, row.measured),
                      "-" if row.ratio is None else f"{row.ratio:.2f}x", row.note)
    profiled = sum(m.profiled_step_s for m in ranks) / len(ranks)
    table.caption = (
        f"predicted: the plan's cost model ({plan.mesh.hardware.name}); measured: "
        f"autopar.measure. Op groups: the predicted step's against one profiled step's "
        f"({_ms_text(profiled)}, profiler overhead included); collectives: predicted the "
        "exposed communication, measured the time in collectives (waiting for other ranks "
        "included); idle: predicted a pipeline's bubble, measured the time outside every "
        "op (Python, waiting). Peak memory: the plan's per device (a pipeline rank's: its "
        "stages') against each rank's.")
    table.caption_justify = "left"
    return table


def render_measured(plan: Plan, measured: Measurement | Sequence[Measurement], *,
                    width: int = 120) -> str:
    """`measured_table` as plain text, `width` columns wide."""
    buffer = io.StringIO()
    Console(file=buffer, width=width, no_color=True, color_system=None).print(
        measured_table(plan, measured))
    return buffer.getvalue()


def render_summary(plan: Plan, *, width: int = 120,
                   measured: Measurement | Sequence[Measurement] | None = None) -> str:
    """The plan as plain-text tables (no colour codes), `width` columns wide; with the
    comparison table "Compared with hand strategies" when the plan carries them, and with
    `measured` (`autopar.measure`'s result, one rank's or a list of ranks') the table
    "Predicted against measured" after the totals."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, no_color=True, color_system=None)
    tables = [_group_table(plan, width), _totals_table(plan), _comm_table(plan)]
    if measured is not None:
        tables.insert(2, measured_table(plan, measured))
    for table in tables:
        console.print(table)
    if plan.pipeline is not None:
        console.print(_pipeline_table(plan))
    if plan.hand_strategies:
        console.print(_hand_table(plan))
        for note in _hand_notes(plan):
            console.print(note)
    for warning in dict.fromkeys(plan.warnings):  # each once, in order
        console.print(f"warning: {warning}")
    return buffer.getvalue()
