"""Stack, source, runs, hosts, the TensorBoard tab, and the empty and error states."""

import json

from browser_helpers import (
    focus_first_nan,
    open_run,
    requires_chromium,
)

pytestmark = requires_chromium


def test_route_errors_are_shown_not_swallowed(page, server):
    body = json.dumps({"error": {"code": 400, "message": "begin must be an integer", "parameter": "begin"}})
    page.route("**/graph_execution/digests*", lambda route: route.fulfill(
        status=400, content_type="application/json", body=body))
    open_run(page, server, "tf_mnist")
    error = page.locator(".tbn-pane-graph-executions [data-message=error]")
    error.wait_for(timeout=30000)
    assert "begin must be an integer" in error.inner_text()
    assert 'parameter "begin"' in error.inner_text()
    # Once the route answers again, Retry fills the list.
    page.unroute("**/graph_execution/digests*")
    error.locator("button", has_text="Retry").click()
    page.wait_for_selector(".tbn-vlist .tbn-row[data-index]", timeout=30000)
    assert page.locator(".tbn-pane-graph-executions [data-message=error]").count() == 0


def test_no_dump_shows_the_one_line_to_add(page, empty_server):
    page.goto(empty_server + "/data/plugin_entry.html?name=numerics")
    page.wait_for_selector(".tbn-root[data-state=empty]", timeout=30000)
    text = page.locator(".tbn-empty").inner_text()
    assert 'tbn.enable_dump_debug_info("/tmp/dump", tensor_debug_mode="FULL_HEALTH")' in text
    assert "tf.debugging.experimental.enable_dump_debug_info" in text
    assert page.locator(".tbn-grid").is_hidden()


def test_clicking_a_stack_frame_opens_its_line_in_the_source_pane(page, server):
    open_run(page, server, "tf_mnist")
    focus_first_nan(page)
    caller = page.locator(".tbn-pane-stack .tbn-frame", has_text="main")
    line = caller.get_attribute("data-line")
    caller.click()
    page.wait_for_selector(".tbn-pane-source[data-line='%s'] .tbn-src-hit" % line, timeout=30000)
    assert page.locator(".tbn-pane-source").get_attribute("data-file").endswith("tf_mnist.py")
    assert "run(" in page.locator(".tbn-pane-source .tbn-src-hit").inner_text()
    # Unfolding framework frames shows TF's own files, snapshotted in the dump.
    page.locator(".tbn-pane-stack .tbn-frame-fold button").last.click()
    framework = page.locator(".tbn-pane-stack .tbn-frame-framework")
    assert framework.count() > 0
    assert "site-packages" in framework.first.get_attribute("data-file")


def test_switching_runs_clears_the_previous_runs_focus(page, server):
    open_run(page, server, "tf_mnist")
    focus_first_nan(page)
    page.select_option("select[aria-label=Run]", "torch_mnist")
    page.wait_for_function(
        "() => { const d = document.querySelector('.tbn-root').dataset; return d.run === 'torch_mnist' && d.state === 'ready'; }",
        timeout=60000)
    assert page.locator(".tbn-pane-source").get_attribute("data-file") is None
    assert page.locator("[data-focused=true]").count() == 0
    assert page.locator(".tbn-pane-structure .tbn-op-focus").count() == 0
    assert "aten.log" in page.locator(".tbn-summary").inner_text()


def test_a_failing_run_list_puts_the_page_in_a_visible_error_state(page, server):
    body = json.dumps({"error": {"code": 404, "message": "logdir vanished", "parameter": None}})
    page.route("**/numerics/runs*", lambda route: route.fulfill(
        status=404, content_type="application/json", body=body))
    page.goto(server + "/data/plugin_entry.html?name=numerics")
    page.wait_for_selector(".tbn-root[data-state=error]", timeout=30000)
    assert "logdir vanished" in page.locator(".tbn-banner [role=alert]").inner_text()


def test_the_host_selector_shows_each_ranks_traces(page, server):
    open_run(page, server, "ranks")
    hosts = page.locator("select[aria-label='Host/rank'] option").all_inner_texts()
    assert len(hosts) == 2, hosts
    pane = page.locator(".tbn-pane-graph-executions")
    page.wait_for_function("() => document.querySelector('.tbn-pane-graph-executions').dataset.total")
    first_total = pane.get_attribute("data-total")
    # The run opens on the rank holding the first bad tensor; switch to the other one.
    other = [h for h in hosts if h != page.locator(".tbn-root").get_attribute("data-host")][0]
    page.select_option("select[aria-label='Host/rank']", other)
    page.wait_for_function(
        "h => { const d = document.querySelector('.tbn-root').dataset; return d.host === h && d.state === 'ready'; }",
        arg=other, timeout=30000)
    assert {first_total, pane.get_attribute("data-total")} == {"8", "12"}


def test_the_numerics_tab_hosts_the_plugin_in_its_iframe(page, server):
    page.goto(server + "/#numerics")
    frame = page.frame_locator("iframe")
    frame.locator(".tbn-root[data-state=ready]").wait_for(timeout=60000)
    assert frame.locator("[data-alert-type=InfNan]").count() == 1
