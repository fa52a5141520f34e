"""The Python Execution Timeline: following the focus, the slider, no idle animation."""

from browser_helpers import (
    MANY_EXECUTIONS,
    focus_first_nan,
    open_run,
    requires_chromium,
)

pytestmark = requires_chromium


def test_timeline_moves_to_the_execution_of_the_focused_alert(page, server):
    open_run(page, server, "tf_mnist")
    focus_first_nan(page)
    page.wait_for_selector(".tbn-exec-selected", timeout=30000)
    selected = page.locator(".tbn-exec-selected")
    assert "__forward_loss" in selected.get_attribute("title")  # the call of graph `loss`
    selected.click()
    page.wait_for_selector(".tbn-exec-details .tbn-exec-head", timeout=30000)
    assert page.locator(".tbn-exec-details .tbn-chip").count() > 0
    total = int(page.locator(".tbn-pane-timeline").get_attribute("data-total"))
    page.click("button[aria-label='Last executions']")
    page.wait_for_selector(".tbn-exec[data-exec-index='%d']" % (total - 1), timeout=30000)
    page.click("button[aria-label='First executions']")
    page.wait_for_selector(".tbn-exec[data-exec-index='0']", timeout=30000)
    assert page.locator(".tbn-exec[data-exec-index='%d']" % (total - 1)).count() == 0


def _timeline_window(page):
    """(start, shown execution indices, range label) of the timeline strip."""
    pane = page.locator(".tbn-pane-timeline")
    boxes = pane.locator(".tbn-exec[data-exec-index]").evaluate_all(
        "bs => bs.map(b => Number(b.dataset.execIndex))")
    return int(pane.get_attribute("data-start")), boxes, pane.locator(".tbn-timeline-pos").inner_text()


def _wait_timeline_start(page, predicate_js):
    page.wait_for_function(
        "() => { const p = document.querySelector('.tbn-pane-timeline'); const s = Number(p.dataset.start);"
        " const b = p.querySelectorAll('.tbn-exec[data-exec-index]');"
        " return b.length && Number(b[0].dataset.execIndex) === s && (%s)(s); }" % predicate_js, timeout=30000)


def test_timeline_slider_moves_the_window_to_the_end_and_the_middle(page, server):
    n = MANY_EXECUTIONS
    open_run(page, server, "many_executions")
    _wait_timeline_start(page, "s => s === 0")
    start, boxes, label = _timeline_window(page)
    shown = len(boxes)
    assert start == 0 and boxes == list(range(shown)) and shown > 5
    assert label == "0–%d of %d" % (shown - 1, n)
    slider = page.locator(".tbn-slider")
    slider.focus()
    page.keyboard.press("End")  # the slider's own key: value = its max, an input event
    _wait_timeline_start(page, "s => s > 0")
    start, boxes, label = _timeline_window(page)
    assert boxes == list(range(n - shown, n)) and start == n - shown
    assert label == "%d–%d of %d" % (n - shown, n - 1, n)
    assert page.locator(".tbn-exec[data-exec-index='%d']" % (n - 1)).get_attribute("title").startswith(
        "#%d op_%d" % (n - 1, n - 1))
    # A click in the middle of the track moves there.
    box = slider.bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    _wait_timeline_start(page, "s => s > %d && s < %d" % (n * 0.4, n * 0.6))
    start, boxes, label = _timeline_window(page)
    assert boxes == list(range(start, start + shown))
    assert label == "%d–%d of %d" % (start, start + shown - 1, n)
    assert abs(int(slider.input_value()) - start) <= 1
    assert page.locator(".tbn-exec[data-exec-index='%d']" % start).inner_text() == "O"


def test_an_idle_page_schedules_no_animation_frames(page, server):
    page.add_init_script(
        "window.__tbnFrames = 0; const raf = window.requestAnimationFrame.bind(window);"
        "window.requestAnimationFrame = (cb) => { window.__tbnFrames++; return raf(cb); };")
    open_run(page, server, "tf_mnist")
    focus_first_nan(page)
    page.wait_for_timeout(500)
    before = page.evaluate("window.__tbnFrames")
    assert before > 0, "the hook must see the frames the panes asked for while loading"
    page.wait_for_timeout(1500)
    assert page.evaluate("window.__tbnFrames") == before
