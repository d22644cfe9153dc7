"""write_back: a forward-only graph's buffer updates as in-place copies where they are made.

torch.export returns a buffer's new value as a graph output (`capture`'s
`autopar_mutated_buffers`), and a training graph keeps it so: the runtime swaps the new
tensor in after the call, since the backward may still read the old one. A forward-only
graph has no backward, and its largest buffers are the ones serving updates: a static KV
cache, whose every layer's update (`index_copy` of the new positions) is a new tensor of
the layer's whole cache. Returned as outputs, every layer's new cache would be alive at
once, beside the old, and whole on every rank (outputs are replicated).

So each update of a buffer the graph reads becomes `aten.copy_(buffer, new_value)`,
placed right after the later of the new value's producer and the buffer's last reader,
and leaves the outputs (a buffer the graph only writes, such as a position counter set
from the inputs, has no input to write into and stays an output). The copy writes into
the buffer's piece on the rank that holds it: the planner reads an in-place op's first
argument where it is stored (`EdgeRef.consumer_writes`), so the update is computed at the
buffer's placement and nothing is gathered; one layer's new cache is alive at a time, until
its copy. `written_buffers` finds the buffers written so; `autopar_mutated_buffers` keeps
the others.

Mutates and returns `gm` (called by `capture` on each graph it traces, before repeated
blocks are stamped from it: a block's update is then an op of the block like any other).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from autopar.values.specs import MODULE, NAMES, ROLE

aten = torch.ops.aten


def write_back(gm: fx.GraphModule, mutated_key: str) -> fx.GraphModule:
    """`gm` with the buffer updates listed in `gm.meta[mutated_key]` written in place."""
    names = tuple(gm.meta.get(mutated_key, ()))
    if not names:
        return gm
    graph = gm.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    values = list(output.args[0])
    buffers = {n.meta[NAMES][0]: n for n in graph.nodes
               if n.op == "placeholder" and n.meta.get(ROLE) == "buffer"}
    order = {node: i for i, node in enumerate(graph.nodes)}
    kept = []
    for name, new in zip(names, values[:len(names)]):
        buffer = buffers.get(name)
        if buffer is None:  # never read, so not an input: it stays an output
            kept.append((name, new))
            continue
        if new is buffer:
            continue
        after = max((new, *(u for u in buffer.users if u is not output)), key=order.__getitem__)
        with graph.inserting_after(after):
            copy = graph.call_function(aten.copy_.default, (buffer, new))
        copy.meta.update({"val": new.meta.get("val"), ROLE: "op",
                          MODULE: new.meta.get(MODULE, "")})
        if "nn_module_stack" in new.meta:
            copy.meta["nn_module_stack"] = new.meta["nn_module_stack"]
    output.args = (tuple(value for _, value in kept) + tuple(values[len(names):]),)
    gm.meta[mutated_key] = tuple(name for name, _ in kept)
    graph.lint()
    gm.recompile()
    return gm


def written_buffers(gm: fx.GraphModule) -> list[fx.Node]:
    """The buffer placeholders of `gm` an op writes in place (its first argument)."""
    return [n for n in gm.graph.nodes if n.op == "placeholder" and n.meta.get(ROLE) == "buffer"
            and any(writes_first_argument(u) and u.args[0] is n for u in n.users)]


def writes_first_argument(node: fx.Node) -> bool:
    """Whether `node` writes its result into its first argument (an in-place op)."""
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    if schema is None or not schema.arguments:
        return False
    alias = schema.arguments[0].alias_info
    return bool(alias is not None and alias.is_write)
