"""The Trends view (numerics over time) against a real torch capture with ``trends=True``,
served by a real ``tensorboard`` process, in headless Chromium.

The program marks six steps; its float16 ``head`` layer's weights are set each step so that the
abs_max of its output walks down the headroom bands (green, green, yellow, orange, red) and
overflows to +inf at the last step.
"""

import os
import subprocess
import sys

import pytest

from browser_helpers import get_json, open_run, requires_chromium, screenshot
from conftest import _tensorboard

pytestmark = requires_chromium

TRENDS = ".tbn-pane-trends"
LIST = ".tbn-pane-graph-executions"

PROGRAM = """
import sys
import torch
from torch import nn
from tb_numerics_plugin import torch as tbn

# abs_max of head's output per step (8 inputs of 1.0 times the weight): headroom log2(65504 / x)
# is 15, 8.4, 5.0, 1.7 and 0.7 bits, then 80000 overflows float16 to +inf.
HEAD_ABS_MAX = [2.0, 200.0, 2000.0, 20000.0, 40000.0, 80000.0]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.head = nn.Linear(8, 8, bias=False).half()
        with torch.no_grad():
            self.encoder[0].weight.fill_(0.125)
            self.encoder[0].bias.zero_()

    def forward(self, x):
        return self.head(self.encoder(x).half())


model = Net()
x = torch.ones(4, 8)
trends = sys.argv[2] == "trends"
with tbn.enable_dump_debug_info(sys.argv[1], "FULL_HEALTH", circular_buffer_size=-1,
                                trends=trends) as handle:
    for step, target in enumerate(HEAD_ABS_MAX):
        handle.step(step)
        with torch.no_grad():
            model.head.weight.fill_(target / 8)
        model(x).float().sum().backward()
"""
HEAD_BANDS = ["green", "green", "yellow", "orange", "red", "nonfinite"]


