"""Root cause: which tool names the op, module and source line that made the first inf/NaN.

Runs real model code (transformers GPT-2, Llama, Qwen2, T5, BERT, ViT;
``nn.TransformerEncoder`` with a causal mask; a CNN; TensorFlow's MNIST
demo), tiny random-init configs trained 1-3 steps on CPU, healthy (float32,
and float16 autocast with a GradScaler whose first steps overflow and are
skipped) or with one injected fault whose ground truth is derived from the
injection (``bench/root_cause_cases.py``). Each program runs once without a
tool (to check that it behaves as labeled) and once per tool, side by side:
tb-numerics (capture + ``tb-numerics report --json --check``), transformers'
``DebugUnderflowOverflow``, ``torch.autograd.detect_anomaly``, and on the TF
cases TF's ``InfNanMonitor`` (over the dump, as debugger-v2 runs it) and
``tf.debugging.enable_check_numerics`` (``bench/root_cause_tf.py``, in a
subprocess: TF never enters this process).

    python bench/root_cause.py [--cases NAME,NAME] [--json PATH] \
        [--docs docs/benchmarks.md]

``--docs`` rewrites the "Root cause" section of that file in place.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import docs_section  # noqa: E402
import root_cause_cases as cases_lib  # noqa: E402
import root_cause_tools as tools_lib  # noqa: E402

NA = cases_lib.NA
ANCHORS = ("op", "module", "line")
# tool -> the anchors it can name at all
TOOL_ANCHORS = {
    "tb-numerics": ("op", "module", "line"),
    "HF DebugUnderflowOverflow": ("module",),
    "torch detect_anomaly": ("op", "line"),
    "TF InfNanMonitor": ("op", "line"),
    "TF check_numerics": ("op", "line"),
}
TOOL_NAMES = tuple(TOOL_ANCHORS)


def _failure(exc):
    return {"error": "%s: %s" % (type(exc).__name__, str(exc)[:300])}


def _run_tool(tool_class, case, workdir, facts):
    """One run of ``case`` under a fresh tool; returns the tool's verdict (+ seconds)."""
    tool = tool_class(workdir)
    start = time.perf_counter()
    error = None
    try:
        case.program(tool)
    except Exception as exc:  # the tools that stop a run do it by raising
        error = exc
    try:
        verdict = tool.verdict(error, facts)
    except Exception as exc:
        verdict = _failure(exc)
    verdict["seconds"] = round(time.perf_counter() - start, 2)
    return verdict


def run_torch_case(case, workdir):
    """Reference run, then one run per torch tool. Returns the case's record."""
    record = {"name": case.name, "kind": case.kind, "family": case.family, "tools": {}}
    truth = case.truth() if case.truth else None
    record["truth"] = truth._asdict() if truth else None
    reference = tools_lib.Reference(workdir)
    start = time.perf_counter()
    try:
        facts = case.program(reference)
        reference.verdict(None, facts)
    except Exception as exc:
        record["mismatch"] = "the program raised %s" % _failure(exc)["error"]
        return record
    facts["bad_modules"] = reference.bad_modules
    record["seconds"] = round(time.perf_counter() - start, 2)
    record["facts"] = {k: facts[k] for k in ("losses", "params_finite", "bad_modules", "scale")}
    record["mismatch"] = cases_lib.mismatch(case, truth, facts)
    for tool_class in tools_lib.TOOLS:
        record["tools"][tool_class.name] = _run_tool(tool_class, case, workdir, facts)
    return record


