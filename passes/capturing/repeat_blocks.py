"""repeat_blocks: capture a model with many identical blocks by tracing four of them.

torch.export takes time linear in the ops it traces (about a quarter second per Llama-70B
layer on one core), so an 80-layer model costs ~20 s per capture and a pipeline search,
which captures the model once per micro-batch size, minutes. The blocks of a model's main
`nn.ModuleList` are usually identical (same classes, parameter shapes and attributes),
and so are their traced ops. This pass traces the model with the list cut to the blocks
`0, 1, 2` and `L-1` (their real names kept), checks that blocks 1, 2 and L-1 traced alike,
and *stamps* the blocks 3..L-2 from block 2, giving the graph the full trace gives:

- **names**: export numbers the nodes of each base name in graph order (`linear`,
  `linear_1`, ...; gaps where dead nodes were dropped). A block uses the same numbers of
  each base every time, so block i's node is block 2's with its number advanced by
  `(i - 2) * delta(base)`, and the nodes after the last block by `(L - 4) * delta`, where
  `delta` is measured between blocks 1 and 2 and checked between blocks 2 and L-1.
  torch's own counters in the meta (`torch_fn`'s name, `seq_nr`) advance the same way,
  where a block shows how far (`torch_fn` also counts calls that leave no node, as
  `.contiguous()` of a contiguous tensor: their numbers after the blocks may differ from a
  full trace's; no pass reads them).
  Placeholders of block i's state are named from its qualified names, as export does.
- **edges**: a stamped block's node reads the same relative node of its own block, of
  the block before it (the residual stream), the model's nodes before every block
  (masks, rotary tables) or shared placeholders (user inputs, weights outside the list),
  exactly as block 2 does; any other reference makes the pass give up.
- **meta**: block 2's, with the block's path and names rewritten (`nn_module_stack`,
  `autopar_module`, `autopar_names`, the parameter's `desc`); fake tensors are shared
  with block 2's (same shapes, strides and dtypes); `from_node` (provenance holding
  graph object ids, which differ from trace to trace anyway) is block 2's.

Blocks 1..L-1 are *identical* (block 0 is traced, and may differ, as T5's first block
that holds the position bias) when every submodule has the same class, training flag, parameter
and buffer shapes, dtypes and `requires_grad`, and the same plain attributes, except an
integer attribute that takes a different value in every block (it numbers the blocks, as
transformers' `layer_idx`, used only to index caches); blocks sharing a parameter are
not. A forward whose graph depends on such a number beyond what blocks 0, 1, 2 and L-1
show (every fifth block different, say) is the case this check can't see:
`capture(..., repeat_blocks=False)` traces every block. Ops after the blocks that read
every block (a loss over each block's auxiliary loss) make the pass give up.

`capture_repeated(model, inputs, trace)` returns the stamped GraphModule, or None when the
model has no such list (fewer than `MIN_BLOCKS` identical blocks), the cut model does not
trace, or the traced blocks are not alike: the caller then traces the whole model.
`trace(model, inputs)` is capture's own tracing (`capture.capture` without this pass).
"""

from __future__ import annotations

import copy
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import fx, nn

from autopar.values.graph_module import graph_module
from autopar.values.specs import MODULE, NAMES, ROLE

# Fewer blocks than this are traced whole: the pass traces four of them anyway.
MIN_BLOCKS = 6
_SUFFIX = re.compile(r"^(?P<base>.*?)(?:_(?P<num>\d+))?$")
_PLAIN = (bool, int, float, str, type(None), torch.dtype)


@dataclass(frozen=True)
class _Blocks:
    """The main list: its qualified path, its blocks' count."""

    path: str
    count: int

    def prefix(self, index: int) -> str:
        return f"{self.path}.{index}"


def capture_repeated(model: nn.Module, example_inputs: tuple,
                     trace: Callable[[nn.Module, tuple], fx.GraphModule], *,
                     mutated: str) -> fx.GraphModule | None:
    """`model` captured with its repeated blocks stamped (module docstring), or None;
    `mutated` is the graph meta key listing the buffers the forward updates."""
    blocks = _identical_blocks(model)
    if blocks is None:
        return None
    kept = (0, 1, 2, blocks.count - 1)
    try:
        with _cut(model, blocks, kept):
            traced = trace(model, example_inputs)
    except Exception:  # noqa: BLE001 - a forward that indexes every block: trace it whole
        return None
    if any(name.startswith(blocks.path + ".") for name in traced.meta.get(mutated, ())):
        return None  # each block's new buffer values would be outputs of the full graph
    return _Stamp(traced, blocks).graph_module()


