"""Several hosts and what a writer lost: the view opens where the NaN is and says what is missing."""

from browser_helpers import get_json, requires_chromium, screenshot

pytestmark = requires_chromium


def _open(page, server, run):
    """Opens the entry page and ``run`` (on the host the app chooses); waits until ready."""
    page.goto(server + "/data/plugin_entry.html?name=numerics")
    page.locator(".tbn-root").wait_for()
    page.wait_for_function("document.querySelector('.tbn-root').dataset.state !== 'loading'", timeout=60000)
    if page.locator(".tbn-root").get_attribute("data-run") != run:
        page.select_option("select[aria-label=Run]", run)
    page.wait_for_function(
        "r => { const d = document.querySelector('.tbn-root').dataset; return d.run === r && d.state === 'ready'; }",
        arg=run, timeout=120000)


def _ranks(server):
    (run,) = [r for r in get_json(server + "/data/plugin/numerics/runs")["runs"] if r["run"] == "ranks_torch"]
    rank0, rank1 = run["hosts"]
    assert rank0.endswith("rank0") and rank1.endswith("rank1"), run["hosts"]
    return rank0, rank1


def test_a_two_rank_run_opens_on_the_rank_that_holds_the_first_bad_tensor(page, hosts_server):
    rank0, rank1 = _ranks(hosts_server)
    _open(page, hosts_server, "ranks_torch")
    root = page.locator(".tbn-root")
    assert root.get_attribute("data-host") == rank1
    assert page.locator("select[aria-label='Host/rank']").input_value() == rank1
    # The header names the host of the first bad tensor, and the NaN alert is there to click.
    summary = page.locator(".tbn-summary")
    assert summary.inner_text().startswith("On host %s:" % rank1), summary.inner_text()
    assert summary.get_attribute("data-bad-host") == rank1
    assert int(page.locator("[data-alert-type=InfNan]").get_attribute("data-count")) > 0
    assert rank1 in page.locator(".tbn-pane-alerts .tbn-pane-status").inner_text()
    screenshot(page, "ranks_open_on_rank1.png")


def test_the_alerts_pane_counts_alerts_per_host_and_opens_a_host_on_click(page, hosts_server):
    rank0, rank1 = _ranks(hosts_server)
    _open(page, hosts_server, "ranks_torch")
    hosts = page.locator("[data-role=host-counts] [data-host]")
    counts = dict(zip(hosts.evaluate_all("bs => bs.map(b => b.dataset.host)"),
                      hosts.evaluate_all("bs => bs.map(b => Number(b.dataset.count))")))
    assert counts[rank0] == 0 and counts[rank1] > 0, counts
    assert page.locator("[data-role=host-counts] [data-host='%s']" % rank1).get_attribute("aria-pressed") == "true"
    page.click("[data-role=host-counts] [data-host='%s']" % rank0)
    page.wait_for_function(
        "h => { const d = document.querySelector('.tbn-root').dataset; return d.host === h && d.state === 'ready'; }",
        arg=rank0, timeout=60000)
    # Rank 0 is clean, and says so for its own host; the header still names rank 1.
    assert page.locator("[data-alert-type=InfNan]").get_attribute("data-count") == "0"
    assert "on %s" % rank0 in page.locator(".tbn-pane-alerts").inner_text()
    assert page.locator(".tbn-summary").get_attribute("data-bad-host") == rank1


def test_a_writer_status_that_lost_history_shows_a_banner(page, hosts_server):
    _open(page, hosts_server, "ring_status")
    banner = page.locator("[data-role=writer-status]")
    banner.wait_for(timeout=30000)
    text = banner.inner_text()
    assert "History may be incomplete" in text
    assert "kept the last 40 of 1000 graph execution traces" in text, text
    assert "12 records lost" in text and "ENOSPC" in text, text
    assert page.locator("[data-role=writer-note]").count() == 2
    screenshot(page, "writer_status_banner.png")


def test_a_run_whose_writer_lost_nothing_has_no_banner(page, hosts_server):
    _open(page, hosts_server, "ranks_torch")
    assert page.locator("[data-role=writer-status]").count() == 0
    assert page.locator(".tbn-run-notes").is_hidden()
