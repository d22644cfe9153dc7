"""Modelled cost per layer: compute and communication seconds of one training step."""

from __future__ import annotations

from autopar.present.report.bars import Bar, Segment, bar_chart
from autopar.present.report.layers import group_layers, layer_nodes
from autopar.present.report.palette import swatch
from autopar.present.report.units import ms, size
from autopar.values.plan import Plan

COMPUTE, COMM = "#5dade2", "#e67e22"


def cost_section(plan: Plan) -> str:
    """One stacked bar per layer (compute then comm), in layer order."""
    bars = []
    for layer in group_layers(plan):
        nodes = layer_nodes(plan, layer)
        compute = sum(n.compute_s for n in nodes)
        comm = sum(n.comm_s for n in nodes)
        memory = sum(n.memory_bytes for n in nodes)
        bars.append(Bar(layer.name, (Segment(compute, COMPUTE, f"compute {ms(compute)}"),
                                     Segment(comm, COMM, f"comm {ms(comm)}")),
                        f"{ms(compute + comm)} ({ms(comm)} comm) · {size(memory)}"))
    legend = swatch(COMPUTE, "compute") + swatch(COMM, "communication")
    passes = "forward + backward" if plan.training else "forward"
    return (f'<section id="cost"><h2>Cost per layer <span class="dim">{passes}, '
            f'per device</span></h2><div class="legend">{legend}</div>'
            f'{bar_chart(bars, css_id="cost-chart")}</section>')