def _identical_blocks(model: nn.Module) -> _Blocks | None:
    """The ModuleList with the most children, when it has `MIN_BLOCKS` or more identical
    ones (module docstring)."""
    lists = [(name, module) for name, module in model.named_modules()
             if isinstance(module, nn.ModuleList) and len(module) >= MIN_BLOCKS]
    if not lists:
        return None
    path, blocks = max(lists, key=lambda item: len(item[1]))
    children = list(blocks)
    if list(blocks._modules) != [str(i) for i in range(len(children))]:
        return None
    # Block 0 is traced as it is: it may differ (T5's first block holds the position bias).
    signatures = [_signature(child) for child in children[1:]]
    values = [dict(s) for s in signatures]
    numbering = {key for key in values[0]
                 if all(type(v.get(key)) is int for v in values)
                 and len({v.get(key) for v in values}) == len(values)}
    if len({tuple((k, v) for k, v in s if k not in numbering) for s in signatures}) != 1:
        return None
    owners = [{id(p) for p in child.parameters()} for child in children]
    if sum(map(len, owners)) != len(set().union(*owners)):
        return None  # blocks sharing weights are one tensor under several names
    return _Blocks(path, len(children))


def _signature(block: nn.Module) -> tuple[tuple[str, object], ...]:
    """What decides a block's traced ops, as (key, value) pairs (module docstring)."""
    items: list[tuple[str, object]] = []
    for name, module in block.named_modules():
        items.append((f"{name}:class", type(module).__qualname__))
        items.append((f"{name}:training", module.training))
        for kind, tensors in (("p", module._parameters), ("b", module._buffers)):
            for key, tensor in tensors.items():
                items.append((f"{name}:{kind}:{key}", None if tensor is None else (
                    tuple(tensor.shape), tensor.dtype, tensor.requires_grad)))
        for key, value in vars(module).items():
            if not key.startswith("_") and isinstance(value, _PLAIN):
                items.append((f"{name}:{key}", value))
    return tuple(items)


@contextmanager
def _cut(model: nn.Module, blocks: _Blocks, kept: tuple[int, ...]) -> Iterator[None]:
    """The main list holding only the blocks `kept`, under their own keys (so their
    parameters keep their qualified names); restored afterwards."""
    holder = model.get_submodule(blocks.path)
    saved = holder._modules
    holder._modules = OrderedDict((str(i), saved[str(i)]) for i in kept)
    try:
        yield
    finally:
        holder._modules = saved


def _split_name(name: str) -> tuple[str, int]:
    match = _SUFFIX.match(name)
    assert match is not None
    return match["base"], int(match["num"] or 0)


def _numbered(base: str, num: int) -> str:
    return f"{base}_{num}" if num else base


class _GiveUp(Exception):
    """The traced blocks are not alike: trace the whole model."""


