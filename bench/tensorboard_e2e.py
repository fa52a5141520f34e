"""TensorBoard end to end: our plugin vs TensorBoard's debugger-v2 on one 1M-trace dump.

Measures, for each plugin, a real ``tensorboard`` process from its start to
the first InfNan alert served over HTTP, and the peak RSS of the process
(children included); for ours also the latency of digest pages (500 rows,
page-aligned, at random offsets), as the frontend's virtual list asks.

The dump is written with our FileSetWriter, which writes TF's file format
byte for byte (TFRecord framing, DebugEvent protos with TF's field numbers;
TF's own DebugDataReader reads it, as the debugger-v2 run here shows).
A real TF program writing 1M traces is too slow to generate here: TF's
writer plus health kernels would need about 1M instrumented op runs.

Usage::

    python bench/tensorboard_e2e.py [--dump_dir D] [--traces 1000000] [--write_docs]
"""

import argparse
import gzip
import json
import os
import random
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import psutil

import docs_section  # bench/, the script's own folder

from tb_numerics_plugin import writer as writer_lib
from tb_numerics_plugin.proto import debug_event_pb2

_OPS = 200  # ops per graph; traces cycle through them
_PAGE = 500  # the frontend's page size
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DOCS = os.path.join(_REPO, "docs", "benchmarks.md")
_SECTION = "TensorBoard end to end"
_DEBUGGER_RUN = "__default_debugger_run__"
_DEBUGGER_LABEL = "debugger-v2 (needs TF)"


def _health_payload(op_name, tensor_id, bad):
    """Returns a serialized FULL_HEALTH GraphExecutionTrace event for ``op_name:0``."""
    event = debug_event_pb2.DebugEvent(wall_time=1.0e9 + tensor_id * 1e-4)
    trace = event.graph_execution_trace
    trace.tfdbg_context_id, trace.op_name, trace.output_slot = "g1", op_name, 0
    trace.tensor_debug_mode = 4  # FULL_HEALTH
    neg_inf = 271 if bad else 0
    values = [tensor_id, -1, 1, 2, 1000, neg_inf, 0, 0, 1000 - neg_inf, 0, 0]
    proto = trace.tensor_proto
    proto.dtype = 2  # DT_DOUBLE
    proto.tensor_shape.dim.add().size = len(values)
    proto.tensor_content = struct.pack("<%dd" % len(values), *values)
    return event.SerializeToString()


def write_dump(dump_dir, traces, first_bad):
    """Writes one file set: a graph of ``_OPS`` ops and ``traces`` FULL_HEALTH traces.

    Every trace from ``first_bad`` on holds -inf, as after a real divergence.

    Returns:
      float: seconds spent writing.
    """
    start = time.perf_counter()
    w = writer_lib.FileSetWriter(dump_dir, circular_buffer_size=-1, flush_interval_s=60.0,
                                 host_name="bench", tensorflow_version="2.21.0")
    graph = debug_event_pb2.DebugEvent()
    graph.debugged_graph.graph_id, graph.debugged_graph.graph_name = "g1", "train_step"
    w.write_event(graph)
    for k in range(_OPS):
        op = debug_event_pb2.DebugEvent()
        c = op.graph_op_creation
        c.op_type, c.op_name, c.graph_id, c.graph_name = "Log", "op_%d" % k, "g1", "train_step"
        if k:
            c.input_names.append("op_%d:0" % (k - 1))
        c.num_outputs = 1
        w.write_event(op)
    # Payloads differ only by tensor id within a cycle; caching one per (op, bad)
    # keeps generation at framing speed, which is what TF's writer pays too.
    cache = {}
    for i in range(traces):
        key = (i % _OPS, i >= first_bad)
        payload = cache.get(key)
        if payload is None:
            payload = cache[key] = _health_payload("op_%d" % key[0], key[0], key[1])
        w.write_serialized("graph_execution_traces", payload)
    w.close()
    return time.perf_counter() - start


class _Server:
    """A ``tensorboard`` subprocess on a free port, with its peak RSS sampled."""

    def __init__(self, logdir, env):
        self.port = _free_port()
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1",
             "--port", str(self.port), "--load_fast=false"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.peak_rss = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self):
        root = psutil.Process(self.proc.pid)
        while not self._stop.is_set():
            try:
                procs = [root] + root.children(recursive=True)
                self.peak_rss = max(self.peak_rss, sum(p.memory_info().rss for p in procs))
            except psutil.Error:
                pass
            time.sleep(0.02)

    def get(self, path, **params):
        """GETs a path as a browser would (gzip accepted).

        Returns:
          (status, parsed JSON or None, ms from sending the request to the
          last byte received; decoding and parsing happen after the clock stops).
        """
        url = "http://127.0.0.1:%d%s?%s" % (self.port, path, urllib.parse.urlencode(params))
        request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                raw = r.read()
                elapsed_ms = (time.perf_counter() - t0) * 1000
                gzipped = r.headers.get("Content-Encoding") == "gzip"
                status = r.status
        except urllib.error.HTTPError as e:
            return e.code, None, None
        except (urllib.error.URLError, ConnectionError, socket.timeout):
            return 0, None, None
        return status, json.loads(gzip.decompress(raw) if gzipped else raw), elapsed_ms

    def stop(self):
        self._stop.set()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _poll(server, path, done, timeout_s, **params):
    """Polls ``path`` until ``done(body)``; returns seconds since process start, or None."""
    deadline = server.started + timeout_s
    while time.perf_counter() < deadline:
        if server.proc.poll() is not None:
            return None
        status, body, _ = server.get(path, **params)
        if status == 200 and body is not None and done(body):
            return time.perf_counter() - server.started
        time.sleep(0.05)
    return None