@pytest.fixture(scope="module")
def trends_server(tmp_path_factory):
    """Base URL of a tensorboard process serving ``trends`` (the program above captured with
    ``trends=True``) and ``no_trends`` (the same program with ``trends=False``)."""
    root = tmp_path_factory.mktemp("trends_logdir")
    script = root / "program.py"
    script.write_text(PROGRAM)
    logdir = root / "logdir"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    for run, mode in (("trends", "trends"), ("no_trends", "off")):
        proc = subprocess.run([sys.executable, str(script), str(logdir / run), mode],
                              capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, "%s failed:\n%s" % (run, proc.stderr[-3000:])
    with _tensorboard(logdir, {"trends", "no_trends"}, str(root / "tensorboard.log")) as base:
        yield base


def open_trends(page, server, run):
    """Opens ``run`` and its Trends view; waits until the grid (or its empty state) is drawn."""
    root = open_run(page, server, run)
    page.click("[data-role=view-toggle] [data-view=trends]")
    page.wait_for_selector(f"{TRENDS}[data-state=ready], {TRENDS}[data-state=empty]", timeout=60000)
    return root


def rows(page):
    return page.locator(f"{TRENDS} [data-role=trend-row]")


def bands(page, module):
    row = page.locator(f"{TRENDS} [data-role=trend-row][data-module='{module}']")
    return row.locator("[data-band]").evaluate_all("cells => cells.map((c) => c.dataset.band)")


def test_the_six_panes_stay_until_trends_is_chosen(page, trends_server):
    root = open_run(page, trends_server, "trends")
    assert root.get_attribute("data-view") == "panes"
    assert page.locator(".tbn-grid").is_visible()
    assert not page.locator(TRENDS).is_visible()
    page.click("[data-role=view-toggle] [data-view=trends]")
    page.wait_for_selector(f"{TRENDS}[data-state=ready]", timeout=60000)
    assert not page.locator(".tbn-grid").is_visible()
    assert page.locator("[data-role=view-toggle] [data-view=trends]").get_attribute("aria-pressed") == "true"


def test_grid_rows_are_the_module_paths_in_the_routes_order(page, trends_server):
    open_trends(page, trends_server, "trends")
    host = page.locator(".tbn-root").get_attribute("data-host")
    route = get_json(trends_server + "/data/plugin/numerics/trends?run=trends&host=%s&kind=output" % host)
    shown = rows(page).evaluate_all("rs => rs.map((r) => r.dataset.module)")
    assert shown == [m["module"] for m in route["modules"]]
    assert set(shown) == {"Net", "encoder", "encoder.0", "encoder.1", "head"}
    assert page.locator(TRENDS).get_attribute("data-kind") == "output"
    assert page.locator(TRENDS).get_attribute("data-columns") == "6"
    assert rows(page).first.locator("[data-band]").count() == 6


def test_cell_colour_follows_the_headroom_of_the_fp16_layer(page, trends_server):
    open_trends(page, trends_server, "trends")
    assert bands(page, "head") == HEAD_BANDS
    # The float32 encoder stays far from its limit every step.
    assert bands(page, "encoder.0") == ["green"] * 6
    head = page.locator(f"{TRENDS} [data-module=head]")
    red = head.locator("[data-band=red]")
    title = red.get_attribute("title")
    assert "head" in title and "step 4" in title and "float16" in title and "abs_max 4e4" in title
    colours = [head.locator("[data-col='%d']" % c).evaluate("c => getComputedStyle(c).backgroundColor")
               for c in (0, 2, 3, 4, 5)]
    assert len(set(colours)) == 5, colours
    assert head.locator("[data-band=nonfinite]").inner_text() == "!"
    screenshot(page, "trends_grid.png")


def test_clicking_a_cell_jumps_the_panes_to_that_step(page, trends_server):
    open_trends(page, trends_server, "trends")
    page.click(f"{TRENDS} [data-module=head] [data-col='3']")
    page.wait_for_selector(".tbn-root[data-view=panes]", timeout=30000)
    page.wait_for_selector(f"{LIST}[data-focused-step='3']", timeout=60000)
    assert page.locator("input[aria-label='Training step']").input_value() == "3"
    focused = page.locator(f"{LIST} [data-focused=true]")
    assert focused.get_attribute("data-step") == "3"
    steps = page.locator(f"{LIST} .tbn-vlist .tbn-row[data-index]").evaluate_all(
        "rs => rs.map((r) => r.dataset.step)")
    assert "3" in steps
    screenshot(page, "trends_jump.png")


def test_kind_selector_lists_the_kinds_and_shows_gradients(page, trends_server):
    open_trends(page, trends_server, "trends")
    kinds = page.locator(f"{TRENDS} select[aria-label='Series kind'] option").evaluate_all(
        "os => os.map((o) => o.value)")
    assert "output" in kinds and "grad" in kinds
    page.select_option(f"{TRENDS} select[aria-label='Series kind']", "grad")
    page.wait_for_selector(f"{TRENDS}[data-kind=grad][data-state=ready]", timeout=30000)
    assert "head" in rows(page).evaluate_all("rs => rs.map((r) => r.dataset.module)")


def test_a_growth_alert_marks_its_module_and_first_step(page, trends_server):
    open_trends(page, trends_server, "trends")
    alert = page.locator(f"{TRENDS} [data-role=growth-alert][data-module=head][data-kind=output]")
    alert.wait_for(timeout=30000)
    assert "float16" in alert.inner_text()
    first = alert.get_attribute("data-step")
    alert.click()
    row = page.locator(f"{TRENDS} [data-role=trend-row][data-highlighted=true]")
    assert row.get_attribute("data-module") == "head"
    assert row.locator("[data-selected=true]").get_attribute("data-step") == first
    assert page.locator(".tbn-root").get_attribute("data-view") == "trends"


def test_a_run_without_series_says_how_to_record_them(page, trends_server):
    open_trends(page, trends_server, "no_trends")
    pane = page.locator(f"{TRENDS}[data-state=empty]")
    assert "trends=True" in pane.inner_text()
    assert rows(page).count() == 0
