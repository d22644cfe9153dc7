"""The model's graph as inline SVG: one collapsible lane per layer, nodes in graph order.

The plan records no data edges, so the layout is a lane per layer: parameters and inputs on
the first row, then the layer's operators left to right in graph order, wrapping after
`COLUMNS`. Each node is a box with one colour band per mesh axis (its output placement on
that axis). The edges drawn are the ones the plan does know: a transfer names the tensor it
moves, i.e. the producing node, so every producer -> consumer pair that communicates (within
a lane) gets a dashed arc. Every node is a `<g class="node" data-i=INDEX>` for the page's
script, which shows its details on hover and click.
"""

from __future__ import annotations

from autopar.present.report.layers import Layer, group_layers, layer_nodes
from autopar.present.report.palette import placement_colour, placement_order, split_axes, swatch
from autopar.present.report.units import esc, ms, num, size
from autopar.values.plan import NodePlan, Plan

COLUMNS = 8
WIDTH, HEIGHT = 110.0, 54.0
GAP_X, GAP_Y = 12.0, 26.0
MARGIN = 10.0
BANDS = 22.0  # total height of the per-axis colour bands at the bottom of a box
# Lanes stay open up to this many nodes in all; bigger models start with lanes folded.
OPEN_LIMIT = 400
_TOOLBAR = ('<div class="toolbar"><button type="button" id="expand-all">expand all</button>'
            '<button type="button" id="collapse-all">collapse all</button></div>')


def _label(node: NodePlan) -> str:
    text = node.op.removeprefix("aten.").split(".")[0] if node.role == "op" else node.role
    return text if len(text) <= 15 else text[:14] + "…"


def _subtitle(node: NodePlan, layer: str) -> str:
    """Where in the layer: the submodule of an operator, `qkv.weight` for a parameter."""
    where = node.module.removeprefix(layer).lstrip(".")
    if node.role != "op":
        # Parameter names are the module path with "_" for "." then the attribute name.
        flat = node.module.replace(".", "_")
        tail = node.name.split(flat, 1)[1].lstrip("_") if flat and flat in node.name else ""
        where = f"{where}.{tail}".strip(".") if tail else node.name
    text = where or node.name
    return text if len(text) <= 18 else "…" + text[-17:]


def _positions(plan: Plan, layer: Layer) -> dict[int, tuple[float, float]]:
    """Top-left corner of each node's box: placeholders on row 0, operators from row 1."""
    nodes = layer_nodes(plan, layer)
    inputs = [i for i, n in zip(layer.indices, nodes) if n.role != "op"]
    ops = [i for i, n in zip(layer.indices, nodes) if n.role == "op"]
    rows = [inputs[k:k + COLUMNS] for k in range(0, len(inputs), COLUMNS)]
    rows += [ops[k:k + COLUMNS] for k in range(0, len(ops), COLUMNS)]
    return {index: (MARGIN + col * (WIDTH + GAP_X), MARGIN + row * (HEIGHT + GAP_Y))
            for row, members in enumerate(rows) for col, index in enumerate(members)}


def _box(index: int, node: NodePlan, layer: str, x: float, y: float) -> str:
    axes = split_axes(node.output)
    band = BANDS / max(len(axes), 1)
    top = HEIGHT - BANDS
    bands = "".join(
        f'<rect class="band" x="0" y="{num(top + k * band)}" width="{num(WIDTH)}" '
        f'height="{num(band)}" fill="{placement_colour(p)}"/>' for k, p in enumerate(axes))
    texts = "".join(
        f'<text class="band-text{" light" if p == "R" else ""}" x="{num(WIDTH - 4)}" '
        f'y="{num(top + (k + 0.5) * band)}">{esc(p)}</text>' for k, p in enumerate(axes))
    comm = (f'<circle class="comm-badge" cx="{num(WIDTH - 8)}" cy="9" r="6"/>'
            f'<text class="badge-text" x="{num(WIDTH - 8)}" y="9">{len(node.transfers)}</text>'
            if node.transfers else "")
    return (f'<g class="node role-{esc(node.role)}" data-i="{index}" tabindex="0" '
            f'transform="translate({num(x)},{num(y)})">'
            f'<rect class="box" width="{num(WIDTH)}" height="{num(HEIGHT)}" rx="4"/>'
            f'{bands}{texts}'
            f'<text class="op" x="6" y="14">{esc(_label(node))}</text>'
            f'<text class="sub" x="6" y="27">{esc(_subtitle(node, layer))}</text>'
            f'{comm}<rect class="frame" width="{num(WIDTH)}" height="{num(HEIGHT)}" rx="4"/>'
            f'</g>')


