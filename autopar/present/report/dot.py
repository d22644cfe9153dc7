"""The plan as graphviz DOT text: one cluster per layer, each node an HTML-like label whose
cells are coloured by its output placement on each mesh axis. Edges are the producer ->
consumer pairs the plan's transfers name, labelled with their collectives. Rendering needs
the graphviz `dot` program; producing the text does not."""

from __future__ import annotations

import json

from autopar.present.report.layers import group_layers, layer_nodes
from autopar.present.report.palette import placement_colour, split_axes
from autopar.present.report.units import esc
from autopar.values.plan import Plan


def _quote(text: str) -> str:
    # JSON string syntax is a valid DOT quoted string for everything a node name holds.
    return json.dumps(text)


def _label(op: str, name: str, output: str) -> str:
    cells = "".join(f'<td bgcolor="{placement_colour(p)}">{esc(p)}</td>'
                    for p in split_axes(output))
    span = max(len(split_axes(output)), 1)
    return (f'<<table border="0" cellborder="1" cellspacing="0" cellpadding="3">'
            f'<tr><td colspan="{span}"><b>{esc(op)}</b><br/>'
            f'<font point-size="9">{esc(name)}</font></td></tr><tr>{cells}</tr></table>>')


def to_dot(plan: Plan) -> str:
    """DOT source of the plan's graph (see the module docstring)."""
    lines = [f"digraph {_quote(plan.model)} {{",
             "  rankdir=TB; node [shape=plaintext, fontname=Helvetica, fontsize=10];",
             f"  label={_quote(f'{plan.model} on {plan.mesh.describe()}')}; labelloc=t;"]
    for k, layer in enumerate(group_layers(plan)):
        lines.append(f"  subgraph cluster_{k} {{")
        lines.append(f"    label={_quote(layer.name)}; style=rounded; color=gray60;")
        for node in layer_nodes(plan, layer):
            op = node.op.removeprefix("aten.") if node.role == "op" else node.role
            lines.append(f"    {_quote(node.name)} [label={_label(op, node.name, node.output)}];")
        lines.append("  }")
    names = {n.name for n in plan.nodes}
    edges: dict[tuple[str, str], set[str]] = {}
    for node in plan.nodes:
        for t in node.transfers:
            if t.tensor in names and t.tensor != node.name:
                edges.setdefault((t.tensor, node.name), set()).add(f"{t.kind}@{t.axis}")
    for (source, target), kinds in edges.items():
        lines.append(f"  {_quote(source)} -> {_quote(target)} "
                     f"[label={_quote(', '.join(sorted(kinds)))}, fontsize=8, color=firebrick];")
    lines.append("}")
    return "\n".join(lines) + "\n"
