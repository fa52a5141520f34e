"""Capture overhead on CPU: uninstrumented vs instrumented, per training step and per op.

Workloads (``--workloads``, comma-separated; all five by default): those of
``capture_workloads.py``, which says what each is and why it is there: ``MLP
(demo)``, ``MLP (foreach Adam)`` and ``Transformer encoder`` (one training step
each), ``Tight loop`` (the forward of 2000 tiny ops; its table gives (step time -
uninstrumented step time) / 2000 in µs, the host time per captured op) and
``Transformer encoder (compiled)``. One model of the compiled encoder serves every
configuration; it is compiled by an untimed first step before the rounds, which use
``--compiled-rounds`` and ``--compiled-steps``. Each enable and disable drops
Dynamo's caches, so each configuration's untimed warm step compiles the model
again. When compilation fails (no C++ compiler, say), its table gives the reason.

Configurations: uninstrumented; tb-numerics (circular buffer 1000, the
default) in every mode but FULL_TENSOR on the first capture path of
``--paths`` and in NO_TENSOR and FULL_HEALTH on each further one; Hugging
Face's ``DebugUnderflowOverflow`` and ``torch.autograd.detect_anomaly``; an
empty ``TorchDispatchMode`` (each op called, nothing recorded): the floor of any
per-op path that enters Python once per op; and, when ``--paths`` has
``native``, an empty native hook (the native hook's dispatch-key fallback
and its verdicts, each recorded op's values handed to a Python function that
does nothing): the floor of the native path as it enters Python once per
recorded op. The tight loop runs NO_TENSOR and FULL_HEALTH on
every path plus the others; the compiled encoder NO_TENSOR and FULL_HEALTH on
every path, nothing else.

Capture paths: a tb-numerics configuration sets ``TB_NUMERICS_CAPTURE``
(``python`` or ``native``; ``--paths`` defaults to the variable's value, else
``native``, the default path) while it enables the capture, and its row names the path
the capture handle reports it ran (``capture_path``): ``FULL_HEALTH
(native)``, or ``FULL_HEALTH (python, native requested)`` after a fallback.

Recorders: who records an op inside a module call, an optimizer step or a
backward pass once a path handed it over (``TB_NUMERICS_RECORD``): ``c``, the
capture's C hot path (``_record.c``), or ``python``, the same recording in
Python. ``--recorders`` (default both) multiplies the capture paths; rows of
the Python recorder say ``[Python recording]``.

Rounds are interleaved (each round times every configuration once, after one
untimed warm step, in an order shuffled per round) so that drifting machine
load hits all of them alike; the tables show medians of the per-step times
and their ratio to uninstrumented.
Each configuration steps an instance of the workload of its own (hooks such as
``DebugUnderflowOverflow`` stay on theirs); instances built alike run a few percent
apart for their life, the placement of their tensors say, so with ``--instances
per-configuration`` (the default) that difference stays in a configuration's ratio
for the whole run, and with ``per-round`` each configuration builds a new instance
every round, which spreads it over the rounds (docs/benchmarks.md, "Code fetched per
step": six runs of each on the MLP). The compiled workload keeps one instance.
A capture that logs errors stops the bench: its timing would mean nothing.

    python bench/capture_overhead.py [--rounds 5] [--steps 2] [--threads 1] \
        [--paths python,native] [--recorders c,python] [--workloads NAME,...] \
        [--compiled-rounds 3] [--compiled-steps 1] [--instances per-configuration] \
        [--docs docs/benchmarks.md]

``--docs`` rewrites the "Capture overhead" section of that file in place.
"""

import argparse
import contextlib
import datetime
import os
import platform
import random
import statistics
import sys
import tempfile
import time

import torch

import docs_section  # bench/, the script's own folder
from capture_workloads import TIGHT_LOOP_OPS, WORKLOADS, CompileFailed  # bench/ too
from torch.utils._python_dispatch import TorchDispatchMode

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.torch import native

MODES = ("NO_TENSOR", "CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH", "SHAPE", "FULL_NUMERICS")
PATH_MODES = ("NO_TENSOR", "FULL_HEALTH")  # the modes timed on every capture path
PATHS = ("python", "native")
PATH_VARIABLE = "TB_NUMERICS_CAPTURE"  # read by enable_dump_debug_info
RECORDERS = ("c", "python")
RECORDER_VARIABLE = "TB_NUMERICS_RECORD"  # read by enable_dump_debug_info
EMPTY_HOOK = "empty native hook"


@contextlib.contextmanager
def _variable(name, value):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def _capture(mode, path, recorder, dump_root):
    def enable():
        with _variable(PATH_VARIABLE, path), _variable(RECORDER_VARIABLE, recorder):
            return tbn.enable_dump_debug_info(
                tempfile.mkdtemp(dir=dump_root), mode, circular_buffer_size=1000)
    return enable