def _tf_blocked_env(tmp):
    """An environment where ``import tensorflow`` fails: TensorBoard then runs on its stub."""
    os.makedirs(os.path.join(tmp, "no_tf", "tensorflow"), exist_ok=True)
    with open(os.path.join(tmp, "no_tf", "tensorflow", "__init__.py"), "w") as f:
        f.write('raise ImportError("tensorflow blocked by the benchmark")\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(tmp, "no_tf"),
                                                      env.get("PYTHONPATH")]))
    return env


def _page_latencies(server, run, pages):
    """Returns the latency in ms of ``pages`` random page-aligned digest pages."""
    _, listing, _ = server.get("/data/plugin/numerics/runs")
    total = next(r for r in listing["runs"] if r["run"] == run)["num_graph_execution_traces"]
    rng = random.Random(0)
    page_ms = []
    for _ in range(pages):
        begin = rng.randrange(0, max(1, total // _PAGE)) * _PAGE
        status, body, elapsed_ms = server.get("/data/plugin/numerics/graph_execution/digests",
                                              run=run, begin=begin, end=begin + _PAGE)
        page_ms.append(elapsed_ms)
        assert status == 200 and len(body["items"]) == min(_PAGE, total - begin)
    return page_ms


def measure_ours(logdir, run, pages, timeout_s, env):
    """Returns {"up_s", "first_alert_s", "peak_rss", "page_ms"} for the numerics plugin."""
    server = _Server(logdir, env)
    try:
        up = _poll(server, "/data/plugins_listing", lambda b: True, timeout_s)
        first = _poll(server, "/data/plugin/numerics/alerts",
                      lambda b: b.get("total", 0) > 0, timeout_s, run=run, end=1)
        page_ms = _page_latencies(server, run, pages) if first is not None else []
        return {"up_s": up, "first_alert_s": first, "peak_rss": server.peak_rss,
                "page_ms": page_ms}
    finally:
        server.stop()


def measure_debugger_v2(logdir, timeout_s):
    """Returns {"up_s", "first_alert_s", "peak_rss"} for TensorBoard's debugger-v2 (needs TF)."""
    server = _Server(logdir, dict(os.environ))
    try:
        up = _poll(server, "/data/plugins_listing", lambda b: True, timeout_s)
        ran = _poll(server, "/data/plugin/debugger-v2/runs", lambda b: _DEBUGGER_RUN in b,
                    timeout_s)
        first = None
        if ran is not None:
            first = _poll(server, "/data/plugin/debugger-v2/alerts",
                          lambda b: b.get("num_alerts", 0) > 0, timeout_s,
                          run=_DEBUGGER_RUN, begin=0, end=0)
        return {"up_s": up, "first_alert_s": first, "peak_rss": server.peak_rss, "page_ms": []}
    finally:
        server.stop()


def _fmt_s(value, timeout_s):
    return "> %d s (gave up)" % timeout_s if value is None else "%.1f s" % value


def _first_alert(r, ref, timeout_s):
    """A first-alert cell: the time, and debugger-v2's time ÷ ours when there is one."""
    cell = _fmt_s(r["first_alert_s"], timeout_s)
    if ref is None or r is ref or r["first_alert_s"] is None:
        return cell
    if ref["first_alert_s"] is None:
        return cell + " (> %.0f×)" % (timeout_s / r["first_alert_s"])
    return cell + " (%.1f×)" % (ref["first_alert_s"] / r["first_alert_s"])


def _rss(r, ref):
    """A peak-RSS cell: MB, and debugger-v2's peak ÷ ours when there is one."""
    cell = "%.0f MB" % (r["peak_rss"] / (1024.0 * 1024.0))
    if ref is None or r is ref:
        return cell
    return cell + " (%.2f×)" % (ref["peak_rss"] / max(r["peak_rss"], 1))


def _latencies(ms):
    if not ms:
        return "–"
    ms = sorted(ms)
    p99 = ms[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))]
    return "%.1f / %.1f / %.1f ms (%d)" % (statistics.median(ms), p99, ms[-1], len(ms))


