"""Capture overhead in instructions, counted by callgrind, configurations side by side.

Step times on a shared host drift by tens of percent between runs (the same
configuration of ``capture_overhead.py`` read 1.12x and 1.29x on the MLP in one
evening), so a change worth 5% of a step cannot be seen there. The
instructions a step executes do not drift. This bench runs each configuration
in its own process under valgrind's callgrind, with instrumentation off until
its warm-up steps are done (``callgrind_control -i on``), counts the
instructions the training thread executes in ``--steps`` steps (two runs of
one configuration agree to 0.01%; the flush thread, whose timer fires more
often per step under valgrind's slowdown, is left out), and prints per
workload the instructions per step, those the capture adds, and for the tight
loop the instructions per captured op over uninstrumented.

Instructions are not time: the MLP's matrix kernels retire several per cycle,
the capture's pointer-chasing Python object work far fewer, so the capture's
share of the instructions is much smaller than its share of the step time.
``--cache`` says why: callgrind simulates the caches too (a few times slower),
and the table gains the misses per step the capture adds (per op in the tight
loop): first-level instruction and data misses, and misses of a last level
shaped like this host's second-level cache (read from sysfs; callgrind's own
default is the largest cache), that is the lines fetched from the shared
third level or memory. Of those, the table names the parts inside torch's own
libraries (``torch/lib``): their code (the boxed kernel wrappers the hook's
path runs, code the capture pushed out) and their data (mostly lines the
model's own kernels, MKL's matrix products, fetch again because the capture's
code and objects pushed them out of the second level). Between two matrix
products the capture's code and objects are out of the caches in turn: a
recorded op of the MLP misses on hundreds of lines that the tight loop, which
runs the same code 2000 times in a row, keeps. The counts compare a change's
host work between commits; step-time ratios come from ``capture_overhead.py``.

Workloads (``--workloads``): ``MLP (demo)`` and ``Tight loop`` of
``capture_workloads.py`` (2000 tiny ops per step). Configurations:
uninstrumented, then each mode of ``--modes`` on each capture path of
``--paths`` (``TB_NUMERICS_CAPTURE``), recorded in C, an empty
``TorchDispatchMode`` (each op called, nothing recorded: the floor of a path
that enters Python per op) and, when ``--paths`` has ``native``, an empty
native hook (its fallback handing each recorded op to a Python function that
does nothing: the floor of the native path). Needs valgrind (Debian:
``apt-get install valgrind``); a configuration takes one to two minutes.

    python bench/capture_instructions.py [--steps 10] [--jobs 2] \
        [--workloads "MLP (demo),Tight loop"] [--paths python,native] \
        [--modes NO_TENSOR,FULL_HEALTH] [--cache]
"""

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

WORKLOADS = ("MLP (demo)", "Tight loop")
STEPS = {"MLP (demo)": 10, "Tight loop": 1}  # the tight loop's step is 2000 ops
EMPTY_MODE = "empty TorchDispatchMode"  # each op called, nothing recorded
EMPTY_HOOK = "empty native hook"  # capture_overhead.EMPTY_HOOK (that imports torch)


def child(workload, mode, steps):
    """Runs one configuration under callgrind (instrumentation off until its warm-up
    is done); prints the capture path and error count as JSON."""
    import torch

    import capture_overhead  # bench/, the script's own folder
    import capture_workloads
    from tb_numerics_plugin import torch as tbn

    torch.set_num_threads(1)
    step = capture_workloads.WORKLOADS[workload][0]()[1]
    with tempfile.TemporaryDirectory() as dump, contextlib.ExitStack() as stack:
        handle = None
        if mode == EMPTY_MODE:
            stack.enter_context(capture_overhead._EmptyMode())
        elif mode == EMPTY_HOOK:
            from tb_numerics_plugin.torch import native

            stack.enter_context(capture_overhead.EmptyHook(native.load()))
        elif mode != "uninstrumented":
            handle = tbn.enable_dump_debug_info(dump, mode, circular_buffer_size=1000)
        for _ in range(3):
            step()
        pid = str(os.getpid())
        subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
        for _ in range(steps):
            step()
        subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)
        result = {"path": handle.capture_path if handle else None,
                  "errors": handle._session.errors if handle else 0}
        if handle is not None:
            handle.close()
    print(json.dumps(result))