class _EmptyMode(TorchDispatchMode):
    """Calls each op and nothing else: the floor of any per-op path that enters Python."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class EmptyHook:
    """The native hook recording nothing: its dispatch-key fallback and verdicts,
    each recorded op's values handed to a Python function that does nothing (the floor
    of the native path, as ``_EmptyMode`` is the dispatch mode's). The verdicts are
    the hook's own: the extension keeps them for the process, whoever installs it.

    Args:
      module: the built native extension (``native.load()``).
    """

    def __init__(self, module):
        self._module = module
        self._handle = None

    def __enter__(self):
        self._handle = self._module.install(
            lambda func, args, out: None, native.judge, native._carrier_of, None, None)

    def __exit__(self, *exc_info):
        self._module.uninstall(self._handle)


def _hf(model):
    from transformers.debug_utils import DebugUnderflowOverflow

    DebugUnderflowOverflow(model)  # hooks stay on this model copy only
    return contextlib.nullcontext


def _configs(kind, paths, recorders, dump_root):
    """Returns [(name, requested capture path or None, setup(model) -> context factory)]."""
    configs = [("uninstrumented", None, lambda model: contextlib.nullcontext)]
    combos = [(path, recorder) for path in paths for recorder in recorders]
    for i, (path, recorder) in enumerate(combos):
        for mode in MODES if kind == "step" and i == 0 else PATH_MODES:
            label = mode if recorder == "c" else mode + " [Python recording]"
            configs.append((label, path, lambda model, enable=_capture(
                mode, path, recorder, dump_root): enable))
    if kind != "compiled":
        configs.append(("empty TorchDispatchMode", None, lambda model: _EmptyMode))
        module = native.load() if "native" in paths else None
        if module is not None:
            configs.append((EMPTY_HOOK, None, lambda model: lambda: EmptyHook(module)))
        configs.append(("HF DebugUnderflowOverflow", None, _hf))
        configs.append(("torch.autograd.detect_anomaly", None,
                        lambda model: lambda: torch.autograd.detect_anomaly(check_nan=True)))
    return configs


def _row_name(name, requested, ran, taken):
    """``name (path the handle ran)``, naming the request too when it differs or is ambiguous."""
    if requested is None:
        return name
    ran = "/".join(sorted(ran))
    short = "%s (%s)" % (name, ran)
    if requested == ran and short not in taken:
        return short
    return "%s (%s, %s requested)" % (name, ran, requested)


def measure(workload, rounds, steps, paths, recorders, dump_root, fresh=False):
    """Returns {row name: [seconds per step]} for one workload.

    ``fresh``: each configuration steps a new instance of the workload in every round,
    else one instance per configuration for all rounds (the compiled workload: one
    instance for all, whatever ``fresh`` says).

    Raises:
      CompileFailed: the compiled workload could not be compiled.
      RuntimeError: a capture logged errors.
    """
    build, kind = WORKLOADS[workload]
    shared = build() if kind == "compiled" else None  # one compilation for every configuration

    def instance(setup):  # (step, context factory) of a model set up for one configuration
        model, step = shared or build()
        return step, setup(model)

    configs = _configs(kind, paths, recorders, dump_root)
    instances = [instance(setup) for _, _, setup in configs]
    ran = [set() for _ in configs]
    times = [[] for _ in configs]
    shuffler = random.Random(0)
    for _ in range(rounds):
        order = list(range(len(configs)))
        shuffler.shuffle(order)  # no configuration always runs right after another
        for i in order:
            name, path, setup = configs[i]
            if fresh and shared is None:
                instances[i] = instance(setup)
            step, context = instances[i]
            with context() as handle:
                step()  # warm: first-sight costs (graphs, source files) are not steady state
                for _ in range(steps):
                    start = time.perf_counter()
                    step()
                    times[i].append(time.perf_counter() - start)
            if getattr(handle, "errors", 0):  # a timing of a failing capture means nothing
                raise RuntimeError("%s: %d capture errors" % (name, handle.errors))
            if path is not None:
                ran[i].add(getattr(handle, "capture_path", "python"))
    results = {}
    for (name, path, _), ran_i, times_i in zip(configs, ran, times):
        results[_row_name(name, path, ran_i, results)] = times_i
    return results


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def step_table(results):
    """Markdown table of medians and ratios, one column pair per workload.

    A workload's result is {row name: [seconds]}, or a string saying why it has none.
    """
    workloads = list(results)
    head = "| configuration | " + " | ".join("%s ms | ×" % w for w in workloads) + " |"
    rows = [head, "|---|" + "---:|---:|" * len(workloads)]
    names = list(dict.fromkeys(n for r in results.values() if isinstance(r, dict) for n in r))
    for w, r in results.items():
        if not isinstance(r, dict):
            rows.append("| %s: %s |" % (_cell(w), _cell(r)) + " |" * (2 * len(workloads)))
    for name in names:
        cells = []
        for r in results.values():
            if isinstance(r, dict) and name in r:
                base = statistics.median(r["uninstrumented"])
                med = statistics.median(r[name])
                cells += ["%.1f" % (med * 1e3), "%.2f" % (med / base)]
            else:
                cells += ["—", "—"]
        rows.append("| %s | %s |" % (name, " | ".join(cells)))
    return "\n".join(rows)


def per_op_table(result):
    """Markdown table: step time and host µs per op over the uninstrumented step."""
    base = statistics.median(result["uninstrumented"])
    rows = ["| configuration | step ms | µs per op over uninstrumented |", "|---|---:|---:|"]
    for name, times in result.items():
        med = statistics.median(times)
        per_op = ("(%.2f itself)" % (base / TIGHT_LOOP_OPS * 1e6) if name == "uninstrumented"
                  else "%.2f" % ((med - base) / TIGHT_LOOP_OPS * 1e6))
        rows.append("| %s | %.1f | %s |" % (name, med * 1e3, per_op))
    return "\n".join(rows)


def tables(results, args):
    """The markdown text of every table, each under a one-line caption."""
    parts = []
    by_kind = {}
    for w, r in results.items():
        by_kind.setdefault(WORKLOADS[w][1], {})[w] = r
    if "step" in by_kind:
        parts.append("One training step, eager:\n\n" + step_table(by_kind["step"]))
    for w, r in by_kind.get("per_op", {}).items():
        parts.append("%s: forward of %d tiny ops (`y = y + 1`, 10 float32 values):\n\n%s"
                     % (w, TIGHT_LOOP_OPS, per_op_table(r)))
    if "compiled" in by_kind:
        parts.append("One training step, compiled (`torch.compile`, inductor; %d rounds x %d "
                     "steps):\n\n%s" % (args.compiled_rounds, args.compiled_steps,
                                        step_table(by_kind["compiled"])))
    return "\n\n".join(parts)


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--paths", default=os.environ.get(PATH_VARIABLE) or "native",
                        help="capture paths, comma-separated: python, native")
    parser.add_argument("--recorders", default=",".join(RECORDERS),
                        help="who records the ops inside modules, comma-separated: c, python")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--compiled-rounds", type=int, default=3)
    parser.add_argument("--compiled-steps", type=int, default=1)
    parser.add_argument("--instances", choices=("per-configuration", "per-round"),
                        default="per-configuration",
                        help="one instance of the workload per configuration for all rounds, "
                             "or a new one per configuration and round")
    parser.add_argument("--docs", default="")
    args = parser.parse_args(argv)
    args.paths = args.paths.split(",")
    args.workloads = args.workloads.split(",")
    args.recorders = args.recorders.split(",")
    if set(args.recorders) - set(RECORDERS) or len(set(args.recorders)) < len(args.recorders):
        parser.error("--recorders: distinct names among %s" % ", ".join(RECORDERS))
    if set(args.paths) - set(PATHS) or len(set(args.paths)) < len(args.paths):
        parser.error("--paths: distinct names among %s" % ", ".join(PATHS))
    if set(args.workloads) - set(WORKLOADS):
        parser.error("--workloads: names among %s" % ", ".join(WORKLOADS))
    return args


def main(argv=None):
    args = _parse(argv)
    torch.set_num_threads(args.threads)
    results = {}
    with tempfile.TemporaryDirectory() as dump_root:
        for workload in args.workloads:
            compiled = WORKLOADS[workload][1] == "compiled"
            try:
                results[workload] = measure(
                    workload, args.compiled_rounds if compiled else args.rounds,
                    args.compiled_steps if compiled else args.steps, args.paths, args.recorders,
                    dump_root, fresh=args.instances == "per-round")
            except CompileFailed as e:
                results[workload] = "torch.compile failed: %s" % e
    text = tables(results, args)
    stamp = ("%s, %s, %s, torch %s, %d thread(s), %d interleaved rounds x %d steps, "
             "capture paths %s, recorders %s" % (
                 datetime.date.today().isoformat(), platform.node(),
                 platform.processor() or platform.machine(), torch.__version__, args.threads,
                 args.rounds, args.steps, ",".join(args.paths), ",".join(args.recorders)))
    print(stamp)
    print(text)
    if args.docs:
        docs_section.write_section(
            args.docs, "Capture overhead",
            "Measured %s with `python bench/capture_overhead.py`.\n\n%s\n" % (stamp, text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