class _Stamp:
    """Builds the full graph from the graph traced with blocks 0, 1, 2, L-1."""

    def __init__(self, traced: fx.GraphModule, blocks: _Blocks) -> None:
        self.traced, self.blocks = traced, blocks
        self.last = blocks.count - 1
        self.kept = (0, 1, 2, self.last)
        nodes = list(traced.graph.nodes)
        self.block_of = {n: self._block_of(n) for n in nodes}
        ops = [n for n in nodes if n.op != "placeholder"]
        starts = [next((i for i, n in enumerate(ops) if self.block_of[n] == k), None)
                  for k in self.kept]
        self.valid = None not in starts and starts == sorted(starts)
        if not self.valid:
            return
        self.prefix_ops = ops[:starts[0]]
        self.segments = [ops[starts[j]:starts[j + 1]] for j in range(3)]
        self.tail = ops[starts[3]:]  # block L-1, then the ops after every block

    def _block_of(self, node: fx.Node) -> int | None:
        """The block a node belongs to: a state placeholder by its names, an op by the
        module that made it; None for the rest."""
        if node.op == "placeholder":
            names = node.meta.get(NAMES, ())
            found = {self._index_in(name + ".") for name in names} - {None}
            return found.pop() if len(found) == 1 and all(
                self._index_in(n + ".") is not None for n in names) else None
        return self._index_in(node.meta.get(MODULE, "") + ".")

    def _index_in(self, dotted: str) -> int | None:
        head = self.blocks.path + "."
        if not dotted.startswith(head):
            return None
        index = dotted[len(head):].split(".", 1)[0]
        return int(index) if index.isdigit() else None

    # -- checks ---------------------------------------------------------------------------

    def _deltas(self, earlier: list[fx.Node], later: list[fx.Node], a: int, b: int
                ) -> dict[tuple[str, str], int]:
        """How far each counter advances from block `a`'s segment to block `b`'s: each base
        name's number (`("name", base)`), torch's function counter (`("torch_fn", base)`)
        and autograd's `("seq_nr", "")`; `_GiveUp` unless `later` starts with the same ops
        as `earlier` on corresponding inputs, each counter advancing by one amount."""
        if len(later) < len(earlier):
            raise _GiveUp
        position = {n: i for i, n in enumerate(earlier)}
        later_position = {n: i for i, n in enumerate(later)}
        deltas: dict[tuple[str, str], int] = {}

        def advance(key: tuple[str, str], old: int, new: int) -> None:
            if deltas.setdefault(key, new - old) != new - old:
                raise _GiveUp

        for old, new in zip(earlier, later):
            if (old.op, old.target) != (new.op, new.target):
                raise _GiveUp
            (base, num), (new_base, new_num) = _split_name(old.name), _split_name(new.name)
            if base != new_base:
                raise _GiveUp
            advance(("name", base), num, new_num)
            if "torch_fn" in old.meta and "torch_fn" in new.meta:
                (base, num), (new_base, new_num) = (_split_name(old.meta["torch_fn"][0]),
                                                    _split_name(new.meta["torch_fn"][0]))
                if base != new_base:
                    raise _GiveUp
                advance(("torch_fn", base), num, new_num)
            if "seq_nr" in old.meta and "seq_nr" in new.meta:
                advance(("seq_nr", ""), old.meta["seq_nr"], new.meta["seq_nr"])
            if not self._same_inputs(old, new, a, b, position, later_position):
                raise _GiveUp
        return deltas

    def _same_inputs(self, old: fx.Node, new: fx.Node, a: int, b: int,
                     position: dict, later_position: dict) -> bool:
        """Whether `new` (block `b`) reads what `old` (block `a`) reads, moved one block:
        the same relative node of its own segment or of the segment before, its own
        block's placeholder of the same name, or the very same node."""
        flat_old, spec_old = torch.utils._pytree.tree_flatten((old.args, old.kwargs))
        flat_new, spec_new = torch.utils._pytree.tree_flatten((new.args, new.kwargs))
        if spec_old != spec_new:
            return False
        for x, y in zip(flat_old, flat_new):
            if not isinstance(x, fx.Node) or not isinstance(y, fx.Node):
                if isinstance(x, fx.Node) or isinstance(y, fx.Node) or x != y:
                    return False
            elif x in position:
                if later_position.get(y) != position[x]:
                    return False
            elif x.op == "placeholder" and self.block_of[x] == a:
                if y.op != "placeholder" or self._renamed(x, a, b) != y.name:
                    return False
            elif x is not y and not self._previous(x, y):
                return False
        return True

    def _previous(self, x: fx.Node, y: fx.Node) -> bool:
        """Whether `x` and `y` are the same node of consecutive kept segments, counted from
        their ends (a block hands the next its last values; block 0 may be longer)."""
        for j in range(2):
            earlier, later = self.segments[j], self.segments[j + 1]
            if x in earlier and y in later:
                return earlier.index(x) - len(earlier) == later.index(y) - len(later)
        return False

    def _renamed(self, node: fx.Node, a: int, b: int) -> str:
        return node.name.replace(self._mangled(a), self._mangled(b), 1)

    def _mangled(self, index: int) -> str:
        return f"{self.blocks.prefix(index)}.".replace(".", "_")

    # -- the full graph -------------------------------------------------------------------

    def graph_module(self) -> fx.GraphModule | None:
        if not self.valid:
            return None
        try:
            deltas = self._deltas(self.segments[1], self.segments[2], 1, 2)
            if self._deltas(self.segments[2], self.tail, 2, self.last) != deltas:
                raise _GiveUp
            graph = self._build(deltas)
        except _GiveUp:
            return None
        gm = graph_module(self.traced, graph)
        gm.meta.update(self.traced.meta)
        return gm

    def _build(self, deltas: dict[tuple[str, str], int]) -> fx.Graph:
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        template, before_template = self.segments[2], self.segments[1]
        stamped = {index: {} for index in range(3, self.last)}  # block 2's node -> block's
        placeholders = [n for n in self.traced.graph.nodes if n.op == "placeholder"]
        # The stamped blocks' parameters follow block 2's, their buffers block 2's buffers:
        # export's order, every parameter before every buffer.
        runs: dict[object, list[fx.Node]] = {}
        for p in placeholders:
            if self.block_of[p] == 2:
                runs.setdefault(p.meta.get(ROLE), []).append(p)
        ends = {run[-1]: run for run in runs.values()}
        for node in placeholders:
            env[node] = self._copy(graph, node, node.name, None, deltas,
                                   shift=self.last - 3 if self._counted_late(node) else 0)
            for index, mapping in stamped.items() if node in ends else ():
                for p in ends[node]:
                    mapping[p] = self._copy(graph, p, self._renamed(p, 2, index), None,
                                            deltas, block=index)
        for node in self.prefix_ops + self.segments[0] + before_template + template:
            env[node] = self._copy(graph, node, node.name, env.__getitem__, deltas)
        previous = {n: env[n] for n in template}
        for index, mapping in stamped.items():
            def read(n: fx.Node, mapping=mapping, previous=previous) -> fx.Node:
                if n in mapping:
                    return mapping[n]
                if n in before_template:
                    return previous[template[before_template.index(n)]]
                return env[n]

            for node in template:
                mapping[node] = self._copy(graph, node, node.name, read, deltas, block=index)
            previous = {n: mapping[n] for n in template}
        checked = set(self.tail[:len(template)])
        earlier = set(self.segments[0]) | set(before_template)

        def read_tail(n: fx.Node, node: fx.Node) -> fx.Node:
            if n in previous:  # block L-1 reads block L-2, the ops after it the last blocks
                return previous[n]
            if n in earlier and node not in checked:
                raise _GiveUp
            return env[n]

        for node in self.tail:
            env[node] = self._copy(graph, node, node.name,
                                   lambda n, node=node: read_tail(n, node), deltas,
                                   shift=self.last - 3)
        return graph

    def _counted_late(self, placeholder: fx.Node) -> bool:
        """Whether a placeholder's torch_fn (the call export first saw it in) is one of the
        calls from block L-1 on, whose counters a full trace advances."""
        if "torch_fn" not in placeholder.meta:
            return False
        base, num = _split_name(placeholder.meta["torch_fn"][0])
        late = [_split_name(n.meta["torch_fn"][0]) for n in self.tail if "torch_fn" in n.meta]
        return any(b == base and n <= num for b, n in late)

    def _advanced(self, kind: str, name: str, deltas: dict[tuple[str, str], int],
                  blocks: int) -> str:
        base, num = _split_name(name)
        step = blocks * deltas.get((kind, base), 0)
        return _numbered(base, num + step) if step else name

    def _copy(self, graph: fx.Graph, node: fx.Node, name: str,
              read: Callable[[fx.Node], fx.Node] | None, deltas: dict[tuple[str, str], int],
              *, block: int = 0, shift: int = 0) -> fx.Node:
        """`node` copied into `graph`: block 2's node stamped as block `block` when given
        (`name` is then block 2's, advanced), else as itself `shift` blocks later."""
        blocks = block - 2 if block else shift
        if node.op != "placeholder":
            name = self._advanced("name", name, deltas, blocks)
        if node.op == "placeholder":
            new = graph.placeholder(name)
        else:
            assert read is not None
            args, kwargs = fx.map_arg((node.args, node.kwargs), read)
            new = graph.create_node(node.op, node.target, args, kwargs, name=name)
        if new.name != name:
            raise _GiveUp
        new.meta = self._meta(node, block, deltas, blocks)
        return new

    def _meta(self, node: fx.Node, block: int, deltas: dict[tuple[str, str], int],
              blocks: int) -> dict:
        meta = dict(node.meta)
        if blocks:
            if "torch_fn" in meta:
                name, qualname = meta["torch_fn"]
                meta["torch_fn"] = (self._advanced("torch_fn", name, deltas, blocks), qualname)
            if "seq_nr" in meta:
                meta["seq_nr"] = meta["seq_nr"] + blocks * deltas.get(("seq_nr", ""), 0)
        if not block:
            return meta
        old, new = self.blocks.prefix(2), self.blocks.prefix(block)

        def moved(path: str) -> str:
            return new + path[len(old):] if path == old or path.startswith(old + ".") else path

        if "nn_module_stack" in meta:
            meta["nn_module_stack"] = {_moved_key(key, old, new): (moved(path), kind)
                                       for key, (path, kind) in meta["nn_module_stack"].items()}
        meta[MODULE] = moved(meta.get(MODULE, ""))
        if NAMES in meta:
            meta[NAMES] = tuple(moved(n) for n in meta[NAMES])
        if "desc" in meta and hasattr(meta["desc"], "target"):
            meta["desc"] = copy.copy(meta["desc"])
            object.__setattr__(meta["desc"], "target", moved(meta["desc"].target))
        return meta


def _moved_key(key: str, old: str, new: str) -> str:
    """An `nn_module_stack` key ("L__self__<path>") of block `old` as block `new`'s."""
    at = key.find(old)
    end = at + len(old)
    if at < 0 or (end < len(key) and key[end] not in "."):
        return key
    return key[:at] + new + key[end:]
