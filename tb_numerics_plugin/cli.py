"""`tb-numerics report LOGDIR`: the numerics story of a dump, in a terminal (and `export`).

Usage::

    tb-numerics report LOGDIR [--run NAME] [--json] [--check]
    tb-numerics report --logdir LOGDIR ...      # as TensorBoard spells it
    python -m tb_numerics_plugin report LOGDIR  # the same command
    tb-numerics export LOGDIR OUT [--run NAME ...]   # Parquet by host (docs/export.md)
    tb-numerics --version

Exit status (``--check`` for 1, 3 and 5; docs/report.md):

- 0: done; with ``--check``: health was checked, every record written was
  read, and no non-finite value propagates (masked ones, e.g. attention
  masks, do not count);
- 1: ``--check`` and some InfNan alert (a propagating non-finite value);
- 2: usage: the logdir is missing, not a directory or unreadable, holds no
  dumps, or ``--run`` names no run (one line on stderr);
- 3: ``--check`` and no health could be read (every run was captured in
  NO_TENSOR or SHAPE mode, or holds no readable execution or trace);
- 4: internal error (a bug of ours: one line on stderr, the traceback with
  ``TB_NUMERICS_DEBUG=1``);
- 5: ``--check``, nothing propagates among the records read, but records
  were lost or unreadable (damaged, truncated, empty files other files refer
  to, a writer's losses, a writer that did not close): not "clean".

OverflowGrowth alerts (a module's abs max growing toward its dtype's limit,
from the numerics series) are printed first under "Numerics over time" but
are warnings: they never change the exit status.

``--json`` prints one JSON object (docs/report.md). The text report escapes
terminal control characters and bytes that are not UTF-8 (``\\x1b``), so
no dump can drive the terminal. Imports neither torch nor tensorflow.
"""

import argparse
import json
import os
import re
import sys
import time
import traceback

import tb_numerics_plugin
from tb_numerics_plugin import schema
from tb_numerics_plugin.analysis import alerts as alerts_lib
from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.reader import DumpError, Logdir

EXIT_OK, EXIT_ALERTS, EXIT_USAGE, EXIT_NO_HEALTH, EXIT_INTERNAL = 0, 1, 2, 3, 4
EXIT_INCOMPLETE = 5
# C0/C1 controls, DEL, and the bidirectional overrides that reorder what a terminal shows.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text):
    """``text`` safe for a terminal: controls as ``\\x1b`` / ``\\u202e``, bytes that are not
    UTF-8 (kept by the OS as surrogate escapes) as ``\\xff``. Nothing is dropped."""
    text = str(text)
    if any("\udc80" <= c <= "\udcff" for c in text):
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return _CONTROL.sub(lambda m: "\\x%02x" % ord(m.group()) if ord(m.group()) < 0x100
                        else "\\u%04x" % ord(m.group()), text)


class _Progress:
    """Progress lines on stderr, only when stderr is a terminal."""

    def __init__(self, stream):
        self._stream = stream
        self._on = hasattr(stream, "isatty") and stream.isatty()

    def show(self, text):
        if self._on:
            self._stream.write("\r\033[K" + text)
            self._stream.flush()

    def done(self):
        if self._on:
            self._stream.write("\r\033[K")
            self._stream.flush()


def _counts_text(h):
    if h is None:
        return "no health recorded"
    if "nan" not in h and not h.get("any_inf_or_nan"):
        return "finite"
    text = schema.counts_phrase(h)
    extra = [h[k] for k in ("dtype",) if k in h] + (["rank %d" % h["rank"]] if "rank" in h else [])
    return text + (" (%s)" % ", ".join(extra) if extra else "")


def _input_text(item):
    h = item["health"]
    kind = " (%s)" % item["op_type"] if item["op_type"] else ""
    if h is None:
        return "%s%s: not traced" % (item["name"], kind)
    if h.get("any_inf_or_nan"):
        return "%s%s: already bad: %s" % (item["name"], kind, _counts_text(h))
    text = "%s%s: finite" % (item["name"], kind)
    if "zero" in h:
        text += ", %d zeros of %d" % (h["zero"], h["size"])
    return text


