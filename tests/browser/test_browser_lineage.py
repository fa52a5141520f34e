"""Lineage in the UI, on real model dumps (tests/models.py): the NaN/∞ alert lands on the root of
the first propagating lineage, the path strip walks it to its sink, the stack marks the model code
and the user's code, masked non-finite values stay a quiet category."""

from browser_helpers import get_json, open_run, requires_chromium, screenshot

pytestmark = requires_chromium

WO = "encoder.block.1.layer.1.DenseReluDense.wo/"


def _api(server, route):
    return get_json(server + "/data/plugin/numerics/" + route)


def _first_bad(server, run):
    return _api(server, "summary?run=" + run)["first_bad_tensor"]


def _bad_counts(health):
    """The hop chip's text for a health dict: "106 -inf, 107 +inf" (counts under 10000)."""
    return ", ".join("%d %s" % (health[k], label) for k, label in
                     (("neg_inf", "-inf"), ("pos_inf", "+inf"), ("nan", "NaN")) if health[k])


def _click_nan(page):
    page.click("[data-alert-type=InfNan]")
    page.wait_for_selector(".tbn-pane-alerts[data-alert-index]", timeout=60000)


def test_healthy_causal_encoder_shows_no_alarm_and_its_masked_values_greyed(page, server):
    counts = _api(server, "alerts?run=transformer_encoder&end=0")["counts"]
    assert counts["InfNan"] == 0 and counts["MaskedNonFinite"] > 0, counts
    open_run(page, server, "transformer_encoder")
    alerts = page.locator(".tbn-pane-alerts")
    assert alerts.locator(".tbn-pane-status").inner_text() == "no alerts"
    nan = page.locator("[data-alert-type=InfNan]")
    assert nan.get_attribute("data-count") == "0" and nan.is_disabled()
    masked = page.locator("[data-alert-type=MaskedNonFinite]")
    assert masked.get_attribute("data-count") == str(counts["MaskedNonFinite"])
    assert masked.locator(".tbn-alert-count").inner_text() == str(counts["MaskedNonFinite"])
    assert "tbn-alert-type-quiet" in masked.get_attribute("class")
    assert masked.evaluate("b => getComputedStyle(b).color") == "rgb(117, 117, 117)"  # grey
    assert "No NaN or ∞ reaches" in alerts.locator(".tbn-alert-current").inner_text()
    assert "No NaN or ∞ reaches" in page.locator(".tbn-summary").inner_text()
    # A masked tensor can still be inspected (here the mask itself, made eagerly by
    # generate_square_subsequent_mask); it has no propagation path to show.
    first = _api(server, "alerts?run=transformer_encoder&alert_type=MaskedNonFinite&end=1")["items"][0]
    masked.click()
    page.wait_for_selector(".tbn-pane-alerts[data-alert-kind=%s][data-alert-index='%d']" % (
        first["kind"], first["index"]), timeout=30000)
    assert "Masked NaN/∞" in alerts.locator(".tbn-alert-current").inner_text()
    assert page.locator(".tbn-path").is_hidden()


def test_t5_nan_alert_focuses_the_wo_matmul_and_opens_its_model_code(page, server):
    fb = _first_bad(server, "t5_fp16_overflow")
    open_run(page, server, "t5_fp16_overflow")
    _click_nan(page)
    row = page.locator("[data-focused=true]")
    row.wait_for(timeout=30000)
    assert row.get_attribute("data-op-name").startswith(WO)
    assert row.get_attribute("data-index") == str(fb["index"])
    assert page.locator(".tbn-pane-alerts").get_attribute("data-alert-root") == "true"
    source = page.locator(".tbn-pane-source")
    page.wait_for_selector(".tbn-pane-source[data-line='%d'] .tbn-src-hit" % fb["source"]["line"], timeout=30000)
    assert source.get_attribute("data-file").endswith("modeling_t5.py")
    assert "self.wo(" in source.locator(".tbn-src-hit").inner_text()


def test_t5_stack_marks_the_model_code_frame_and_the_users_frame(page, server):
    fb = _first_bad(server, "t5_fp16_overflow")
    open_run(page, server, "t5_fp16_overflow")
    _click_nan(page)
    stack = page.locator(".tbn-pane-stack")
    model = stack.locator("[data-mark=source]")
    model.wait_for(timeout=30000)
    assert model.count() == 1
    assert model.get_attribute("data-file").endswith("modeling_t5.py")
    assert model.get_attribute("data-line") == str(fb["source"]["line"])
    assert model.get_attribute("data-kind") == "model"
    assert "model code" in model.inner_text()
    assert "tbn-frame-selected" in model.get_attribute("class")
    user = stack.locator("[data-mark=user-source]")
    assert user.count() == 1
    assert user.get_attribute("data-file") == fb["user_source"]["file"]
    assert user.get_attribute("data-line") == str(fb["user_source"]["line"])
    assert "your code" in user.inner_text()
    # Model code is not folded away; only framework frames are.
    kinds = stack.locator(".tbn-frame").evaluate_all("fs => fs.map(f => f.dataset.kind)")
    assert "framework" not in kinds, kinds