MISSES = ("I1mr", "D1mr", "D1mw")  # callgrind's first-level misses: instruction, data read, write
LAST = ("ILmr", "DLmr", "DLmw")  # its last-level misses, the same three
TORCH_LIBRARIES = "/torch/lib/"  # where torch's own shared libraries are (kernels, MKL)


def second_level():
    """callgrind's ``--LL`` option for a last level shaped like this host's second-level
    cache (``--LL=size,ways,line``, from sysfs), or None where sysfs does not say."""
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(root)):
            folder = os.path.join(root, index)

            def read(name, folder=folder):
                with open(os.path.join(folder, name)) as f:
                    return f.read().strip()

            if read("level") == "2" and read("type") in ("Unified", "Data"):
                size = read("size")
                size = int(size[:-1]) * 1024 if size.endswith("K") else int(size)
                return "--LL=%d,%s,%s" % (size, read("ways_of_associativity"),
                                          read("coherency_line_size"))
    except (OSError, ValueError):
        pass
    return None


def last_level_by_object(text, kinds=LAST):
    """{shared object: its last-level misses of ``kinds``} of a callgrind output (self
    costs: the cost lines of each function, not the inclusive ones of its calls)."""
    events = re.search(r"^events: (.+)$", text, re.M).group(1).split()
    columns = [events.index(e) + 1 for e in kinds]  # +1: a cost line starts with its position
    names, current, skip, found = {}, None, False, {}
    for line in text.splitlines():
        if line.startswith(("ob=", "cob=")):
            m = re.match(r"c?ob=\((\d+)\)(?: (.*))?", line)
            if m.group(2):
                names[m.group(1)] = m.group(2)
            if line.startswith("ob="):
                current = names[m.group(1)]
        elif line.startswith("calls="):
            skip = True  # the next cost line is the call's inclusive cost
        elif line[:1].isdigit() or line[:1] in "+-*":
            if skip:
                skip = False
                continue
            values = line.split()
            found[current] = found.get(current, 0) + sum(
                int(values[i]) for i in columns if i < len(values))
    return found


def _counts(text):
    """{event: count} of a callgrind output's totals."""
    events = re.search(r"^events: (.+)$", text, re.M)
    totals = re.search(r"^totals: (.+)$", text, re.M)
    if events is None or totals is None:
        return None
    return dict(zip(events.group(1).split(), (int(n) for n in totals.group(1).split())))


