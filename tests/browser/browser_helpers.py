"""Shared pieces of the browser tests: where Chromium is, how to open a run, what is focused.

The fixtures (dumps, the ``tensorboard`` process, the browser) are in ``conftest.py`` beside
this file.
"""

import json
import os
import urllib.request

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "artifacts")
BIG_TRACES = 1_000_000
# The big dump's one bad trace sits near the end, so focusing its alert crosses the whole list.
BIG_BAD_INDEX = BIG_TRACES - 5
MANY_EXECUTIONS = 20_000

requires_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason="Debian chromium is not installed at /usr/bin/chromium (`make test` installs it)",
)


def get_json(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def open_run(page, server, run):
    """Opens the plugin's entry page and selects ``run``; waits until the panes are ready."""
    page.goto(server + "/data/plugin_entry.html?name=numerics")
    root = page.locator(".tbn-root")
    root.wait_for()
    page.wait_for_function("document.querySelector('.tbn-root').dataset.state !== 'loading'", timeout=60000)
    page.select_option("select[aria-label=Run]", run)
    page.wait_for_function(
        "r => { const d = document.querySelector('.tbn-root').dataset; return d.run === r && d.state === 'ready'; }",
        arg=run, timeout=120000)
    return root


def focus_first_nan(page):
    page.click("[data-alert-type=InfNan]")
    page.wait_for_selector("[data-focused=true]", timeout=60000)
    page.wait_for_selector(".tbn-pane-source[data-line] .tbn-src-hit", timeout=60000)


def screenshot(page, name):
    os.makedirs(ARTIFACTS, exist_ok=True)
    page.screenshot(path=os.path.join(ARTIFACTS, name))


def focused(page):
    row = page.locator("[data-focused=true]")
    return row.get_attribute("data-op-type"), row.get_attribute("data-op-name"), row.get_attribute("data-index")