def test_t5_path_strip_shows_each_hops_health_and_a_click_focuses_the_hop(page, server):
    fb = _first_bad(server, "t5_fp16_overflow")
    path = fb["path"]
    assert len(path) > 8, "the T5 path is long enough to fold"
    open_run(page, server, "t5_fp16_overflow")
    _click_nan(page)
    strip = page.locator(".tbn-path")
    strip.wait_for(timeout=30000)
    assert strip.get_attribute("data-current") == "0"
    assert strip.locator("[data-role=path-sink]").inner_text() == fb["sink"] == "model output"
    hops = strip.locator("[data-role=hop]")
    shown = [int(h) for h in hops.evaluate_all("hs => hs.map(h => h.dataset.hop)")]
    n = len(path)
    assert shown == [0, 1, 2, n - 3, n - 2, n - 1]
    assert strip.locator("[data-role=path-more]").inner_text() == "… %d more" % (n - 6)
    for k in shown:
        hop = strip.locator("[data-role=hop][data-hop='%d']" % k)
        assert hop.get_attribute("data-index") == str(path[k]["index"])
        assert hop.locator("[data-role=hop-health]").inner_text() == _bad_counts(path[k]["health"])
    assert strip.locator("[data-hop='0'] [data-role=hop-health]").inner_text() == "106 -inf, 107 +inf"
    assert strip.locator("[data-hop='0']").inner_text().startswith("wo/mm_0")
    screenshot(page, "t5_fp16_path.png")
    # A hop is a link: the list, the strip and Graph Structure follow it.
    strip.locator("[data-hop='1']").click()
    page.wait_for_selector("[data-focused=true][data-index='%d']" % path[1]["index"], timeout=30000)
    page.wait_for_selector(".tbn-path[data-current='1']", timeout=30000)
    page.wait_for_selector(".tbn-pane-structure[data-op-name='%s']" % path[1]["op_name"], timeout=30000)
    # The folded middle opens, and its hops are links too.
    strip.locator("[data-role=path-more]").click()
    assert hops.count() == n
    strip.locator("[data-hop='5']").click()
    page.wait_for_selector("[data-focused=true][data-index='%d']" % path[5]["index"], timeout=30000)


def test_focused_row_keeps_the_layer_part_of_a_long_module_path_in_view_at_1280px(page, server):
    assert page.viewport_size["width"] == 1280
    open_run(page, server, "t5_fp16_overflow")
    _click_nan(page)
    name = page.locator("[data-focused=true] .tbn-row-name")
    name.wait_for(timeout=30000)
    # Where each part of the name is drawn, against the box that clips it.
    boxes = name.evaluate("""span => {
      const text = span.firstChild.firstChild;
      const at = (part) => {
        const k = text.textContent.indexOf(part);
        const range = document.createRange();
        range.setStart(text, k);
        range.setEnd(text, k + part.length);
        const r = range.getBoundingClientRect();
        return [r.left, r.right];
      };
      const box = span.getBoundingClientRect();
      return {box: [box.left, box.right], layer: at('DenseReluDense.wo'), op: at('/mm_0:0')};
    }""")
    left, right = boxes["box"]
    for part in ("layer", "op"):
        a, b = boxes[part]
        assert left <= a and b <= right + 0.5, (part, boxes)


def test_nan_alert_lands_on_the_lineage_root_even_when_an_alert_comes_before_it(page, server):
    # plain_function_loss takes log eagerly: its root is an execution, while alerts in order
    # start with graph traces.
    fb = _first_bad(server, "plain_function_loss")
    first = _api(server, "alerts?run=plain_function_loss&end=1")["items"][0]
    assert (first["kind"], first["index"]) != (fb["kind"], fb["index"])
    assert fb["kind"] == "execution" and fb["op_type"] == "aten.log.default"
    open_run(page, server, "plain_function_loss")
    _click_nan(page)
    alerts = page.locator(".tbn-pane-alerts")
    assert alerts.get_attribute("data-alert-kind") == "execution"
    assert alerts.get_attribute("data-alert-index") == str(fb["index"])
    page.wait_for_selector(".tbn-pane-timeline[data-selected='%d']" % fb["index"], timeout=30000)
    # The execution's output health, decoded by the server, as chips.
    out = page.locator(".tbn-exec-details [data-slot='0'] [data-chip=neg_inf]")
    out.wait_for(timeout=30000)
    assert out.inner_text().endswith(str(fb["health"]["neg_inf"]))
    assert "tbn-chip-bad" in out.get_attribute("class")
    # Its stack and source follow: the plain-function loss is the user's code.
    user = page.locator(".tbn-pane-stack [data-mark=user-source]")
    user.wait_for(timeout=30000)
    assert user.get_attribute("data-line") == str(fb["user_source"]["line"])
    page.wait_for_selector(".tbn-pane-source[data-line='%d'] .tbn-src-hit" % fb["source"]["line"], timeout=30000)
    assert "torch.log(" in page.locator(".tbn-pane-source .tbn-src-hit").inner_text()
    # The path of executions ends in its sink; a hop selects its execution.
    strip = page.locator(".tbn-path")
    assert strip.locator("[data-role=hop]").count() == len(fb["path"])
    assert strip.get_attribute("data-sink") == fb["sink"]
    hop = fb["path"][1]
    strip.locator("[data-hop='1']").click()
    page.wait_for_selector(".tbn-pane-timeline[data-selected='%d']" % hop["index"], timeout=30000)
    page.wait_for_selector(".tbn-path[data-current='1']", timeout=30000)
    # Next walks the alerts in order from the root.
    after = _api(server, "alerts/next?run=plain_function_loss&kind=execution&index=%d" % fb["index"])["alert"]
    page.click("text=Next ▶")
    page.wait_for_selector(".tbn-pane-alerts[data-alert-index='%d'][data-alert-kind=%s]" % (
        after["index"], after["kind"]), timeout=30000)
