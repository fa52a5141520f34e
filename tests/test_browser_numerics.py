"""The Numerics tab in headless Chromium against a real ``tensorboard`` process.

Dumps are made by running the real demos (PyTorch and TensorFlow MNIST whose loss takes
``log(probs)`` of underflowed probabilities) plus a synthetic million-trace dump written with
:class:`tb_numerics_plugin.writer.FileSetWriter`. TensorBoard serves them on a free port; the
plugin's entry page (what the tab loads in its iframe) is opened at 1280×800.
"""

import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from urllib.parse import parse_qs, urlparse

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
ARTIFACTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "artifacts")
BIG_TRACES = 1_000_000
# The big dump's one bad trace sits near the end, so focusing its alert crosses the whole list.
BIG_BAD_INDEX = BIG_TRACES - 5
MANY_EXECUTIONS = 20_000

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason="Debian chromium is not installed at /usr/bin/chromium (`make test` installs it)",
)


def _run_demo(module, dump_dir):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", module, "--dump_dir", dump_dir, "--dump_tensor_debug_mode", "FULL_HEALTH"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert proc.returncode == 0, "%s failed:\n%s" % (module, proc.stderr[-3000:])


def _run_torch_program(name, dump_dir):
    """Runs one program of tests/torch_programs.py (a real torch program) into ``dump_dir``."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_programs.py")
    proc = subprocess.run([sys.executable, script, name, dump_dir], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, "%s failed:\n%s" % (name, proc.stderr[-3000:])


def _health(tensor_id, size, neg_inf=0, nan=0):
    """A FULL_HEALTH TensorProto payload: float32, rank 1, all positive except the bad counts."""
    from tb_numerics_plugin.proto import tensor_pb2

    values = [tensor_id, -1, 1, 1, size, neg_inf, 0, nan, 0, 0, size - neg_inf - nan]
    proto = tensor_pb2.TensorProto(dtype=2, tensor_content=struct.pack("<11d", *values))
    proto.tensor_shape.dim.add().size = len(values)
    return proto


def write_big_dump(dump_dir, num_traces=BIG_TRACES, bad_index=BIG_BAD_INDEX, host_name="big", part=None):
    """Writes one file set with ``num_traces`` traces of a four-op graph, one of them bad.

    ``bad_index`` None writes no bad trace; ``part`` (``"rank1"``) names one rank's file set.

    Each op's trace is serialized once and its bytes reused: a million protobuf builds would
    take minutes, the framing alone takes seconds.
    """
    from tb_numerics_plugin.proto import debug_event_pb2 as pb
    from tb_numerics_plugin.writer import FileSetWriter

    ops = [("x", "Placeholder", []), ("matmul", "MatMul", ["x:0"]), ("relu", "Relu", ["matmul:0"]),
           ("log", "Log", ["relu:0"])]
    source = ["import numerics_demo as nd", "x = nd.input()", "h = nd.matmul(x, w)",
              "r = nd.relu(h)", "y = nd.log(r)  # the big dump's log"]
    with FileSetWriter(dump_dir, circular_buffer_size=-1, host_name=host_name, part=part) as writer:
        file_index = writer.add_source_file("/home/user/big_model.py", source)
        for i, (name, op_type, inputs) in enumerate(ops):
            frame = pb.DebugEvent(wall_time=1.0)
            frame.stack_frame_with_id.id = "f%d" % i
            loc = frame.stack_frame_with_id.file_line_col
            loc.file_index, loc.line, loc.func, loc.code = file_index, i + 2, "<module>", source[i + 1]
            writer.write_event(frame)
            op = pb.DebugEvent(wall_time=1.0)
            c = op.graph_op_creation
            c.op_type, c.op_name, c.graph_name, c.graph_id = op_type, name, "big_graph", "g1"
            c.input_names.extend(inputs)
            c.num_outputs = 1
            c.code_location.host_name = host_name
            c.code_location.stack_frame_ids.append("f%d" % i)
            writer.write_event(op)
        graph = pb.DebugEvent(wall_time=1.0)
        graph.debugged_graph.graph_id, graph.debugged_graph.graph_name = "g1", "big_graph"
        writer.write_event(graph)
        payloads = []
        for i, (name, _, _) in enumerate(ops):
            ev = pb.DebugEvent(wall_time=2.0)
            t = ev.graph_execution_trace
            t.tfdbg_context_id, t.op_name, t.output_slot = "g1", name, 0
            t.tensor_debug_mode = pb.FULL_HEALTH
            t.tensor_proto.CopyFrom(_health(i, 64))
            payloads.append(ev.SerializeToString())
        bad = pb.DebugEvent()
        bad.ParseFromString(payloads[3])
        bad.graph_execution_trace.tensor_proto.CopyFrom(_health(3, 64, neg_inf=5))
        bad_payload = bad.SerializeToString()
        assert bad_index is None or bad_index % 4 == 3, "the bad trace must be a log op"
        for i in range(num_traces):
            writer.write_serialized("graph_execution_traces", bad_payload if i == bad_index else payloads[i % 4])
        ex = pb.DebugEvent(wall_time=3.0)
        ex.execution.op_type, ex.execution.graph_id, ex.execution.num_outputs = "__inference_big_1", "g1", 1
        ex.execution.tensor_debug_mode = pb.FULL_HEALTH
        writer.write_event(ex)


def write_many_executions(dump_dir, num_executions=MANY_EXECUTIONS):
    """Writes a file set of ``num_executions`` eager executions named ``op_<index>``."""
    from tb_numerics_plugin.proto import debug_event_pb2 as pb
    from tb_numerics_plugin.writer import FileSetWriter

    with FileSetWriter(dump_dir, circular_buffer_size=-1, host_name="many") as writer:
        for i in range(num_executions):
            ev = pb.DebugEvent(wall_time=10.0 + i)
            ev.execution.op_type, ev.execution.num_outputs = "op_%d" % i, 1
            ev.execution.output_tensor_ids.append(i)
            ev.execution.tensor_debug_mode = pb.FULL_HEALTH
            ev.execution.tensor_protos.add().CopyFrom(_health(-1, 64))
            writer.write_event(ev)


def _free_port():
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture(scope="session")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("numerics_logdir")
    _run_demo("tb_numerics_plugin.demo.torch_mnist", str(root / "torch_mnist"))
    _run_demo("tb_numerics_plugin.demo.tf_mnist", str(root / "tf_mnist"))
    write_big_dump(str(root / "big"))
    _run_torch_program("fp16_overflow", str(root / "fp16_overflow"))
    write_many_executions(str(root / "many_executions"))
    # Two ranks of one run: rank0 healthy, rank1 with one bad trace.
    write_big_dump(str(root / "ranks"), num_traces=8, bad_index=None, host_name="node", part="rank0")
    write_big_dump(str(root / "ranks"), num_traces=12, bad_index=7, host_name="node", part="rank1")
    return root


@contextlib.contextmanager
def _tensorboard(logdir, expected_runs, log_path):
    """Runs ``tensorboard`` on a free port until the plugin lists ``expected_runs``; yields its URL.

    The process is terminated (killed if it lingers) on the way out, whatever happened.
    """
    port = _free_port()
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
         "--port", str(port), "--reload_interval", "0"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    base = "http://127.0.0.1:%d" % port
    try:
        deadline = time.time() + 180
        while True:
            try:
                runs = _get_json(base + "/data/plugin/numerics/runs")["runs"]
                if set(expected_runs) <= {r["run"] for r in runs}:
                    break
            except (OSError, ValueError, KeyError):
                pass
            assert proc.poll() is None, "tensorboard exited; see %s" % log_path
            assert time.time() < deadline, "tensorboard did not list the runs in time; see %s" % log_path
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="session")
def server(logdir):
    """Base URL of a tensorboard process serving the demo logdir."""
    with _tensorboard(logdir, {"torch_mnist", "tf_mnist", "big", "ranks", "fp16_overflow",
                                       "many_executions"},
                      os.path.join(str(logdir), "tensorboard.log")) as base:
        yield base


@pytest.fixture
def empty_server(tmp_path):
    """Base URL of a tensorboard process whose logdir holds no dump."""
    (tmp_path / "logdir").mkdir()
    with _tensorboard(tmp_path / "logdir", set(), str(tmp_path / "tensorboard.log")) as base:
        yield base


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = context.new_page()
    errors = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    try:
        yield pg
        assert not errors, "uncaught errors in the page: %s" % errors
    finally:
        context.close()


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


def _focused(page):
    row = page.locator("[data-focused=true]")
    return row.get_attribute("data-op-type"), row.get_attribute("data-op-name"), row.get_attribute("data-index")


def test_torch_nan_alert_focuses_the_log_op_its_input_and_source_line(page, server):
    open_run(page, server, "torch_mnist")
    count = page.locator("[data-alert-type=InfNan]").get_attribute("data-count")
    assert int(count) > 0
    focus_first_nan(page)
    op_type, op_name, index = _focused(page)
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
    op_type, op_name, _ = _focused(page)
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
    fb = _get_json(server + "/data/plugin/numerics/summary?run=tf_mnist")["first_bad_tensor"]
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
    first = _get_json(api + "OverflowHeadroom")
    counts = first["counts"]
    assert counts["OverflowHeadroom"] > 0 and counts["InfNan"] > 0, counts
    open_run(page, server, "fp16_overflow")
    for alert_type, n in counts.items():
        assert page.locator("[data-alert-type=%s]" % alert_type).get_attribute("data-count") == str(n)
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


def test_next_alert_moves_the_focus_forward(page, server):
    open_run(page, server, "tf_mnist")
    focus_first_nan(page)
    first = int(_focused(page)[2])
    page.click("text=Next ▶")
    page.wait_for_function(
        "i => { const r = document.querySelector('[data-focused=true]'); return r && Number(r.dataset.index) > i; }",
        arg=first, timeout=30000)
    page.click("text=◀ Previous")
    page.wait_for_selector("[data-focused=true][data-index='%d']" % first, timeout=30000)


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


def test_the_host_selector_shows_each_ranks_traces(page, server):
    open_run(page, server, "ranks")
    hosts = page.locator("select[aria-label='Host/rank'] option").all_inner_texts()
    assert len(hosts) == 2, hosts
    pane = page.locator(".tbn-pane-graph-executions")
    page.wait_for_function("() => document.querySelector('.tbn-pane-graph-executions').dataset.total")
    first_total = pane.get_attribute("data-total")
    page.select_option("select[aria-label='Host/rank']", hosts[1])
    page.wait_for_function(
        "h => { const d = document.querySelector('.tbn-root').dataset; return d.host === h && d.state === 'ready'; }",
        arg=hosts[1], timeout=30000)
    assert {first_total, pane.get_attribute("data-total")} == {"8", "12"}


def test_the_numerics_tab_hosts_the_plugin_in_its_iframe(page, server):
    page.goto(server + "/#numerics")
    frame = page.frame_locator("iframe")
    frame.locator(".tbn-root[data-state=ready]").wait_for(timeout=60000)
    assert frame.locator("[data-alert-type=InfNan]").count() == 1
