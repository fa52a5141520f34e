"""Training steps in the UI: the step column, the step box, "Go to step", the step filter and the
header naming the step of the first bad tensor (real TensorBoard, headless Chromium)."""

from browser_helpers import focus_first_nan, open_run, requires_chromium, screenshot

pytestmark = requires_chromium

LIST = ".tbn-pane-graph-executions"


def test_header_names_the_step_of_the_first_bad_tensor(page, steps_server):
    open_run(page, steps_server, "marked")
    summary = page.locator("[data-bad-step]")
    summary.wait_for(timeout=30000)
    assert summary.get_attribute("data-bad-step") == "13"
    assert summary.inner_text().startswith("At step 13: Log")


def test_rows_and_timeline_boxes_show_their_step(page, steps_server):
    open_run(page, steps_server, "marked")
    page.wait_for_selector(".tbn-vlist .tbn-row[data-index='9']", timeout=30000)
    row = page.locator(".tbn-vlist .tbn-row[data-index='9']")
    assert row.get_attribute("data-step") == "13"
    assert row.locator(".tbn-row-step").inner_text() == "13"
    unmarked = page.locator(".tbn-vlist .tbn-row[data-index='0']")
    assert unmarked.get_attribute("data-step") is None
    assert unmarked.locator(".tbn-row-step").inner_text() == ""
    assert page.locator(f"{LIST} .tbn-row-header .tbn-row-step").inner_text() == "step"
    box = page.locator(".tbn-timeline-strip [data-exec-index='3']")
    box.wait_for(timeout=30000)
    assert box.get_attribute("data-step") == "12"
    assert "step 12" in box.get_attribute("title")


def test_focusing_the_first_nan_shows_its_step_in_the_step_box(page, steps_server):
    open_run(page, steps_server, "marked")
    focus_first_nan(page)
    page.wait_for_selector(f"{LIST}[data-focused-step='13']", timeout=30000)
    assert page.locator("input[aria-label='Training step']").input_value() == "13"
    screenshot(page, "steps_first_nan.png")


def test_go_to_step_focuses_the_first_trace_of_that_step(page, steps_server):
    open_run(page, steps_server, "marked")
    page.fill("input[aria-label='Training step']", "11")
    page.click("text=Go to step")
    page.wait_for_selector("[data-focused=true][data-index='4']", timeout=30000)
    page.wait_for_selector(".tbn-pane-timeline[data-selected='2']", timeout=30000)
    assert page.locator(f"{LIST}").get_attribute("data-focused-step") == "11"


def test_go_to_a_step_between_marks_lands_on_the_next_marked_step(page, steps_server):
    open_run(page, steps_server, "marked")
    page.fill("input[aria-label='Training step']", "-50")
    page.click("text=Go to step")
    page.wait_for_selector("[data-focused=true][data-index='2']", timeout=30000)


def test_go_to_a_step_past_the_last_says_so(page, steps_server):
    open_run(page, steps_server, "marked")
    page.fill("input[aria-label='Training step']", "99")
    page.click("text=Go to step")
    page.wait_for_selector(f"{LIST}[data-step-not-found='99']", timeout=30000)
    assert "step 99" in page.locator(f"{LIST} .tbn-vlist-notice").inner_text()


def test_step_filter_lists_only_that_steps_traces(page, steps_server):
    open_run(page, steps_server, "marked")
    page.fill("input[aria-label='Training step']", "12")
    page.click("text=Filter")
    pane = page.locator(f"{LIST}[data-filtered=true]")
    pane.wait_for(timeout=30000)
    page.wait_for_selector(".tbn-vlist .tbn-row[data-index]", timeout=30000)
    rows = page.locator(".tbn-vlist .tbn-row[data-index]")
    assert pane.get_attribute("data-total") == "2"
    assert [rows.nth(i).get_attribute("data-step") for i in range(rows.count())] == ["12", "12"]


def test_a_run_without_steps_shows_no_step_column_nor_step_in_the_header(page, steps_server):
    open_run(page, steps_server, "unmarked")
    page.wait_for_selector(".tbn-vlist .tbn-row[data-index='0']", timeout=30000)
    assert page.locator(f"{LIST} .tbn-row-step").count() == 0
    assert page.locator("[data-bad-step]").count() == 0