def _first_bad_lines(fb, run):
    where = "graph execution trace" if fb["kind"] == "graph_execution_trace" else "execution"
    graph = " in graph %s" % fb["graph_name"] if fb["graph_name"] else ""
    step = " at step %d" % fb["step"] if fb.get("step") is not None else ""
    lines = ["  first bad tensor: %s #%d on %s: %s:%d (%s)%s%s" % (
        where, fb["index"], fb["host"], fb["op_name"], fb["output_slot"], fb["op_type"], graph,
        step)]
    lines.append("    health: %s" % _counts_text(fb["health"]))
    lines.append("    why:    %s" % fb["explanation"])
    src, user = fb["source"], fb["user_source"]
    if src:
        lines.append("    where:  %s:%d in %s" % (src["file"], src["line"], src["func"]))
        lines.append("      %d | %s" % (src["line"], src["code"]))
    else:
        lines.append("    where:  no model or user frame in the op's creation stack")
    if user and user != src:
        lines.append("    called from: %s:%d in %s" % (user["file"], user["line"], user["func"]))
        lines.append("      %d | %s" % (user["line"], user["code"]))
    if fb["inputs"]:
        lines.append("    inputs:")
        lines.extend("      " + _input_text(i) for i in fb["inputs"])
    total, after = alerts_lib.list_alerts(run, host=fb["host"], alert_type="InfNan",
                                          begin=0, end=2)
    later = [a for a in after if (a["kind"], a["index"]) != (fb["kind"], fb["index"])]
    if total > 1 and later:
        a = later[0]
        lines.append("    after it: %d more InfNan alerts on %s (next: %s #%d %s)" % (
            total - 1, fb["host"], a["kind"].replace("_", " "), a["index"], a["op_name"]))
    return lines


def _run_lines(s, run):
    lines = ["run %s  (hosts: %s; mode %s)" % (s["run"], ", ".join(s["hosts"]) or "-",
                                              s["tensor_debug_mode"])]
    lines.append("  %d executions, %d graph execution traces, %d graphs" % (
        s["num_executions"], s["num_graph_execution_traces"], s["num_graphs"]))
    steps = s.get("steps") or {}
    if steps.get("count"):
        lines.append("  %d training step%s marked (%d to %d)" % (
            steps["count"], "" if steps["count"] == 1 else "s", steps["first"], steps["last"]))
    alarms = [(t, n) for t, n in s["alerts"].items() if t in alerts_lib.ALARMS]
    lines.append("  alerts: " + ", ".join("%s %d" % kv for kv in alarms))
    masked = s["alerts"].get("MaskedNonFinite", 0)
    if masked:
        lines.append("  masked: %d tensor%s held inf/NaN that never reached the loss, an output "
                     "or an optimizer step (MaskedNonFinite, not an alarm)"
                     % (masked, "" if masked == 1 else "s"))
    if s["first_bad_tensor"]:
        lines.extend(_first_bad_lines(s["first_bad_tensor"], run))
    elif s["health_available"]:
        lines.append("  no inf or NaN found" + (" among the records read" if s["incomplete"]
                                                else ""))
    lines.extend(_trends_lines(s))
    if s["incomplete"]:
        lines.append("  incomplete: records were lost or could not be read (see the warnings)")
    if s["warnings"]:
        lines.append("  warnings:")
        lines.extend("    " + w for w in s["warnings"])
    return lines


def _trends_lines(s):
    """The "Numerics over time" section: growth alerts first, then per host its steps and
    least headroom ([] when the run has no numerics series)."""
    trends, growth = s.get("trends") or {}, s.get("growth") or []
    if not trends:
        return []
    lines = ["  Numerics over time:"]
    lines.extend("    %s on %s: %s" % (a["alert_type"], a["host"], a["message"]) for a in growth)
    for host, t in trends.items():
        lines.append("    %s: %d step%s summarized (%d to %d): %s" % (
            host, t["steps"], "" if t["steps"] == 1 else "s", t["first_step"], t["last_step"],
            ", ".join(t["kinds"])))
        for e in t["lowest_headroom"]:
            abs_max = "" if e["abs_max"] is None else ", abs max %.3g" % e["abs_max"]
            lines.append("      least headroom: %s %s (%s): %.1f bits at step %d%s" % (
                e["module"], e["kind"], e["dtype"] or "dtype unknown", e["headroom_bits"],
                e["step"], abs_max))
    return lines


