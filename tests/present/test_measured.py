"""Predicted next to measured in `autopar.summary(plan, measured=...)` and
`autopar.report(plan, path, measured=...)`, from measurements made up with known ratios to
the plan (the measuring itself: tests/tools/test_measure.py)."""

from __future__ import annotations

import re

import pytest

import autopar
from autopar.present.report import render_html
from autopar.values.measurement import GROUPS, Measurement, predicted_groups
from examples import mlp


@pytest.fixture(scope="module")
def plan() -> autopar.Plan:
    model, inputs = mlp.build(batch=64, hidden=128, ffn=512)
    return autopar.plan(model, autopar.Mesh((2,), ("dp",), hardware="cpu"), inputs,
                        constraints={"fc1.weight": "S(0)"})


def made_up(plan: autopar.Plan, rank: int, *, step: float = 2.0, memory: float = 1.5,
            ) -> Measurement:
    """Rank `rank`'s measurement: a median step `step` times the plan's, every group
    three times its prediction, a peak `memory` times the plan's."""
    median = step * plan.step_time_s
    predicted = predicted_groups(plan)
    return Measurement(
        rank=rank, coordinate=(rank,), device="cpu", warmup=2,
        step_times_s=(0.9 * median, median, 1.4 * median), profiled_step_s=1.5 * median,
        groups=tuple((name, 3 * predicted[name]) for name in GROUPS), group_clock="cpu",
        peak_memory_bytes=int(memory * plan.peak_memory_bytes), start_bytes=1000,
        memory_method="profiler")


def _row(text: str, quantity: str) -> list[str]:
    """The cells of the comparison's row that starts with `quantity`."""
    table = text[text.index("Predicted against measured"):]
    line = next(line for line in table.splitlines()
                if re.match(rf"\W*{re.escape(quantity)}\s*│", line))
    return [cell.strip() for cell in line.split("│")[1:-1]]


def test_the_summary_sets_the_measurement_next_to_the_prediction(plan):
    text = autopar.summary(plan, measured=[made_up(plan, 1, memory=1.25), made_up(plan, 0)])
    assert "Predicted against measured (2 ranks, 3 timed steps after 2 warm-up, on cpu)" in text
    step = _row(text, "step time")
    assert step[1] == f"{plan.step_time_s * 1e3:,.3f} ms"
    assert step[2] == f"{2 * plan.step_time_s * 1e3:,.3f} ms" and step[3] == "2.00x"
    assert "IQR/median" in step[4]
    for name in GROUPS:
        cells = _row(text, name)
        assert cells[3] == ("3.00x" if predicted_groups(plan)[name] > 0 else "-"), cells
    assert _row(text, "matmul")[3] == "3.00x"  # an MLP predicts matmuls
    assert _row(text, "peak memory, rank 0")[3] == "1.50x"
    assert _row(text, "peak memory, rank 1")[3] == "1.25x"
    # The rest of the summary is still there, the comparison after the totals.
    assert text.index("Totals") < text.index("Predicted against measured") \
        < text.index("Bytes moved")


def test_one_ranks_measurement_is_enough(plan):
    text = autopar.summary(plan, measured=made_up(plan, 0, step=0.5))
    assert "(1 rank," in text and _row(text, "step time")[3] == "0.50x"
    assert "peak memory, rank 1" not in text


def test_without_a_measurement_nothing_is_compared(plan):
    assert "Predicted against measured" not in autopar.summary(plan)
    assert 'id="measured"' not in render_html(plan)


@pytest.mark.parametrize("measured", [[], "fast", [object()], "duplicate"])
def test_what_is_not_a_measurement_is_refused(plan, measured, tmp_path):
    if measured == "duplicate":
        measured = [made_up(plan, 0), made_up(plan, 0)]
    with pytest.raises(autopar.AutoparError) as info:
        autopar.summary(plan, measured=measured)
    assert "expected:" in str(info.value) and "fix:" in str(info.value)
    target = tmp_path / "plan.html"
    with pytest.raises(autopar.AutoparError):
        autopar.report(plan, target, measured=measured)
    assert not target.exists()  # refused before anything is written


def test_the_report_draws_the_step_and_memory_against_the_plan(plan, tmp_path):
    ranks = [made_up(plan, 0), made_up(plan, 1, memory=0.8)]
    page = autopar.report(plan, tmp_path / "plan.html", measured=ranks).read_text()
    section = re.search(r'<section id="measured">.*?</section>', page, re.S).group(0)
    step = re.search(r'<svg[^>]*id="measured-step-chart".*?</svg>', section, re.S).group(0)
    labels = re.findall(r'data-label="([^"]*)"', step)
    assert labels == ["predicted", "measured (profiled)"]
    # Each bar stacks one segment per group, hover text naming it.
    assert [len(re.findall(rf"<title>{re.escape(name)} ", step)) for name in GROUPS] \
        == [2] * len(GROUPS)
    assert "measured median" in step
    memory = re.search(r'<svg[^>]*id="measured-memory-chart".*?</svg>', section,
                       re.S).group(0)
    assert re.findall(r'data-label="([^"]*)"', memory) == [
        "rank 0 predicted", "rank 0 measured", "rank 1 predicted", "rank 1 measured"]
    assert "1.50x predicted" in memory and "0.80x predicted" in memory
    table = re.search(r'<table id="measured-table".*?</table>', section, re.S).group(0)
    assert table.count("<tr>") == 1 + 1 + len(GROUPS) + 2
    assert "<td>2.00x</td>" in table


def test_the_measured_section_renders_in_chromium(plan, tmp_path):
    from selenium.webdriver.common.by import By
    from test_report import _browser  # the report tests' headless chromium

    page = autopar.report(plan, tmp_path / "plan.html",
                          measured=[made_up(plan, 0), made_up(plan, 1)])
    browser = _browser()
    try:
        browser.get(page.resolve().as_uri())
        find = browser.find_elements
        assert browser.execute_script("return window.__autoparErrors") == []
        assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
        section = browser.find_element(By.ID, "measured")
        assert section.is_displayed() and "Predicted against measured" in section.text
        assert len(find(By.CSS_SELECTOR, "#measured-step-chart .bar-row")) == 2
        assert len(find(By.CSS_SELECTOR, "#measured-memory-chart .bar-row")) == 4
        assert len(find(By.CSS_SELECTOR, "#measured-table tbody tr")) == 1 + len(GROUPS) + 2
        browser.execute_script("arguments[0].scrollIntoView()", section)
        browser.save_screenshot(str(tmp_path / "measured.png"))
    finally:
        browser.quit()
