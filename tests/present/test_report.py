"""The plan report: a self-contained page that renders without script errors in a real browser
(headless chromium driven by selenium), its DOT drawing, and the `autopar report` command.

The browser test needs Debian's `chromium` and `chromium-driver` (CI installs them); without
them it fails, saying so. With AUTOPAR_SCREENSHOT=PATH set it also saves its screenshot there
(docs/report.png, the one README shows, is made that way).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import autopar
from autopar.cli import main
from autopar.present.report import ReportError, render_html, to_dot
from autopar.present.report.layers import group_layers
from autopar.values.plan import HandStrategyRecord, Plan
from examples import gpt

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVERS = ("chromedriver", "/usr/lib/chromium/chromedriver", "/usr/bin/chromedriver")


def _hand_strategies(plan: Plan) -> tuple[HandStrategyRecord, ...]:
    """Stand-in records (two fit, one does not, one not applicable) for a plan made
    without hand strategies, so that every part of the comparison is drawn."""
    step, peak, limit = plan.step_time_s, plan.peak_memory_bytes, plan.memory_limit_bytes
    return (
        HandStrategyRecord("data parallel", "replicate the model, split the batch on every axis",
                           step * 1.4, plan.compute_s, step * 0.4, peak * 1.6,
                           (("all_reduce", "dp", "backward", 3.0e7),), True),
        HandStrategyRecord("ZeRO-3", "shard parameters, gather them for use", step * 1.7,
                           plan.compute_s, step * 0.7, peak * 0.6,
                           (("all_gather", "dp", "forward", 2.0e7),), True),
        HandStrategyRecord("Megatron", "column then row split linears on tp", step * 1.1,
                           plan.compute_s, step * 0.1, limit * 1.3, (), False),
        HandStrategyRecord("pipeline", "layers split into stages", None, None, None, None,
                           (), False, "not applicable: fewer layers than stages"),
    )


@pytest.fixture(scope="module")
def plan() -> Plan:
    # Big enough that the solver shards on both axes and communicates on each.
    model, inputs = gpt.build(hidden=512, heads=8, seq=256, batch=8, vocab=4096)
    result = autopar.plan(model, autopar.Mesh((2, 2), ("dp", "tp"), hardware="a100-sxm"),
                          inputs, time_limit=10.0)
    if result.hand_strategies:
        return result
    return dataclasses.replace(result, hand_strategies=_hand_strategies(result))


def _browser():
    """A headless chromium under selenium, or a test failure saying what to install."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed: pip install -e '.[test]'")
    binary = next((shutil.which(name) for name in CHROMIUM if shutil.which(name)), None)
    driver = next((shutil.which(name) for name in DRIVERS if shutil.which(name)), None)
    if binary is None or driver is None:
        pytest.fail(f"headless chromium is needed (found browser {binary}, driver {driver}): "
                    "apt-get install -y chromium chromium-driver, as .ci/run does")
    options = webdriver.ChromeOptions()
    # An explicit binary and driver: selenium then never looks for (or downloads) its own.
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1500,1000", "--hide-scrollbars"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(driver))


def test_report_renders_and_responds_in_chromium(plan, tmp_path):
    from selenium.webdriver import ActionChains
    from selenium.webdriver.common.by import By

    page = autopar.report(plan, tmp_path / "plan.html")
    browser = _browser()
    try:
        browser.get(page.resolve().as_uri())
        find = browser.find_elements

        # (a) the graph: one element per node, lanes per layer, a legend of placements.
        nodes = find(By.CSS_SELECTOR, "#graph .node")
        assert len(nodes) == len(plan.nodes)
        assert len(find(By.CSS_SELECTOR, "#graph details.lane")) == len(group_layers(plan))
        legend = browser.find_element(By.ID, "legend").text
        assert all(p in legend for p in ("R", "S(0)", "P", "dp", "tp"))
        fills = {e.get_attribute("fill") for e in find(By.CSS_SELECTOR, "#graph .band")}
        assert len(fills) >= 3, "nodes are not coloured by placement"
        # (b)-(e): memory per device, communication, cost per layer, hand strategies.
        assert len(find(By.CSS_SELECTOR, "#memory-chart .bar-row")) == plan.mesh.size
        kinds = {t.kind for n in plan.nodes for t in n.transfers}
        header = browser.find_element(By.CSS_SELECTOR, "#comm-table thead").text
        assert kinds and all(kind in header for kind in kinds)
        assert len(find(By.CSS_SELECTOR, "#cost-chart .bar-row")) == len(group_layers(plan))
        usable = [h for h in plan.hand_strategies if h.step_time_s is not None]
        assert len(find(By.CSS_SELECTOR, "#hand-time-chart .bar-row")) == 1 + len(usable)
        assert len(find(By.CSS_SELECTOR, "#hand-time-chart .bar-row.nofit")) == sum(
            not h.fits for h in usable)
        assert len(find(By.CSS_SELECTOR, "#hand-table tbody tr")) == len(plan.hand_strategies)

        # Fold every lane but the first block's, then hover and click one of its operators
        # that communicates: the tooltip, then the detail panel, show that node.
        browser.find_element(By.ID, "collapse-all").click()
        lane = browser.find_element(By.CSS_SELECTOR, '#graph details.lane[data-layer="layers.0"]')
        lane.find_element(By.TAG_NAME, "summary").click()
        assert browser.execute_script("return arguments[0].open", lane)
        index = next(i for i, n in enumerate(plan.nodes)
                     if n.module.startswith("layers.0.") and n.role == "op"
                     and any(t.tensor.startswith("p_") for t in n.transfers)
                     and any(not t.tensor.startswith("p_") for t in n.transfers))
        node = plan.nodes[index]
        element = browser.find_element(By.CSS_SELECTOR, f'#graph .node[data-i="{index}"]')
        ActionChains(browser).move_to_element(element).perform()
        tooltip = browser.find_element(By.ID, "tooltip")
        assert tooltip.is_displayed() and node.op in tooltip.text
        ActionChains(browser).click(element).perform()
        detail = browser.find_element(By.ID, "detail")
        assert detail.find_element(By.TAG_NAME, "h2").text == node.name
        assert node.op in detail.text and "compute" in detail.text
        rows = find(By.CSS_SELECTOR, "#detail-transfers tr")
        assert len(rows) == 1 + len(node.transfers)
        assert "selected" in element.get_attribute("class")
        assert find(By.CSS_SELECTOR, "#graph .edge.active"), "its reshard arcs are not shown"
        ActionChains(browser).move_by_offset(0, -400).perform()
        browser.save_screenshot(str(tmp_path / "report.png"))
        if os.environ.get("AUTOPAR_SCREENSHOT"):
            browser.save_screenshot(os.environ["AUTOPAR_SCREENSHOT"])

        # A transfer's tensor links to the node that produced it.
        link = next(a for a in find(By.CSS_SELECTOR, "#detail-transfers a")
                    if not a.text.startswith("p_"))
        producer = link.text
        link.click()
        assert detail.find_element(By.TAG_NAME, "h2").text == producer

        errors = browser.execute_script("return window.__autoparErrors")
        severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        browser.quit()
    assert errors == [] and severe == [], (errors, severe)
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_report_needs_no_network_and_notes_what_is_missing(plan, tmp_path):
    html = render_html(plan)
    assert not re.search(r"https?://", html), "the page refers to an external resource"
    assert "<link" not in html and not re.search(r"<(script|img|iframe)[^>]*\bsrc=", html)
    bare = dataclasses.replace(plan, hand_strategies=(), nodes=tuple(
        dataclasses.replace(n, transfers=(), comm_s=0.0) for n in plan.nodes))
    html = Path(autopar.report(bare, tmp_path / "bare.html")).read_text()
    assert 'id="hand-none"' in html and "not evaluated" in html
    assert 'id="comm-none"' in html