def _parser():
    parser = argparse.ArgumentParser(prog="tb-numerics", description="Numerics debugger reports.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    report = sub.add_parser("report", help="print the numerics report of a dump")
    report.add_argument("logdir", nargs="?",
                        help="directory holding tfdbg2 dumps (searched recursively)")
    report.add_argument("--logdir", dest="logdir_option", metavar="LOGDIR",
                        help="the same, spelled as TensorBoard's flag")
    report.add_argument("--run", help="only this run (a directory relative to LOGDIR)")
    report.add_argument("--json", action="store_true", help="print one JSON object")
    report.add_argument("--check", action="store_true",
                        help="exit 1 when a non-finite value propagates (an InfNan alert), "
                             "3 when no health could be read, 5 when none propagates but "
                             "records were lost or unreadable")
    export = sub.add_parser(
        "export", help="write the digests (one row per trace and execution) as Parquet, "
                       "partitioned by host (needs pyarrow; docs/export.md)")
    export.add_argument("logdir", help="directory holding tfdbg2 dumps (searched recursively)")
    export.add_argument("out", help="output directory (host=<label>/part-<run>.parquet)")
    export.add_argument("--run", action="append", dest="runs", metavar="RUN",
                        help="only this run (repeatable)")
    sub.add_parser(
        "build-native", help="compile the torch capture's native per-op hook now (else it is "
                             "built on first use; needs torch, a C++ compiler and ninja)")
    return parser


def build_native():
    """``tb-numerics build-native``: builds (or finds built) the torch capture's C++ hook."""
    try:
        # pylint: disable=import-outside-toplevel
        from tb_numerics_plugin.torch import native, native_build
    except ImportError as exc:
        return _fail("build-native needs torch: %s" % printable(exc))
    print("tb-numerics: building the native capture hook (about a minute on two cores, once per "
          "torch version) or loading it from %s" % native_build.cache_dir(), flush=True)
    module = native.load(retry=True)  # where an earlier build failed too
    if module is None:
        return _fail("the native capture hook could not be built: %s" % native.failure())
    print("tb-numerics: native capture hook ready: %s" % module.__file__)
    return EXIT_OK


def _version():
    import google.protobuf  # pylint: disable=import-outside-toplevel

    return "tb-numerics %s (protobuf runtime %s, Python %s)" % (
        tb_numerics_plugin.__version__, google.protobuf.__version__, sys.version.split()[0])


def _logdir_of(args):
    """The one logdir of ``report``, given as LOGDIR or --logdir; None and a message if not."""
    given = [d for d in (args.logdir, args.logdir_option) if d is not None]
    if not given:
        return None, "report needs a LOGDIR (or --logdir LOGDIR)"
    if len(given) == 2 and os.path.abspath(given[0]) != os.path.abspath(given[1]):
        return None, "two logdirs given (%s and --logdir %s): name one" % tuple(given)
    return given[0], None


_SUMMARY_FILE = re.compile(r"^events\.out\.tfevents\.")


def _no_dumps_message(path, shown=None):
    """Why a logdir has no run, with a hint when it holds TensorBoard summaries instead
    (``shown``: the name to print, e.g. the URL of a remote logdir's mirror ``path``)."""
    text = "%s: no tfdbg2 dumps found" % (shown or path)
    for _, _, files in os.walk(path):
        if any(_SUMMARY_FILE.match(f) for f in files):
            return text + (
                " (it holds TensorBoard summaries, events.out.tfevents.*, which are not debug "
                "dumps: write one with tb_numerics_plugin.torch.enable_dump_debug_info(DIR, "
                "\"FULL_HEALTH\") or tf.debugging.experimental.enable_dump_debug_info(DIR, "
                "tensor_debug_mode=\"FULL_HEALTH\"))")
    return text


def _fail(message, code=EXIT_USAGE):
    sys.stderr.write("tb-numerics: %s\n" % printable(message))
    return code


def report(args, out=None):
    """Runs `tb-numerics report`; returns the exit status."""
    out = out or sys.stdout
    path, problem = _logdir_of(args)
    if problem:
        return _fail(problem)
    try:
        logdir = Logdir(path)
        names = logdir.runs()
    except DumpError as e:
        return _fail(str(e))
    if not names:
        return _fail(_no_dumps_message(logdir.path, logdir.location))
    if args.run is not None:
        if args.run not in names:
            return _fail("no run %r in %s (runs: %s)" % (args.run, logdir.location,
                                                         ", ".join(names)))
        names = [args.run]
    progress = _Progress(sys.stderr)
    summaries, runs = [], []
    for i, name in enumerate(names):
        start = time.monotonic()
        progress.show("reading run %s (%d/%d)..." % (name, i + 1, len(names)))
        run = logdir.run(name)
        run.update(progress=lambda host, done, total, name=name, i=i: progress.show(
            "reading run %s (%d/%d), %s: %d%%" % (name, i + 1, len(names), host,
                                                 100 * done // total)))
        summaries.append(analyze_run(run))
        runs.append(run)
        progress.show("read run %s in %.1f s" % (name, time.monotonic() - start))
    progress.done()
    if args.json:
        out.write(json.dumps({"runs": summaries}, allow_nan=False, sort_keys=False) + "\n")
    else:
        lines = ["tb-numerics report: %s" % logdir.location]
        for s, run in zip(summaries, runs):
            lines.append("")
            lines.extend(_run_lines(s, run))
        out.write("\n".join(printable(line) for line in lines) + "\n")
    return _check_status(summaries) if args.check else EXIT_OK


def export(args, out=None):
    """Runs `tb-numerics export`; returns the exit status (0, or 2 with the reason)."""
    from tb_numerics_plugin import export as export_lib  # pylint: disable=import-outside-toplevel

    out = out or sys.stdout
    try:
        logdir = Logdir(args.logdir)
        names = logdir.runs()
    except DumpError as e:
        return _fail(str(e))
    if not names:
        return _fail(_no_dumps_message(logdir.path, logdir.location))
    unknown = [r for r in args.runs or () if r not in names]
    if unknown:
        return _fail("no run %r in %s (runs: %s)" % (unknown[0], logdir.location,
                                                     ", ".join(names)))
    progress = _Progress(sys.stderr)
    try:
        done = export_lib.export_logdir(
            logdir, args.out, args.runs,
            progress=lambda run, host, rows: progress.show(
                "exported run %s, host %s: %d rows" % (run, host, rows)))
    except export_lib.ExportError as e:
        progress.done()
        return _fail(str(e))
    progress.done()
    out.write("tb-numerics export: %d rows of %d run%s into %d file%s under %s\n" % (
        done["rows"], len(done["runs"]), "" if len(done["runs"]) == 1 else "s",
        len(done["files"]), "" if len(done["files"]) == 1 else "s", args.out))
    return EXIT_OK


def _check_status(summaries):
    """The ``--check`` exit status of the report of ``summaries`` (see the module docstring)."""
    if any(s["alerts"].get("InfNan") for s in summaries):
        return EXIT_ALERTS
    if not any(s["health_available"] for s in summaries):
        modes = sorted({s["tensor_debug_mode"] for s in summaries})
        if modes == ["UNSPECIFIED"]:
            return _fail("no execution or graph execution trace could be read: nothing to "
                         "check (see the warnings)", EXIT_NO_HEALTH)
        return _fail("no run records health (tensor_debug_mode %s): nothing to check; capture "
                     "with FULL_HEALTH, CONCISE_HEALTH or CURT_HEALTH" % "/".join(modes),
                     EXIT_NO_HEALTH)
    lost = [s["run"] for s in summaries if s["incomplete"]]
    if lost:
        return _fail("no non-finite value propagates among the records read, but records were "
                     "lost or unreadable in run%s %s (see the warnings): not a clean check"
                     % ("" if len(lost) == 1 else "s", ", ".join(lost)), EXIT_INCOMPLETE)
    return EXIT_OK


def main(argv=None):
    """Entry point of the `tb-numerics` command; returns the exit status."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):  # a terminal that is not UTF-8 gets escapes
            stream.reconfigure(errors="backslashreplace")
    args = _parser().parse_args(argv)
    try:
        if args.command == "report":
            return report(args)
        if args.command == "export":
            return export(args)
        if args.command == "build-native":
            return build_native()
        return _fail("unknown command %r" % args.command)
    except Exception as exc:  # a bug of ours: not "alerts found" (1), not usage (2)
        sys.stderr.write("tb-numerics: internal error: %s: %s (set TB_NUMERICS_DEBUG=1 for the "
                         "traceback)\n" % (type(exc).__name__, printable(exc)))
        if os.environ.get("TB_NUMERICS_DEBUG"):
            traceback.print_exc()
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
