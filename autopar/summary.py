"""Text rendering of a `Plan`: per op group placements and costs, the totals, the bytes moved,
and, when the plan carries them, the hand strategies it is compared with.

Scaling efficiency is the compute-only lower bound of the step time (the step's compute on
one device divided by the number of devices: perfect splitting, nothing moved) over a
predicted step time (`autopar.hand_strategies.scaling_efficiency`)."""

from __future__ import annotations

import io
from collections import defaultdict

from rich.console import Console
from rich.table import Table

from autopar.hand_strategies import SINGLE_DEVICE, scaling_efficiency
from autopar.plan_types import HandStrategyRecord, NodePlan, Plan, layer_pattern


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f}"


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:,.2f} {unit}"
    return f"{nbytes:,.0f} B"


def _placements(node: NodePlan) -> str:
    inputs = " ".join(f"[{p}]" for p in node.inputs)
    return f"{inputs} -> [{node.output}]" if inputs else f"[{node.output}]"


def _group_table(plan: Plan) -> Table:
    axes = ",".join(plan.mesh.axis_names)
    table = Table(title=f"Plan for {plan.model} on {plan.mesh.describe()}", title_justify="left")
    table.add_column("op group")
    table.add_column("x", justify="right")
    table.add_column(f"heaviest op: placements per axis ({axes})")
    for name in ("compute ms", "comm ms", "memory"):
        table.add_column(name, justify="right")
    groups: dict[str, list[NodePlan]] = defaultdict(list)
    blocks: dict[str, set[str]] = defaultdict(set)
    for node in plan.nodes:
        pattern = layer_pattern(node.module) or "(top)"
        groups[pattern].append(node)
        blocks[pattern].add(node.module)
    for pattern, nodes in groups.items():
        ops = [n for n in nodes if n.role == "op"] or nodes
        heaviest = max(ops, key=lambda n: (n.compute_s, n.comm_s))
        table.add_row(pattern, str(len(blocks[pattern])),
                      f"{heaviest.op.removeprefix('aten.')} {_placements(heaviest)}",
                      _ms(sum(n.compute_s for n in nodes)), _ms(sum(n.comm_s for n in nodes)),
                      _size(sum(n.memory_bytes for n in nodes)))
    return table


def _totals_table(plan: Plan) -> Table:
    table = Table(title="Totals (per device, one training step)", title_justify="left")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    solver = plan.solver
    rows = [
        ("predicted step time", f"{_ms(plan.step_time_s)} ms"),
        ("  compute", f"{_ms(plan.compute_s)} ms"),
        ("  communication, exposed", f"{_ms(plan.exposed_comm_s)} ms"),
        ("  communication, hidden", f"{_ms(plan.hidden_comm_s)} ms (overlaps the backward)"),
        ("peak memory", f"{_size(plan.peak_memory_bytes)} of {_size(plan.memory_limit_bytes)}"),
        *((("scaling efficiency", f"{efficiency:.1%}"),)
          if (efficiency := scaling_efficiency(plan, plan.step_time_s)) is not None else ()),
        *((("predicted MFU (bf16 peak)", f"{plan.mfu:.1%}"),) if plan.mfu is not None else ()),
        ("micro-batches per step", str(plan.microbatches)),
        ("recomputed in the backward", _recomputed(plan)),
        ("parameter storage", _storage(plan)),
        ("optimizer", plan.optimizer),
        ("solver", f"{solver.status}, gap {solver.gap:.2%}, {solver.wall_time_s:.2f} s, "
                   f"{solver.decisions} decisions ({solver.tied} tied)"),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def _recomputed(plan: Plan) -> str:
    ops = [n for n in plan.nodes if n.recompute]
    if not ops:
        return "nothing"
    kinds = sorted({n.op.removeprefix("aten.").split(".")[0] for n in ops})
    return f"{len(ops)} ops ({', '.join(kinds)})"


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


def _comm_table(plan: Plan) -> Table:
    table = Table(title="Bytes moved per device", title_justify="left")
    for name in ("collective", "axis", "direction", "bytes"):
        table.add_column(name, justify="right" if name == "bytes" else "left")
    for (kind, axis, direction), nbytes in plan.comm_bytes().items():
        table.add_row(kind, axis, direction, _size(nbytes))
    if not plan.comm_bytes():
        table.add_row("none", "", "", "0 B")
    return table


_SHORT = {"all_reduce": "AR", "all_gather": "AG", "reduce_scatter": "RS", "all_to_all": "A2A"}


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
    table = Table(title="Compared with hand strategies (per device, one training step)",
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
                    "reduce-scatter, A2A all-to-all. Hand strategies are the cheapest plans "
                    "within their roles, solved with no memory limit."]


def render_summary(plan: Plan, *, width: int = 120) -> str:
    """The plan as plain-text tables (no colour codes), `width` columns wide; with the
    comparison table "Compared with hand strategies" when the plan carries them."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, no_color=True, color_system=None)
    for table in (_group_table(plan), _totals_table(plan), _comm_table(plan)):
        console.print(table)
    if plan.hand_strategies:
        console.print(_hand_table(plan))
        for note in _hand_notes(plan):
            console.print(note)
    for warning in plan.warnings:
        console.print(f"warning: {warning}")
    return buffer.getvalue()
