"""check: which ops of a model autopar can shard, and how it counts their FLOPs.

`check(model, example_inputs)` captures and annotates the model (no mesh, no solve) and
reports one row per distinct ATen op target of the graph, in order of first use: how many
nodes call it, the rule family that shards it (or "replicated (no rule)": the strategy pass
then runs it whole on every device), where its FLOPs come from and how many there are. The
shares of nodes and of FLOPs that have a rule say how much of the model a plan can split.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

from torch import fx, nn

from autopar.passes.capturing.annotate import DATA_MOVEMENT, FORMULA, annotate, flop_source
from autopar.passes.capturing.capture import capture
from autopar.rules import lookup
from autopar.values.specs import FLOPS

__all__ = ["DATA_MOVEMENT", "FORMULA", "NO_RULE", "CheckReport", "OpRow", "check",
           "flop_source"]

NO_RULE = "replicated (no rule)"
# The lines under the title of `CheckReport.table()`, saying what its columns hold.
_COLUMNS = f"""one row per ATen op, in order of first use.
  nodes: calls of the op in the graph; rule family: the sharding rules that split it
  ({NO_RULE}: it runs whole on every device); FLOP source: how annotate counts
  its FLOPs; forward FLOPs: summed over its nodes.
"""


@dataclass(frozen=True)
class OpRow:
    """One ATen op target of the graph: `count` nodes call it, `flops` forward FLOPs in all."""

    op: str
    count: int
    family: str  # the rule family's module name ("matmul", "pointwise"...), or NO_RULE
    flop_source: str  # FORMULA, DATA_MOVEMENT or "estimate: N per element"
    flops: int

    @property
    def has_rule(self) -> bool:
        return self.family != NO_RULE


@dataclass(frozen=True)
class CheckReport:
    """The ops of `model` (its class name), rows in order of first use in the graph."""

    model: str
    rows: tuple[OpRow, ...]

    @property
    def unruled(self) -> tuple[OpRow, ...]:
        """The rows of ops without a sharding rule."""
        return tuple(row for row in self.rows if not row.has_rule)

    @property
    def ruled_share_by_count(self) -> float:
        """Nodes whose op has a rule over all op nodes; 1.0 for a graph without ops."""
        return _share(self.rows, lambda row: row.count)

    @property
    def ruled_share_by_flops(self) -> float:
        """Forward FLOPs of ops with a rule over all of them; 1.0 when there are none."""
        return _share(self.rows, lambda row: row.flops)

    def table(self) -> str:
        """The rows as aligned text under lines explaining the columns, then the shares."""
        header = ("op", "nodes", "rule family", "FLOP source", "forward FLOPs")
        cells = [header] + [(r.op, str(r.count), r.family, r.flop_source, f"{r.flops:,}")
                            for r in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
        right = {1, 4}  # numbers line up on their last digit

        def line(row: tuple[str, ...]) -> str:
            return "  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                             for i, (cell, w) in enumerate(zip(row, widths))).rstrip()

        ruled = [r for r in self.rows if r.has_rule]
        shares = (f"with a rule: {sum(r.count for r in ruled)} of "
                  f"{sum(r.count for r in self.rows)} nodes ({self.ruled_share_by_count:.1%}), "
                  f"{sum(r.flops for r in ruled):,} of {sum(r.flops for r in self.rows):,} "
                  f"forward FLOPs ({self.ruled_share_by_flops:.1%})")
        return "\n".join([f"Ops of {self.model}, {_COLUMNS}", line(header),
                          *map(line, cells[1:]), shares])


def check(model: nn.Module, example_inputs: tuple) -> CheckReport:
    """Capture and annotate `model(*example_inputs)` and report its ops (see the module).

    Raises `CaptureError` when torch.export cannot capture the model.
    """
    gm = annotate(capture(model, tuple(example_inputs)))
    nodes: dict[object, list[fx.Node]] = {}  # insertion order: first use in the graph
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is not operator.getitem:
            nodes.setdefault(node.target, []).append(node)
    rows = []
    for target, group in nodes.items():
        rule = lookup(target)
        rows.append(OpRow(
            op=str(target), count=len(group),
            family=rule.__module__.rsplit(".", 1)[-1] if rule is not None else NO_RULE,
            flop_source=flop_source(group[0]),
            # A capture without dynamic shapes has static sizes: FLOPs are plain ints.
            flops=sum(int(node.meta[FLOPS]) for node in group)))
    return CheckReport(type(model).__name__, tuple(rows))


def _share(rows: tuple[OpRow, ...], weight: Callable[[OpRow], int]) -> float:
    total = sum(weight(row) for row in rows)
    return sum(weight(row) for row in rows if row.has_rule) / total if total else 1.0
