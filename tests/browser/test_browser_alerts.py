"""The Alerts pane and what focusing an alert moves: the list, inputs, source, stack."""

from browser_helpers import (
    focused,
    get_json,
    focus_first_nan,
    open_run,
    requires_chromium,
    screenshot,
)

pytestmark = requires_chromium


def test_torch_nan_alert_focuses_the_log_op_its_input_and_source_line(page, server):
    open_run(page, server, "torch_mnist")
    count = page.locator("[data-alert-type=InfNan]").get_attribute("data-count")
    assert int(count) > 0
    focus_first_nan(page)
    op_type, op_name, index = focused(page)
    assert "log" in op_type.lower(), (op_type, op_name)
    assert page.locator("[data-focused=true] .tbn-chip-bad[data-chip=neg_inf]").count() == 1
    page.wait_for_selector("[data-input-of-focus=true]", timeout=30000)
    inputs = page.locator("[data-input-of-focus=true]")
    assert inputs.count() >= 1
    assert int(inputs.first.get_attribute("data-index")) < int(index)
    frames = page.locator(".tbn-pane-stack [data-file]")
    assert any(f.endswith("torch_mnist.py") for f in frames.evaluate_all("fs => fs.map(f => f.dataset.file)"))
    source = page.locator(".tbn-pane-source")
    assert source.get_attribute("data-file").endswith("torch_mnist.py")
    hit = source.locator(".tbn-src-hit")
    assert "torch.log(" in hit.inner_text()
    assert hit.get_attribute("data-line") == source.get_attribute("data-line")
    assert page.locator(".tbn-pane-structure .tbn-op-focus").inner_text().startswith(op_name)
    # The timeline selects the call of the op's graph (torch writes it before the op's traces).
    page.wait_for_function(
        "() => { const b = document.querySelector('.tbn-exec-selected');"
        " return b && b.title.includes('Classifier.forward'); }", timeout=30000)
    screenshot(page, "torch_mnist_nan.png")


def test_tf_nan_alert_focuses_log_and_the_tf_math_log_line(page, server):
    open_run(page, server, "tf_mnist")
    focus_first_nan(page)
    op_type, op_name, _ = focused(page)
    assert op_type == "Log", (op_type, op_name)
    # The Log op's input is the function's `probs` placeholder; TF does not trace placeholders,
    # so the structure pane (not a list row) is where that input shows.
    assert page.locator(".tbn-pane-structure [data-role=input][data-op-name=probs]").count() == 1
    # ...and the timeline marks the execution whose output was that argument's value.
    producer = _probs_source(server)["index"]
    page.wait_for_selector(".tbn-exec[data-exec-index='%d'][data-input-of-focus=true]" % producer,
                           timeout=30000)
    assert page.locator(".tbn-exec[data-input-of-focus=true]").count() == 1
    source = page.locator(".tbn-pane-source")
    assert source.get_attribute("data-file").endswith("tf_mnist.py")
    assert "tf.math.log(" in source.locator(".tbn-src-hit").inner_text()
    assert page.locator(".tbn-pane-stack .tbn-frame-selected").get_attribute("data-file").endswith("tf_mnist.py")
    # Framework frames are folded by default: every visible frame is the user's.
    visible = page.locator(".tbn-pane-stack .tbn-frame").evaluate_all("fs => fs.map(f => f.dataset.file)")
    assert visible and all("site-packages" not in f for f in visible), visible
    assert page.locator(".tbn-summary").inner_text().strip()
    screenshot(page, "tf_mnist_nan.png")


def _probs_source(server):
    """Where the TF demo's first bad tensor (Log) got its `probs` argument, per the summary."""
    fb = get_json(server + "/data/plugin/numerics/summary?run=tf_mnist")["first_bad_tensor"]
    (probs,) = fb["inputs"]
    assert probs["name"] == "probs:0" and probs["source"]["kind"] == "execution"
    return probs["source"]