def run_tf_cases(cases, workdir):
    """The TF cases, in one subprocess (bench/root_cause_tf.py); tb-numerics reads their dumps."""
    if not cases:
        return []
    out = os.path.join(workdir, "tf.json")
    args = ["%s:%d" % (c.name, cases_lib.TF_CASES[c.name]) for c in cases]
    proc = subprocess.run([sys.executable, os.path.join(HERE, "root_cause_tf.py"), workdir, out]
                          + args, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError("bench/root_cause_tf.py failed:\n" + proc.stderr[-3000:])
    with open(out) as f:
        results = json.load(f)
    records = []
    for case in cases:
        result = results[case.name]
        truth = case.truth() if case.truth else None
        facts = {"losses": result["losses"], "params_finite": None}
        record = {"name": case.name, "kind": case.kind, "family": case.family,
                  "truth": truth._asdict() if truth else None,
                  "seconds": round(result["seconds"], 2), "facts": facts,
                  "mismatch": cases_lib.mismatch(case, truth, facts), "tools": {}}
        start = time.perf_counter()
        try:
            verdict = tools_lib.report_verdict(result["dump"], None)
        except Exception as exc:
            verdict = _failure(exc)
        verdict["seconds"] = round(time.perf_counter() - start, 2)
        record["tools"]["tb-numerics"] = verdict
        record["tools"].update(result["tools"])
        records.append(record)
    return records


def score(record, tool):
    """``{"cell", "alarm", "error", "anchors"}`` of one tool on one case; None if n/a.

    ``anchors`` maps op/module/line to True (right), False (wrong or missed) or
    None (n/a: the tool cannot name it, or the case has no such truth).
    """
    verdict = record["tools"].get(tool)
    if verdict is None:
        return None
    if "error" in verdict:
        return {"cell": "error", "alarm": None, "error": True, "anchors": {}}
    alarm = bool(verdict["alarm"])
    if record["kind"] == "healthy":
        return {"cell": "false alarm" if alarm else "ok", "alarm": alarm, "error": False,
                "anchors": {}}
    truth = record["truth"]
    anchors = {}
    for anchor in ANCHORS:
        if anchor not in TOOL_ANCHORS[tool] or truth[anchor] == NA:
            anchors[anchor] = None
        elif not alarm:
            anchors[anchor] = False
        elif anchor == "op":
            anchors[anchor] = tools_lib.op_base(verdict["op"]) == tools_lib.op_base(truth["op"])
        elif anchor == "module":
            anchors[anchor] = verdict["module"] == truth["module"]
        else:
            anchors[anchor] = (verdict["file"], verdict["line"]) == (truth["file"], truth["line"])
    marks = {True: "✓", False: "✗", None: "n/a"}
    cell = " · ".join(marks[anchors[a]] for a in ANCHORS) if alarm else "missed"
    return {"cell": cell, "alarm": alarm, "error": False, "anchors": anchors}


def _percent(right, total):
    return "%d%% (%d / %d)" % (round(100.0 * right / total), right, total) if total else "n/a"


def summary(records, tool):
    """The summary cells of one tool over the cases that behaved as labeled."""
    scores = [(r, score(r, tool)) for r in records if not r.get("mismatch")]
    scores = [(r, s) for r, s in scores if s is not None]
    healthy = [s for r, s in scores if r["kind"] == "healthy"]
    faults = [s for r, s in scores if r["kind"] == "fault"]
    op_module = [s for s in faults if s["error"] or any(
        s["anchors"][a] is not None for a in ("op", "module"))]
    lines = [s for s in faults if s["error"] or s["anchors"]["line"] is not None]
    return {
        "false alarms (healthy)": "%d / %d" % (sum(bool(s["alarm"]) for s in healthy),
                                              len(healthy)) if healthy else "n/a",
        "faults detected": "%d / %d" % (sum(bool(s["alarm"]) for s in faults), len(faults))
        if faults else "n/a",
        "op + module right": _percent(sum(not s["error"] and all(
            s["anchors"][a] is not False for a in ("op", "module")) for s in op_module),
            len(op_module)),
        "line right": _percent(sum(bool(s["anchors"].get("line")) for s in lines), len(lines)),
        "errors": str(sum(s["error"] for _, s in scores)) if scores else "n/a",
    }


def table(records):
    """Markdown: one row per case, one column per tool, then the summary rows."""
    head = "| case | kind | %s |" % " | ".join(TOOL_NAMES)
    rows = [head, "|---|---|" + "---|" * len(TOOL_NAMES)]
    for r in records:
        if r.get("mismatch"):
            cells = ["case invalid: %s" % r["mismatch"]] + [""] * (len(TOOL_NAMES) - 1)
        else:
            cells = [(score(r, t) or {"cell": "n/a"})["cell"] for t in TOOL_NAMES]
        rows.append("| %s | %s | %s |" % (r["name"], r["kind"], " | ".join(cells)))
    sums = {t: summary(records, t) for t in TOOL_NAMES}
    for label in sums[TOOL_NAMES[0]]:
        rows.append("| **%s** | | %s |" % (label, " | ".join(sums[t][label] for t in TOOL_NAMES)))
    return "\n".join(rows)


def truth_table(records):
    """Markdown: the ground truth of each fault."""
    rows = ["| fault | what was injected | op | module | source line |", "|---|---|---|---|---|"]
    for r in records:
        t = r["truth"]
        if t is None:
            continue
        module = "None (no module)" if t["module"] is None else t["module"]
        rows.append("| %s | %s | `%s` | %s | %s:%s |" % (
            r["name"], t["what"], t["op"], "`%s`" % module if t["module"] not in (None, NA)
            else module, t["file"], t["line"]))
    return "\n".join(rows)


MEANING = """\
Columns: one per tool; a cell is `n/a` where the tool does not apply (torch tools on the TF
program, TF tools on torch programs). Healthy cases: `ok`, or `false alarm` (tb-numerics: an
InfNan alert, i.e. `tb-numerics report --check` exits 1; the other tools: they raised). Faults:
`missed` when the tool reported nothing, else op · module · line, each ✓ right, ✗ wrong, `n/a`
when the tool cannot name it (DebugUnderflowOverflow names only modules; detect_anomaly and the TF
tools name no module) or the case has no such truth (TF has no module paths). The tool's top-1
answer is scored against the truth: op by base name (`aten.log.default`, `LogBackward0` and `Log`
are all `log`; for tb-numerics a backward op counts as the forward op it differentiates, read from
its name `backward/<forward op>/...`); module by exact `named_modules()` path, None for code
outside every module (tb-numerics' module is the op name's scope when that scope is a module
path); line by file basename and line number (tb-numerics: `first_bad_tensor.source`;
detect_anomaly and TF's tools: the innermost frame outside the framework of the stack they print
or record). `op + module right` counts a fault right when every anchor the tool can name of the
two is right, over the faults where it can name at least one; `line right` likewise for lines.
`errors` counts runs where the tool itself failed. A case whose uninstrumented run did not behave
as labeled (a healthy run going non-finite, a fault not showing where its truth says) is marked
invalid and left out of the summary."""


def _commit():
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"
    return head + (" (working tree modified)" if dirty else "")


def _select(names):
    cases = cases_lib.all_cases()
    if not names:
        return cases
    wanted = names.split(",")
    known = {c.name for c in cases}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit("unknown case(s) %s; cases: %s" % (", ".join(unknown),
                                                            ", ".join(sorted(known))))
    return [c for c in cases if c.name in wanted]


def run(cases):
    """Runs the cases (torch ones here, TF ones in a subprocess); returns records in order."""
    records = {}
    with tempfile.TemporaryDirectory(prefix="root-cause-") as workdir:
        for case in cases:
            if case.program is not None:
                start = time.perf_counter()
                records[case.name] = run_torch_case(case, workdir)
                sys.stderr.write("%-32s %5.1f s\n" % (case.name, time.perf_counter() - start))
        tf = [c for c in cases if c.program is None]
        start = time.perf_counter()
        for record in run_tf_cases(tf, workdir):
            records[record["name"]] = record
        if tf:
            sys.stderr.write("%-32s %5.1f s\n" % ("TF cases", time.perf_counter() - start))
    return [records[c.name] for c in cases]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--json", default="", help="write the raw results there")
    parser.add_argument("--docs", default="")
    args = parser.parse_args(argv)
    cases = _select(args.cases)
    warnings.filterwarnings("ignore")  # detect_anomaly records its own warnings
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    import torch
    import transformers

    start = time.perf_counter()
    records = run(cases)
    seconds = time.perf_counter() - start
    stamp = "%s on %s (%s, %d CPUs), commit %s, torch %s, transformers %s; %d cases in %.0f s" % (
        datetime.date.today().isoformat(), platform.node(), platform.processor() or
        platform.machine(), os.cpu_count(), _commit(), torch.__version__,
        transformers.__version__, len(records), seconds)
    text = table(records)
    truths = truth_table(records)
    print(stamp)
    print(text)
    print()
    print(truths)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"stamp": stamp, "cases": records}, f, indent=1, default=str)
    if args.docs:
        docs_section.write_section(
            args.docs, "Root cause",
            "Measured %s with `python bench/root_cause.py`.\n\n%s\n\n%s\n\n"
            "Ground truth of the faults, derived from the injection "
            "(`bench/root_cause_cases.py`):\n\n%s\n" % (stamp, text, MEANING, truths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
