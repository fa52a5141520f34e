"""Capture memory over a long run: does a training loop under the capture hold on to memory?

``capture_overhead.py`` enables the capture anew for a few steps per round,
so what builds up over hundreds of steps of one capture never shows there.
This bench runs each configuration in a fresh process: warm-up steps, then
``--steps`` timed steps under one enable, as a training loop does, and
reports per configuration:

- RSS growth over the timed steps (MB) and the RSS at their end;
- minor page faults per step: memory the process touches for the first
  time, which an allocator reusing freed memory does not need;
- the median step time, and its ratio to the uninstrumented run of the same
  workload (each in its own process: compare within a row's workload).

Workloads (``--workloads``):

- ``MLP (demo)``: the torch demo's MLP (784-500-10, batch 100, SGD).
- ``GPT-2 (tiny)``: a randomly initialised ``transformers`` GPT-2 (4 layers,
  width 128, 4 heads, vocabulary 500), batch 8 x 128 tokens, AdamW.

Configurations: uninstrumented, then NO_TENSOR and FULL_HEALTH on each
capture path of ``--paths`` (``TB_NUMERICS_CAPTURE``), circular buffer 1000.

    python bench/capture_memory.py [--steps 60] [--warmup 10] \
        [--paths python,native] [--workloads NAME,...]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

WORKLOADS = ("MLP (demo)", "GPT-2 (tiny)")
MODES = ("NO_TENSOR", "FULL_HEALTH")
PATHS = ("python", "native")


def _mlp():
    import capture_workloads  # bench/, the script's own folder

    return capture_workloads.WORKLOADS["MLP (demo)"][0]()[1]


def _gpt2():
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=4, n_head=4, n_embd=128, vocab_size=500,
                                     n_positions=128)
    model = transformers.GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 500, (8, 128), generator=torch.Generator().manual_seed(0))

    def step():
        optimizer.zero_grad()
        model(ids, labels=ids).loss.backward()
        optimizer.step()

    return step


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def _faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def child(workload, mode, steps, warmup):
    """Runs one configuration in this process; prints its figures as JSON."""
    import torch

    from tb_numerics_plugin import torch as tbn

    torch.set_num_threads(1)
    step = {"MLP (demo)": _mlp, "GPT-2 (tiny)": _gpt2}[workload]()
    with tempfile.TemporaryDirectory() as dump:
        handle = None
        if mode != "uninstrumented":
            handle = tbn.enable_dump_debug_info(dump, mode, circular_buffer_size=1000)
        for _ in range(warmup):
            step()
        rss, faults, times = _rss_mb(), _faults(), []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        result = {"growth_mb": _rss_mb() - rss, "rss_mb": _rss_mb(),
                  "faults": (_faults() - faults) / steps,
                  "step_ms": statistics.median(times) * 1e3,
                  "path": handle.capture_path if handle else None,
                  "errors": handle._session.errors if handle else 0}
        if handle is not None:
            handle.close()
    print(json.dumps(result))


def _run(workload, mode, path, args):
    env = dict(os.environ)
    if path:
        env["TB_NUMERICS_CAPTURE"] = path
    command = [sys.executable, os.path.abspath(__file__), "--child", workload, mode,
               "--steps", str(args.steps), "--warmup", str(args.warmup)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit("%s %s (%s) failed:\n%s" % (workload, mode, path, out.stderr[-2000:]))
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["errors"]:
        raise SystemExit("%s %s (%s): the capture logged errors" % (workload, mode, path))
    return result


def table(workload, rows):
    base = rows[0][1]["step_ms"]
    lines = ["| configuration (%s) | RSS growth MB | RSS MB | page faults / step | step ms | × |"
             % workload, "|---|---:|---:|---:|---:|---:|"]
    for name, r in rows:
        lines.append("| %s | %.0f | %.0f | %.0f | %.1f | %.2f |" % (
            name, r["growth_mb"], r["rss_mb"], r["faults"], r["step_ms"], r["step_ms"] / base))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--paths", default="python,native")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "MODE"))
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], args.steps, args.warmup)
        return 0
    paths, workloads = args.paths.split(","), args.workloads.split(",")
    if set(paths) - set(PATHS) or set(workloads) - set(WORKLOADS):
        parser.error("--paths among %s; --workloads among %s" % (PATHS, WORKLOADS))
    print("%d warm-up and %d timed steps per configuration, one process each, one thread"
          % (args.warmup, args.steps))
    for workload in workloads:
        rows = [("uninstrumented", _run(workload, "uninstrumented", None, args))]
        for path in paths:
            for mode in MODES:
                r = _run(workload, mode, path, args)
                rows.append(("%s (%s)" % (mode, r["path"]), r))
        print()
        print(table(workload, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