def test_tf_placeholder_input_links_to_the_execution_that_made_its_value(page, server):
    source = _probs_source(server)
    open_run(page, server, "tf_mnist")
    focus_first_nan(page)
    link = page.locator(".tbn-pane-structure [data-role=input-source]")
    link.wait_for(timeout=30000)
    assert link.get_attribute("data-exec-index") == str(source["index"])
    text = link.inner_text()
    assert "value from execution #%d %s output %d" % (
        source["index"], source["op_type"], source["output_slot"]) in " ".join(text.split())
    assert "finite" in text and "zeros of 1000" in text
    link.click()
    page.wait_for_selector(".tbn-pane-timeline[data-selected='%d']" % source["index"], timeout=30000)
    page.wait_for_function(
        "h => { const d = document.querySelector('.tbn-exec-details .tbn-exec-head'); return d && d.textContent.startsWith(h); }",
        arg="#%d %s" % (source["index"], source["op_type"]), timeout=30000)
    box = page.locator(".tbn-exec[data-exec-index='%d']" % source["index"])
    assert "tbn-exec-selected" in box.get_attribute("class")
    assert box.get_attribute("data-input-of-focus") == "true"
    # Focusing another trace drops the mark: only the first bad tensor's inputs have sources.
    page.click("text=Next ▶")
    page.wait_for_function(
        "() => { const r = document.querySelector('[data-focused=true]'); return r && r.dataset.opType !== 'Log'; }",
        timeout=30000)
    page.wait_for_function("() => !document.querySelector('.tbn-exec[data-input-of-focus=true]')",
                           timeout=30000)


def test_torch_inputs_are_traced_rows_not_executions(page, server):
    open_run(page, server, "torch_mnist")
    focus_first_nan(page)
    page.wait_for_selector("[data-input-of-focus=true][data-index]", timeout=30000)
    assert page.locator(".tbn-exec[data-input-of-focus=true]").count() == 0
    assert page.locator(".tbn-pane-structure [data-role=input-source]").count() == 0


def test_overflow_headroom_alert_focuses_the_fp16_matmul_near_65504(page, server):
    api = server + "/data/plugin/numerics/alerts?run=fp16_overflow&end=1&alert_type="
    first = get_json(api + "OverflowHeadroom")
    counts = first["counts"]
    assert counts["OverflowHeadroom"] > 0 and counts["InfNan"] > 0, counts
    open_run(page, server, "fp16_overflow")
    for alert_type, n in counts.items():
        button = page.locator("[data-alert-type=%s]" % alert_type)
        if n or alert_type == "InfNan":
            assert button.get_attribute("data-count") == str(n)
        else:  # an empty category other than InfNan is not shown
            assert button.count() == 0
    page.click("[data-alert-type=OverflowHeadroom]")
    alert = first["items"][0]
    row = page.locator("[data-focused=true]")
    row.wait_for(timeout=30000)
    assert row.get_attribute("data-index") == str(alert["index"])
    assert row.get_attribute("data-op-type") == alert["op_type"] == "aten.mm.default"
    alerts_pane = page.locator(".tbn-pane-alerts")
    assert alerts_pane.get_attribute("data-alert-index") == str(alert["index"])
    assert "Overflow headroom" in alerts_pane.locator(".tbn-alert-current").inner_text()
    # The FULL_NUMERICS statistics are chips of the row: 8 * 5000 = 40000, one doubling from 65504.
    assert row.locator("[data-chip=max]").inner_text() == "4e4"
    abs_max = row.locator("[data-chip=abs_max]")
    assert abs_max.inner_text() == "4e4"
    assert "tbn-chip-warn" in abs_max.get_attribute("class")
    assert "float16 limit 65504" in abs_max.get_attribute("title")
    assert row.locator("[data-chip=min]").count() == 1
    header = page.locator(".tbn-pane-graph-executions .tbn-row-header").inner_text()
    assert "|max|" in header
    # The overflow itself: the next op (x 2) holds +inf.
    page.click("[data-alert-type=InfNan]")
    page.wait_for_selector("[data-focused=true][data-index='%d']" % (alert["index"] + 1), timeout=30000)
    assert page.locator("[data-focused=true] .tbn-chip-bad[data-chip=pos_inf]").count() == 1
    page.click("[data-alert-type=OverflowHeadroom]")
    page.wait_for_selector("[data-focused=true][data-index='%d']" % alert["index"], timeout=30000)
    screenshot(page, "fp16_overflow.png")


def test_next_alert_moves_the_focus_forward(page, server):
    open_run(page, server, "tf_mnist")
    focus_first_nan(page)
    first = int(focused(page)[2])
    page.click("text=Next ▶")
    page.wait_for_function(
        "i => { const r = document.querySelector('[data-focused=true]'); return r && Number(r.dataset.index) > i; }",
        arg=first, timeout=30000)
    page.click("text=◀ Previous")
    page.wait_for_selector("[data-focused=true][data-index='%d']" % first, timeout=30000)