def _edges(plan: Plan, layer: Layer, where: dict[int, tuple[float, float]]) -> str:
    index_of = {plan.nodes[i].name: i for i in layer.indices}
    pairs: dict[tuple[int, int], set[str]] = {}
    for consumer in layer.indices:
        for transfer in plan.nodes[consumer].transfers:
            producer = index_of.get(transfer.tensor)
            if producer is not None and producer != consumer:
                pairs.setdefault((producer, consumer), set()).add(transfer.kind)
    paths = []
    for (producer, consumer), kinds in pairs.items():
        (x0, y0), (x1, y1) = where[producer], where[consumer]
        sx, sy, ex, ey = x0 + WIDTH / 2, y0 + HEIGHT, x1 + WIDTH / 2, y1
        if y1 <= y0:  # same row (or wrapped back): arc below the row instead
            sy, ey = y0 + HEIGHT, y1 + HEIGHT
            bend = max(sy, ey) + GAP_Y * 0.8
            path = f"M{num(sx)},{num(sy)} C{num(sx)},{num(bend)} {num(ex)},{num(bend)} " \
                   f"{num(ex)},{num(ey)}"
        else:
            mid = (sy + ey) / 2
            path = f"M{num(sx)},{num(sy)} C{num(sx)},{num(mid)} {num(ex)},{num(mid)} " \
                   f"{num(ex)},{num(ey)}"
        # Gradient reductions of parameters are drawn only for the selected node: there
        # is one per replicated parameter, and they would hide the activation reshards.
        kind = "edge param" if plan.nodes[producer].role != "op" else "edge"
        paths.append(f'<path class="{kind}" data-from="{producer}" data-to="{consumer}" '
                     f'd="{path}"><title>{esc(", ".join(sorted(kinds)))}</title></path>')
    return "".join(paths)


def _lane(plan: Plan, layer: Layer, open_: bool) -> str:
    where = _positions(plan, layer)
    rows = 1 + max(round((y - MARGIN) / (HEIGHT + GAP_Y)) for _, y in where.values())
    columns = min(COLUMNS, len(layer.indices))
    width = 2 * MARGIN + columns * WIDTH + (columns - 1) * GAP_X
    height = 2 * MARGIN + rows * HEIGHT + (rows - 1) * GAP_Y + GAP_Y * 0.8
    nodes = layer_nodes(plan, layer)
    boxes = "".join(_box(i, n, layer.name, *where[i]) for i, n in zip(layer.indices, nodes))
    compute = sum(n.compute_s for n in nodes)
    comm = sum(n.comm_s for n in nodes)
    memory = sum(n.memory_bytes for n in nodes)
    stages = sorted({n.stage for n in nodes}) if plan.pipeline is not None else []
    where_run = (f" · stage{'s' if len(stages) > 1 else ''} "
                 f"{', '.join(map(str, stages))}") if stages else ""
    summary = (f'<b>{esc(layer.name)}</b> <span class="dim">{len(nodes)} nodes · compute '
               f'{ms(compute)} · comm {ms(comm)} · memory {size(memory)}{where_run}</span>')
    stage_attribute = f' data-stages="{" ".join(map(str, stages))}"' if stages else ""
    return (f'<details class="lane" data-layer="{esc(layer.name)}"{stage_attribute}'
            f'{" open" if open_ else ""}>'
            f'<summary>{summary}</summary>'
            f'<svg class="lane-svg" width="{num(width)}" height="{num(height)}" '
            f'viewBox="0 0 {num(width)} {num(height)}" role="img" '
            f'aria-label="{esc(layer.name)}">{_edges(plan, layer, where)}{boxes}</svg>'
            f'</details>')


def legend(plan: Plan) -> str:
    """Swatches of every placement the plan uses, and which band is which mesh axis."""
    used = {p for n in plan.nodes for text in (n.output, *n.inputs) for p in split_axes(text)}
    used |= {"R"}
    swatches = "".join(swatch(placement_colour(p), p) for p in sorted(used, key=placement_order))
    axes = ", then ".join(f'<span class="axis-tag">{esc(a)} ({plan.mesh.shape[k]} devices)'
                          f'</span>' for k, a in enumerate(plan.mesh.axis_names))
    return (f'<div class="legend" id="legend"><div>{swatches}</div>'
            f'<div class="dim">colour bands of a node, top to bottom, are its output placement '
            f'on each mesh axis: {axes} · R replicated, S(d) sharded on tensor dim d, '
            f'P partial sum · a red badge counts the node\'s collectives; dashed arcs join a '
            f'producer to a consumer that reshards it (a parameter\'s, when selected)</div></div>')


def graph_section(plan: Plan) -> str:
    """The graph section: the legend, then one lane per layer."""
    layers = group_layers(plan)
    open_all = len(plan.nodes) <= OPEN_LIMIT
    lanes = "".join(_lane(plan, layer, open_all or k < 3) for k, layer in enumerate(layers))
    return (f'<section id="graph"><h2>Graph <span class="dim">{len(plan.nodes)} nodes in '
            f'{len(layers)} layers · hover or click a node for its details</span></h2>'
            f'{legend(plan)}{_TOOLBAR}<div class="lanes">{lanes}</div></section>')