def test_report_to_an_unwritable_path_says_how_to_fix(plan, tmp_path):
    with pytest.raises(ReportError, match="fix: "):
        autopar.report(plan, tmp_path / "missing" / "plan.html")
    assert issubclass(ReportError, autopar.AutoparError)


def test_to_dot_clusters_by_layer_and_colours_by_placement(plan):
    dot = autopar.to_dot(plan)
    assert dot == to_dot(plan) and dot.startswith("digraph ")
    assert dot.count("subgraph cluster_") == len(group_layers(plan))
    assert dot.count("{") == dot.count("}")
    for node in plan.nodes:
        assert f'"{node.name}" [label=<' in dot
    assert 'bgcolor="#2e86de">S(0)<' in dot  # S(0) cells carry S(0)'s colour
    producers = {(t.tensor, n.name) for n in plan.nodes for t in n.transfers}
    assert dot.count(" -> ") == len(producers)


def test_cli_report_writes_the_page_and_rejects_bad_files(plan, tmp_path):
    saved = tmp_path / "plan.json"
    plan.save(saved)
    result = CliRunner().invoke(main, ["report", str(saved), "-o", str(tmp_path / "p.html"),
                                       "--dot", str(tmp_path / "p.dot")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "p.html").read_text().count('class="node ') == len(plan.nodes)
    assert (tmp_path / "p.dot").read_text().startswith("digraph")
    (tmp_path / "bad.json").write_text("{}")
    result = CliRunner().invoke(main, ["report", str(tmp_path / "bad.json")])
    assert result.exit_code == 1 and "expected" in result.output


def test_a_pipelined_plan_shows_its_timeline_and_stages_in_chromium(tmp_path):
    """Every stage's forward and backward of every micro-batch is one box on its rank's row,
    and each lane of the graph names the stages it runs in."""
    from selenium.webdriver.common.by import By

    model, inputs = gpt.build(hidden=64, layers=4, batch=8)
    pipelined = autopar.plan(model, autopar.Mesh((2, 2), ("pp", "tp"), hardware="cpu"), inputs,
                             time_limit=2,
                             pipeline=autopar.Pipeline(schedule="1F1B", microbatches=4))
    page = autopar.report(pipelined, tmp_path / "pipeline.html")
    browser = _browser()
    try:
        browser.get(page.resolve().as_uri())
        boxes = browser.find_elements(By.CSS_SELECTOR, "#pipeline-timeline .pp-op")
        assert len(boxes) == 2 * len(pipelined.pipeline.stages) * 4
        kinds = {(b.get_attribute("data-kind"), b.get_attribute("data-stage")) for b in boxes}
        assert kinds == {(k, s) for k in "FB" for s in ("0", "1")}
        rows = browser.find_elements(By.CSS_SELECTOR, "#pipeline-stages tbody tr")
        assert len(rows) == 2
        lanes = browser.find_elements(By.CSS_SELECTOR, '#graph details.lane[data-layer="layers.3"]')
        assert lanes and lanes[0].get_attribute("data-stages") == "1"
        assert browser.execute_script("return window.__autoparErrors") == []
    finally:
        browser.quit()
