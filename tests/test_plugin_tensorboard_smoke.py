"""Smoke test: a real ``tensorboard`` process, without TensorFlow, finds and serves the plugin."""

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from processes import stop

from test_plugin_helpers import demo_logdir

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_URL = re.compile(r"http://127\.0\.0\.1:(\d+)/")
_NO_TF = "TensorFlow installation not found"


def _logdir(tmp_path_factory):
    """The committed demo logdir when present, else the session's demo dumps."""
    committed = os.path.join(_REPO, "demo_logdir")
    if os.path.isdir(committed):
        return committed
    return demo_logdir(str(tmp_path_factory.getbasetemp()))


def _tensorboard_command(logdir):
    script = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    command = [script] if os.path.exists(script) else [sys.executable, "-m", "tensorboard.main"]
    return command + ["--logdir", logdir, "--host", "127.0.0.1", "--port", "0"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Yields (base URL, stderr lines) of a tensorboard whose ``import tensorflow`` fails."""
    blocker = tmp_path_factory.mktemp("no_tf")
    (blocker / "tensorflow").mkdir()
    (blocker / "tensorflow" / "__init__.py").write_text('raise ImportError("blocked by test")\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(blocker), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        _tensorboard_command(_logdir(tmp_path_factory)), env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        yield "http://127.0.0.1:%s" % _wait_for_port(proc, lines), lines
    finally:
        stop(proc)


def _wait_for_port(proc, lines, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in list(lines):
            match = _URL.search(line)
            if match:
                return match.group(1)
        if proc.poll() is not None:
            raise AssertionError("tensorboard exited: %s" % "".join(lines))
        time.sleep(0.1)
    raise AssertionError("tensorboard printed no URL: %s" % "".join(lines))


def _get(base, path):
    with urllib.request.urlopen(base + path, timeout=120) as response:
        return response.headers, json.loads(response.read())


def test_tensorboard_without_tensorflow_runs_on_its_stub(server):
    _, lines = server
    assert any(_NO_TF in line for line in lines)


def test_plugins_listing_has_numerics_enabled_as_an_iframe_tab(server):
    base, _ = server
    _, listing = _get(base, "/data/plugins_listing")
    assert listing["numerics"]["enabled"] is True
    assert listing["numerics"]["tab_name"] == "Numerics Debugger"
    assert listing["numerics"]["loading_mechanism"]["type"] == "IFRAME"


def test_a_run_serves_its_infnan_alert_over_http(server):
    base, _ = server
    _, listing = _get(base, "/data/plugin/numerics/runs")
    found = []
    for run in listing["runs"]:
        headers, body = _get(base, "/data/plugin/numerics/alerts?run=%s&end=1"
                             % urllib.request.quote(run["run"]))
        assert headers.get_content_type() == "application/json"
        found.extend(a["alert_type"] for a in body["items"])
    assert "InfNan" in found


def test_entry_page_imports_our_module_which_is_served_as_javascript(server):
    base, _ = server
    with urllib.request.urlopen(base + "/data/plugin_entry.html?name=numerics", timeout=60) as r:
        assert "./static/index.js" in r.read().decode()
    with urllib.request.urlopen(base + "/data/plugin/numerics/static/index.js", timeout=60) as r:
        assert r.headers.get_content_type() == "text/javascript"
        assert b"export" in r.read()


def _series_values(logdir, run, tag):
    """``{step: value}`` of one tag, decoded from the run's numerics series files."""
    from tb_numerics_plugin import records, series

    found = {}
    run_dir = os.path.join(logdir, run)
    for name in sorted(os.listdir(run_dir)):
        if name.endswith("." + series.SUFFIX):
            for _, payload in records.scan(os.path.join(run_dir, name)).records:
                step, _, values, _ = series.decode_event(payload)
                for kind, stat, part, module, value in values:
                    if series.tag(kind, stat, module, part) == tag:
                        found[step] = value
    return found


def test_scalars_tab_plots_the_numerics_series_of_a_torch_run(server, tmp_path_factory):
    # The same series the Trends view shows, as TensorBoard's own Scalars plugin serves it.
    base, _ = server
    _, tags = _get(base, "/data/plugin/scalars/tags")
    ours = {run: sorted(t for t in run_tags if t.startswith("numerics."))
            for run, run_tags in tags.items()}
    runs = [run for run, t in ours.items() if any(x.startswith("numerics.output.abs_max/")
                                                  for x in t)]
    assert runs, "no run with numerics scalars in %s" % sorted(tags)
    run = runs[0]
    assert any(t.startswith("numerics.grad.abs_max/") for t in ours[run])
    assert not any(".dtype/" in t for t in ours[run])  # descriptors are not scalars
    tag = next(t for t in ours[run] if t.startswith("numerics.output.abs_max/"))
    _, points = _get(base, "/data/plugin/scalars/scalars?run=%s&tag=%s"
                     % (urllib.request.quote(run), urllib.request.quote(tag)))
    expected = _series_values(_logdir(tmp_path_factory), run, tag)
    assert len(points) == len(expected) >= 2
    for _, step, value in points:
        assert value == pytest.approx(expected[step], rel=1e-6)
