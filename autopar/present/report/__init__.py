"""Self-contained HTML reports and graphviz drawings of plans.

- `write_report(plan, path, measured=None)`: one HTML file, no network needed to view it
  (`page.py`); with a measurement (`autopar.measure`), predicted against measured.
- `render_html(plan, measured=None)`: the same page as a string.
- `to_dot(plan)`: graphviz DOT text, nodes clustered by layer (`dot.py`).

One module per part of the page: `overview`, `graph` (the layered node drawing), `memory`,
`cost`, `measured` (given a measurement), `comm`, `hand`; `bars` draws the charts they
share; `page.html`, `style.css` and `script.js` are inlined into every page.
"""

from autopar.errors import ReportError
from autopar.present.report.dot import to_dot
from autopar.present.report.page import render_html, write_report

__all__ = ["ReportError", "render_html", "to_dot", "write_report"]
