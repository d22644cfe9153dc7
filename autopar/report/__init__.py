"""Self-contained HTML reports and graphviz drawings of plans."""