def _run(workload, mode, path, steps, cache=False):
    """Instructions (and with ``cache`` cache misses) of one configuration's ``steps``
    steps, and what its child reported."""
    env = dict(os.environ, TB_NUMERICS_RECORD="c")
    if path:
        env["TB_NUMERICS_CAPTURE"] = path
    with tempfile.TemporaryDirectory() as out:
        level = second_level() if cache else None
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
                   "--cache-sim=" + ("yes" if cache else "no")] + ([level] if level else []) + [
                   "--callgrind-out-file=" + os.path.join(out, "callgrind.out"),
                   sys.executable, os.path.abspath(__file__), "--child", workload, mode,
                   "--steps", str(steps)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        counted = text = None
        if os.path.exists(os.path.join(out, "callgrind.out-01")):  # the main thread's
            with open(os.path.join(out, "callgrind.out-01")) as f:
                text = f.read()
            counted = _counts(text)
    if done.returncode != 0 or counted is None:
        raise SystemExit("%s %s (%s) failed:\n%s" % (workload, mode, path, done.stderr[-2000:]))
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["errors"]:
        raise SystemExit("%s %s (%s): the capture logged errors" % (workload, mode, path))
    result["instructions"] = counted["Ir"] / steps
    if cache:
        result["misses"] = {event: counted[event] / steps for event in MISSES + LAST}
        for key, kinds in (("torch_code", LAST[:1]), ("torch_data", LAST[1:])):
            result[key] = sum(n for name, n in last_level_by_object(text, kinds).items()
                              if TORCH_LIBRARIES in (name or "")) / steps
    return result


def table(workload, rows):
    """The markdown table of one workload: [(configuration, result)], uninstrumented first;
    with misses counted, the first-level instruction and data (read + write) misses added,
    the second-level ones (all three) and those of them inside torch's libraries."""
    base = rows[0][1]
    per_op = workload == "Tight loop"
    cache = "misses" in base
    head = "| configuration (%s) | M instructions / step | M added |" % workload
    rule = "|---|---:|---:|"
    if per_op:
        import capture_workloads  # bench/: imports torch, which only the tight loop's table needs

        ops = capture_workloads.TIGHT_LOOP_OPS
        head += " instructions / op over uninstrumented |"
        rule += "---:|"
    if cache:
        unit = "op" if per_op else "step"
        head += (" I1 misses added / %s | D1 misses added / %s | L2 misses added / %s |"
                 " of them torch's code | of them torch's data |" % (unit, unit, unit))
        rule += "---:|---:|---:|---:|---:|"
    lines = [head, rule]
    for name, r in rows:
        added = r["instructions"] - base["instructions"]
        line = "| %s | %.2f | %.2f |" % (name, r["instructions"] / 1e6, added / 1e6)
        if per_op:
            line += " %.0f |" % (added / ops)
        if cache:
            per = ops if per_op else 1
            extra = {e: (r["misses"][e] - base["misses"][e]) / per for e in MISSES + LAST}
            line += " %.0f | %.0f | %.0f | %.0f | %.0f |" % (
                extra["I1mr"], extra["D1mr"] + extra["D1mw"], sum(extra[e] for e in LAST),
                (r["torch_code"] - base["torch_code"]) / per,
                (r["torch_data"] - base["torch_data"]) / per)
        lines.append(line)
    return "\n".join(lines)


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=None,
                        help="steps counted (default: 10 for the MLP, 1 for the tight loop)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--paths", default="python,native")
    parser.add_argument("--modes", default="NO_TENSOR,FULL_HEALTH")
    parser.add_argument("--cache", action="store_true",
                        help="simulate the caches (first level, and a last level shaped like "
                             "this host's second) and count their misses too")
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "MODE"))
    args = parser.parse_args(argv)
    for workload in args.workloads.split(","):
        if workload not in WORKLOADS:
            parser.error("--workloads: %r is not one of %s" % (workload, ", ".join(WORKLOADS)))
    return args


def main(argv=None):
    args = _parse(argv)
    if args.child:
        child(args.child[0], args.child[1], args.steps)
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind (with callgrind_control) is not installed")
    paths = args.paths.split(",")
    configs = [("uninstrumented", "uninstrumented", None)] + [
        ("%s (%s)" % (mode, path), mode, path)
        for path in paths for mode in args.modes.split(",")] + [
        (EMPTY_MODE, EMPTY_MODE, None)]
    if "native" in paths:
        configs.append((EMPTY_HOOK, EMPTY_HOOK, None))
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for workload in args.workloads.split(","):
            steps = args.steps or STEPS[workload]
            for name, mode, path in configs:
                jobs[workload, name] = pool.submit(_run, workload, mode, path, steps, args.cache)
    for workload in args.workloads.split(","):
        rows = [(name, jobs[workload, name].result()) for name, _, _ in configs]
        for (name, _, path), (_, r) in zip(configs, rows):
            if r["path"] != path:  # the native hook fell back to the dispatch mode
                raise SystemExit("%s ran on the %s path" % (name, r["path"]))
        print(table(workload, rows))
        print()


if __name__ == "__main__":
    main()
