"""`autopar.summary(plan)` (`autopar.present.summary`): the op-group table's row order, its labels
of long module paths, its legend, and warnings shown once."""

import warnings

import pytest
import torch
from torch import nn

import autopar
from autopar import rules

CPU2 = autopar.Mesh((2,), ("dp",), hardware="cpu")


class Order(nn.Module):
    """`late` is registered (so its parameters come in the graph) before `early`, but
    runs after it."""

    def __init__(self) -> None:
        super().__init__()
        self.late = nn.Linear(8, 8)
        self.early = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.late(torch.relu(self.early(x))).pow(2).mean()


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.k = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x) * self.k(x)


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.SelfAttention = Attention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.SelfAttention(x)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.ModuleList([Layer()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer[0](x)


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.block:
            x = block(x)
        return x


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Stack()
        self.decoder = Stack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


class LongNames(nn.Module):
    """Module paths as deep as a T5's: m.encoder.block.0.layer.0.SelfAttention.q, ..."""

    def __init__(self) -> None:
        super().__init__()
        self.m = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(x).pow(2).mean()


class Flip(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flip(self.fc(x), dims=(1,)).pow(2).mean()


def group_rows(text: str) -> list[str]:
    """The op-group column of the summary's first table, one entry per row."""
    table = text.split("└")[0].split("┡")[1]
    cells = [line.split("│")[1].strip() for line in table.splitlines() if line.startswith("│")]
    return [cell for cell in cells if cell]  # a row wrapped over lines: first line only


def without_flip_rule(monkeypatch) -> None:
    """aten.flip without a sharding rule, whatever the rule registry holds."""
    lookup = rules.lookup
    monkeypatch.setattr(rules, "lookup", lambda target: None
                        if target is torch.ops.aten.flip.default else lookup(target))


@pytest.fixture(scope="module")
def long_plan():
    torch.manual_seed(0)
    return autopar.plan(LongNames(), CPU2, (torch.randn(8, 8),), time_limit=5)


def test_groups_are_in_the_order_the_model_runs_them():
    torch.manual_seed(0)
    plan = autopar.plan(Order(), CPU2, (torch.randn(8, 8),), time_limit=5)
    rows = group_rows(autopar.summary(plan))
    assert rows.index("early") < rows.index("late"), rows


def test_long_module_paths_keep_their_distinguishing_end(long_plan):
    rows = group_rows(autopar.summary(long_plan))
    assert len(rows) == len(set(rows)), rows  # every row tells its group apart
    attention = [row for row in rows if "SelfAttention" in row]
    assert {row[-2:] for row in attention} >= {".q", ".k"}, rows
    assert {row.split("…")[0] for row in attention if "…" in row} >= {"m.encoder",
                                                                      "m.decoder"}, rows


def test_group_labels_are_short_distinct_and_end_whole():
    from autopar.present.summary import group_labels

    patterns = [f"m.{side}.block.*.layer.*.SelfAttention.{name}"
                for side in ("encoder", "decoder") for name in ("q", "k", "relative_bias")]
    labels = group_labels([*patterns, "(top)", "m.shared"], 30)
    assert labels["(top)"] == "(top)" and labels["m.shared"] == "m.shared"
    assert len(set(labels.values())) == len(labels)
    for pattern in patterns:
        assert len(labels[pattern]) <= 30, labels[pattern]
        assert labels[pattern].endswith(pattern.split(".")[-1])
    # Only one of a kind: the end alone tells it apart.
    assert group_labels(["a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q"], 10) == {
        "a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q": "…m.n.o.p.q"}


def test_the_legend_says_what_the_columns_count(long_plan):
    text = autopar.summary(long_plan)
    legend = " ".join(text.split("└")[1].split("Totals")[0].split())
    assert "x: how many modules the row stands for" in legend
    assert "repeated blocks share a row" in legend and "R replicated" in legend


def test_each_warning_is_raised_and_listed_once(monkeypatch):
    without_flip_rule(monkeypatch)
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = autopar.plan(Flip(), autopar.Mesh((2, 2), ("dp", "tp"), hardware="cpu"),
                            (torch.randn(8, 16),), hand_strategies=True, time_limit=5)
    raised = [w for w in caught if "no sharding rule" in str(w.message)]
    assert len(raised) == 1 and "aten.flip.default" in str(raised[0].message), raised
    assert raised[0].filename == __file__  # at the call of autopar.plan
    assert len(plan.warnings) == len(set(plan.warnings)) == 1, plan.warnings
    assert autopar.summary(plan).count("no sharding rule for aten.flip.default") == 1


class _Bessel(nn.Module):
    """A linear layer into an op with neither a sharding rule nor a FLOP formula."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.i0e(self.linear(x)).sum()


def test_an_op_without_rule_or_formula_is_warned_with_its_estimate():
    plan = autopar.plan(_Bessel(), autopar.Mesh((2,), ("x",), hardware="cpu"),
                        (torch.randn(8, 16),), time_limit=5)
    assert plan.warnings == ("no sharding rule for aten.special_i0e.default: kept replicated; "
                             "no FLOP formula either (estimate: 1 per element of its largest "
                             "tensor)",)


def test_a_pipelines_stage_sends_are_not_attention_rings():
    """A stage's last op sends its output to the next stage over the pipeline axis; the
    summary's context-parallel line counts attentions on a ring, and there are none."""
    from autopar.present.summary import describe_context_parallel
    from examples import gpt

    model, inputs = gpt.build(hidden=64, layers=4, batch=8)
    plan = autopar.plan(model, autopar.Mesh((2, 2), ("pp", "tp"), hardware="cpu"), inputs,
                        time_limit=2, pipeline=autopar.Pipeline(schedule="1F1B",
                                                                microbatches=4))
    assert any(t.kind == "send" and t.axis == "pp" for n in plan.nodes for t in n.transfers)
    assert describe_context_parallel(plan) == "none"
