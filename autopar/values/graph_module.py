"""`graph_module`: a GraphModule whose Python code is generated only when it is first run or
read; `argument_nodes`: the nodes a node reads, in order.

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


def argument_nodes(node: fx.Node) -> list[fx.Node]:
    """The nodes among `node`'s arguments and keyword arguments, in order, each as often
    as it appears: the tensor leaves of `(node.args, node.kwargs)`, gathered by fx's own
    walk of them (a tenth of the time of a pytree flattening, per op of every graph
    planned)."""
    found: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), found.append)
    return found
