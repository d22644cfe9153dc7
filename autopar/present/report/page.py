"""The report as one self-contained HTML page: sections rendered in Python, with the CSS,
script and page skeleton read from this package's data files and inlined, so the file needs
no network and no other file when viewed."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from autopar.errors import ReportError
from autopar.present.report.comm import comm_section
from autopar.present.report.cost import cost_section
from autopar.present.report.graph import graph_section
from autopar.present.report.hand import hand_section
from autopar.present.report.layers import group_layers
from autopar.present.report.measured import measured_section
from autopar.present.report.memory import memory_section
from autopar.present.report.overview import overview_section
from autopar.present.report.palette import placement_colour, split_axes
from autopar.present.report.pipeline import pipeline_section
from autopar.present.report.units import esc
from autopar.values.compression import compression_named
from autopar.values.measurement import Measurement
from autopar.values.plan import Plan


def _asset(name: str) -> str:
    return resources.files("autopar.present.report").joinpath(name).read_text(encoding="utf-8")


def _compression(name: str) -> str:
    """A node's compression as its panel shows it: the name and its expected error."""
    return f"{name}: {compression_named(name).error}" if name else ""


def _data(plan: Plan) -> str:
    """The nodes as JSON for the page's script, safe inside a <script> element."""
    layer = {i: layer.name for layer in group_layers(plan) for i in layer.indices}
    placements = {p for n in plan.nodes for t in (n.output, *n.inputs) for p in split_axes(t)}
    data = {
        "axes": list(plan.mesh.axis_names),
        "colours": {p: placement_colour(p) for p in sorted(placements)},
        "index": {n.name: i for i, n in enumerate(plan.nodes)},
        "nodes": [{"name": n.name, "op": n.op, "role": n.role, "module": n.module,
                   "layer": layer[i], "inputs": list(n.inputs), "output": n.output,
                   "pieces": n.pieces, "compression": _compression(n.compression),
                   "compute_s": n.compute_s, "comm_s": n.comm_s,
                   "memory_bytes": n.memory_bytes, "formula": n.formula,
                   "transfers": [{"kind": t.kind, "axis": t.axis, "nbytes": t.nbytes,
                                  "backward": t.backward, "tensor": t.tensor,
                                  "seconds": t.seconds} for t in n.transfers]}
                  for i, n in enumerate(plan.nodes)],
    }
    # "<" escaped so that no "</script>" inside a name can end the element early.
    return json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")


def render_html(plan: Plan, *, measured: Measurement | Sequence[Measurement] | None = None
                ) -> str:
    """The whole report page as a string (see `write_report`)."""
    sections = [overview_section, pipeline_section, graph_section, memory_section,
                cost_section, comm_section, hand_section]
    if measured is not None:
        sections.insert(5, lambda plan: measured_section(plan, measured))
    body = "".join(section(plan) for section in sections)
    page = _asset("page.html")
    # Substituted last-to-first so that no inserted text is scanned for the later markers.
    for marker, value in (("{{data}}", _data(plan)), ("{{script}}", _asset("script.js")),
                          ("{{body}}", body), ("{{style}}", _asset("style.css")),
                          ("{{title}}", esc(f"autopar plan: {plan.model}"))):
        page = page.replace(marker, value, 1)
    return page


def write_report(plan: Plan, path: str | Path, *,
                 measured: Measurement | Sequence[Measurement] | None = None) -> Path:
    """Write the plan's report to `path` as one self-contained HTML file (inline CSS, script
    and SVG; nothing fetched when viewed) and return the path. The page shows the graph by
    layer coloured by placement with per-node details on hover and click, memory per device
    against capacity, communication by collective, axis and layer, cost per layer, the
    plan against the hand strategies when the plan carries them, and with `measured`
    (`autopar.measure`'s result: one rank's, or a list of ranks') the predicted step, op
    groups and peak memory against the measured ones."""
    target = Path(path)
    page = render_html(plan, measured=measured)  # bad measurements fail before any write
    try:
        target.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"cannot write the report to {target}: {exc.strerror or exc}",
                          expected="a writable file path, e.g. plan.html", got=str(target),
                          fix="choose a path in an existing, writable directory") from exc
    return target