def table(results, traces, write_s, timeout_s, load, repeat, dump_dir=None):
    """Returns the markdown result section (without its heading).

    Args:
      results: {column label: measure dict}, debugger-v2 under ``_DEBUGGER_LABEL`` if measured.
      traces: traces in the dump.
      write_s: seconds spent writing the dump.
      timeout_s: the give-up limit per plugin.
      load: (1-min load average before, after).
      repeat: rounds folded into each cell.
      dump_dir: the dump given with ``--dump_dir``; None when this script wrote it.
    """
    ref = results.get(_DEBUGGER_LABEL)
    cols = list(results.values())
    if dump_dir:
        dump = "Dump: %d graph execution traces in %s (given with --dump_dir). " % (traces, dump_dir)
    else:
        dump = (
            "Dump: %d FULL_HEALTH graph execution traces (%d ops, -inf from trace %d on), written "
            "in %.1f s by our FileSetWriter in TF's byte format (TF's own DebugDataReader reads "
            "it: debugger-v2 below). A real TF program cannot produce 1M traces here in reasonable "
            "time. " % (traces, _OPS, traces * 6 // 10, write_s))
    return "\n".join([
        dump + "Each column is a fresh `tensorboard --load_fast=false` process on this machine "
        "(2 cores shared with other work), run one after the other, %d interleaved rounds; cells "
        "are medians (page latencies pooled); times count from process start. Ratios: "
        "debugger-v2 ÷ ours. Load average (1 min) before / after: %.1f / %.1f."
        % (repeat, load[0], load[1]),
        "",
        "| measure | %s | target |" % " | ".join(results),
        "|---|%s---|" % ("---|" * len(cols)),
        "| tensorboard answers `/data/plugins_listing` | %s | – |"
        % " | ".join(_fmt_s(r["up_s"], timeout_s) for r in cols),
        "| first InfNan alert over HTTP | %s | ≥ 10× |"
        % " | ".join(_first_alert(r, ref, timeout_s) for r in cols),
        "| peak RSS, children included | %s | ≤ 400 MB |"
        % " | ".join(_rss(r, ref) for r in cols),
        "| digests page over HTTP, %d rows at random offsets, gzip: p50 / p99 / max (n) "
        "| %s | ≤ 50 ms |" % (_PAGE, " | ".join(_latencies(r["page_ms"]) for r in cols)),
        "",
        "First-alert times of every round: %s." % "; ".join(
            "%s: %s" % (label, ", ".join(_fmt_s(v, timeout_s) for v in r["all_first_alert_s"]))
            for label, r in results.items()),
    ]) + "\n"


def _median_run(runs):
    """Folds repeated measures of one configuration: medians, pooled page latencies.

    A time is None (gave up) if the median run gave up.
    """
    def median(key):
        values = sorted((r[key] for r in runs), key=lambda v: float("inf") if v is None else v)
        return values[(len(values) - 1) // 2]

    return {"up_s": median("up_s"), "first_alert_s": median("first_alert_s"),
            "peak_rss": median("peak_rss"),
            "page_ms": [ms for r in runs for ms in r["page_ms"]],
            "all_first_alert_s": [r["first_alert_s"] for r in runs]}


def _measure_all(dump, tmp, args):
    """Runs every configuration ``args.repeat`` times, interleaved so load drifts hit all alike.

    Returns:
      {label: folded measure dict}, debugger-v2 last.
    """
    configs = [("numerics, TF not installed", _tf_blocked_env(tmp)),
               ("numerics, TF installed", dict(os.environ))]
    runs = {label: [] for label, _ in configs}
    if not args.skip_debugger_v2:
        runs[_DEBUGGER_LABEL] = []
    for round_ in range(args.repeat):
        for label, env in configs:
            runs[label].append(measure_ours(dump, ".", args.pages, args.timeout_s, env))
        if not args.skip_debugger_v2:
            runs[_DEBUGGER_LABEL].append(measure_debugger_v2(dump, args.timeout_s))
        for label, measured in runs.items():
            last = {k: v for k, v in measured[-1].items() if k != "page_ms"}
            print("round %d %s: %r" % (round_ + 1, label, last), flush=True)
    return {label: _median_run(measured) for label, measured in runs.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dump_dir", help="existing single-file-set dump to use (else a temp one)")
    parser.add_argument("--traces", type=int, default=1_000_000)
    parser.add_argument("--pages", type=int, default=300, help="digest pages per numerics run")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; cells are medians")
    parser.add_argument("--timeout_s", type=int, default=900, help="give up on a plugin after this")
    parser.add_argument("--skip_debugger_v2", action="store_true")
    parser.add_argument("--write_docs", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="tb_e2e_") as tmp:
        dump = args.dump_dir or os.path.join(tmp, "dump")
        write_s = 0.0
        if not args.dump_dir:
            write_s = write_dump(dump, args.traces, args.traces * 6 // 10)
            print("wrote %d traces in %.1f s to %s" % (args.traces, write_s, dump), flush=True)
        results = _measure_all(dump, tmp, args)
    body = table(results, args.traces, write_s, args.timeout_s,
                 (load_before, os.getloadavg()[0]), args.repeat, args.dump_dir)
    print(body)
    if args.write_docs:
        docs_section.write_section(
            _DOCS, _SECTION, "Made by `python bench/tensorboard_e2e.py --write_docs`.\n\n" + body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
