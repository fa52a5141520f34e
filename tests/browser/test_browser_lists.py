"""The Graph Executions list: walking, keys, filters, a million rows, paged fetches."""

from urllib.parse import parse_qs, urlparse

from browser_helpers import (
    BIG_BAD_INDEX,
    BIG_TRACES,
    focus_first_nan,
    open_run,
    requires_chromium,
    screenshot,
)

pytestmark = requires_chromium


def test_walking_to_a_consumer_refocuses_the_list(page, server):
    open_run(page, server, "tf_mnist")
    focus_first_nan(page)
    page.locator(".tbn-pane-structure [data-role=consumer]").first.click()
    page.wait_for_function(
        "() => { const r = document.querySelector('[data-focused=true]'); return r && r.dataset.opType !== 'Log'; }",
        timeout=30000)


def test_arrow_keys_and_enter_focus_the_next_row(page, server):
    open_run(page, server, "tf_mnist")
    page.locator(".tbn-vlist .tbn-row").first.click()
    page.wait_for_selector("[data-focused=true][data-index='0']", timeout=30000)
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    page.wait_for_selector("[data-focused=true][data-index='2']", timeout=30000)


def test_bad_only_filter_lists_only_bad_rows(page, server):
    open_run(page, server, "tf_mnist")
    page.check("input[aria-label='Bad only']")
    page.click("text=Filter")
    pane = page.locator(".tbn-pane-graph-executions[data-filtered=true]")
    pane.wait_for(timeout=30000)
    page.wait_for_selector(".tbn-vlist .tbn-row[data-index]", timeout=30000)
    rows = page.locator(".tbn-vlist .tbn-row[data-index]")
    assert int(pane.get_attribute("data-total")) > 0
    assert rows.count() > 0
    assert rows.count() == page.locator(".tbn-vlist .tbn-row-bad").count()


def test_a_million_rows_scroll_to_the_last_one(page, server):
    open_run(page, server, "big")
    pane = page.locator(".tbn-pane-graph-executions")
    assert pane.get_attribute("data-total") == str(BIG_TRACES)
    page.locator(".tbn-vlist").evaluate("s => { s.scrollTop = s.scrollHeight; }")
    last = page.locator(".tbn-vlist .tbn-row[data-index='%d']" % (BIG_TRACES - 1))
    last.wait_for(timeout=60000)
    assert last.locator(".tbn-row-name").inner_text() == "log:0"
    assert last.is_visible()
    # Keyboard: Home then End reaches the last row too.
    page.locator(".tbn-vlist").focus()
    page.keyboard.press("Home")
    page.wait_for_selector(".tbn-vlist .tbn-row[data-index='0']", timeout=60000)
    page.keyboard.press("End")
    page.wait_for_selector(".tbn-row-cursor[data-index='%d']" % (BIG_TRACES - 1), timeout=60000)
    # The DOM holds one screenful of rows, not a million.
    assert page.locator(".tbn-vlist .tbn-row").count() < 100


def test_alert_near_the_end_of_a_million_rows_is_scrolled_into_view(page, server):
    open_run(page, server, "big")
    focus_first_nan(page)
    row = page.locator("[data-focused=true]")
    assert row.get_attribute("data-index") == str(BIG_BAD_INDEX)
    assert row.is_visible()
    assert page.locator("[data-input-of-focus=true]").get_attribute("data-index") == str(BIG_BAD_INDEX - 1)
    assert "nd.log(r)" in page.locator(".tbn-pane-source .tbn-src-hit").inner_text()
    screenshot(page, "big_alert.png")


def test_rows_are_fetched_in_aligned_pages_while_scrolling(page, server):
    open_run(page, server, "big")
    asked = []
    page.on("request", lambda r: "graph_execution/digests" in r.url and asked.append(r.url))
    scroller = page.locator(".tbn-vlist")
    for fraction in (0.25, 0.5, 0.75):
        scroller.evaluate("(s, f) => { s.scrollTop = f * (s.scrollHeight - s.clientHeight); }", fraction)
        first = int(BIG_TRACES * fraction) - 50
        page.wait_for_function(
            "i => [...document.querySelectorAll('.tbn-vlist .tbn-row[data-index]')].some(r => Number(r.dataset.index) > i)",
            arg=first, timeout=30000)
    # Back to a page already seen: drawn from the cache.
    scroller.evaluate("s => { s.scrollTop = 0.25 * (s.scrollHeight - s.clientHeight); }")
    page.wait_for_function(
        "() => document.querySelectorAll('.tbn-vlist .tbn-row-loading').length === 0", timeout=30000)
    scroller.hover()
    page.mouse.wheel(0, 2000)
    page.wait_for_function(
        "() => document.querySelectorAll('.tbn-vlist .tbn-row-loading').length === 0", timeout=30000)

    pages = [parse_qs(urlparse(u).query) for u in asked]
    assert pages
    for q in pages:
        begin, end = int(q["begin"][0]), int(q["end"][0])
        assert begin % 500 == 0 and end - begin == 500, (begin, end)
    # Each page is asked for once: the cache, not the server, answers a revisit.
    keys = [(q["begin"][0], q.get("host", [""])[0]) for q in pages]
    assert len(keys) == len(set(keys))


def test_op_type_filter_lists_only_that_op_type(page, server):
    open_run(page, server, "tf_mnist")
    page.fill("input[aria-label='Filter by op type']", "MatMul")
    page.click("text=Filter")
    page.wait_for_selector(".tbn-pane-graph-executions[data-filtered=true]", timeout=30000)
    page.wait_for_selector(".tbn-vlist .tbn-row[data-index]", timeout=30000)
    types = page.locator(".tbn-vlist .tbn-row[data-index] .tbn-row-type").all_inner_texts()
    assert types and set(types) == {"MatMul"}, types
    page.click("text=Clear")
    page.wait_for_selector(".tbn-pane-graph-executions[data-filtered=false]", timeout=30000)
