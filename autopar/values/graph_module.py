"""`graph_module`: a GraphModule whose Python code is generated only when it is first run or
read.

`fx.GraphModule(root, graph)` generates and compiles the graph's code at once (about 50 ms
for a 126-layer Llama's step), and again at every `recompile()`. Planning builds many
graphs it never runs (the annotated copy, stamped blocks, stages, micro-batches, folded
depths): torch's lazy GraphModule defers that work to the first call of `forward` or read
of `.code`, so a plan pays for code only where a program runs.
"""

from __future__ import annotations

import torch.fx as fx
from torch.fx._lazy_graph_module import _LazyGraphModule


def graph_module(root: fx.GraphModule | dict, graph: fx.Graph,
                 class_name: str = "GraphModule") -> fx.GraphModule:
    """`fx.GraphModule(root, graph, class_name)`, its code generated on first use."""
    return _LazyGraphModule(root, graph, class_name=class_name)
