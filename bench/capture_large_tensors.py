"""A chain of elementwise ops on large CPU tensors under the capture, in fresh processes.

Where a tensor's memory comes from glibc's heap (CPU tensors; CUDA ones come from the caching
allocator), what else the process allocates decides whether a freed block is reused: small
blocks left among the large ones make glibc carve later small requests out of freed tensor
memory, and the next large tensor then takes fresh memory, with page faults where the heap
grows again. How often that happens differs from process to process, so this bench runs
``--processes`` fresh ones. Each times ``--rounds`` interleaved rounds of uninstrumented, the
empty native hook and the native capture (C recording) in ``--mode``, set up as
``capture_parts.py`` sets them up (a capture that logs errors stops the bench): a
module whose forward runs ``y = y + 1`` ``--ops`` times on ``--numel`` float32 values under
``torch.no_grad()``, after one untimed call. It prints per process the median µs per op and
minor page faults per op of each configuration, then the medians over the processes.

    python bench/capture_large_tensors.py [--processes 8] [--rounds 12] [--ops 50] \
        [--numel 1000000] [--mode NO_TENSOR]
"""

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time

CONFIGS = ("uninstrumented", "empty native hook", "capture")


def child(args):
    """Times the configurations in this process; prints {config: [µs per op, faults per op]}."""
    import torch

    import capture_parts  # bench/, the script's own folder
    from tb_numerics_plugin.torch import native

    torch.set_num_threads(1)
    if native.load() is None:
        raise SystemExit("the native hook is unavailable: %s" % native.failure())

    class Chain(torch.nn.Module):
        def forward(self, y):
            for _ in range(args.ops):
                y = y + 1
            return y

    chain, x = Chain(), torch.zeros(args.numel)
    times = {name: [] for name in CONFIGS}
    faults = {name: [] for name in CONFIGS}
    shuffler = random.Random(0)
    with tempfile.TemporaryDirectory() as root:
        for _ in range(args.rounds):
            order = list(CONFIGS)
            shuffler.shuffle(order)
            for name in order:
                with capture_parts._configured(name, args.mode, root), torch.no_grad():
                    chain(x)
                    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    start = time.perf_counter()
                    chain(x)
                    times[name].append((time.perf_counter() - start) / args.ops * 1e6)
                    faults[name].append(
                        (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / args.ops)
    print(json.dumps({name: [statistics.median(times[name]), statistics.median(faults[name])]
                      for name in CONFIGS}))


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--ops", type=int, default=50)
    parser.add_argument("--numel", type=int, default=1_000_000)
    parser.add_argument("--mode", default="NO_TENSOR")
    parser.add_argument("--child", action="store_true")
    return parser.parse_args(argv)


def main(argv=None):
    args = _parse(argv)
    if args.child:
        child(args)
        return
    command = [sys.executable, os.path.abspath(__file__), "--child", "--rounds", str(args.rounds),
               "--ops", str(args.ops), "--numel", str(args.numel), "--mode", args.mode]
    rows = []
    for _ in range(args.processes):
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit("a process failed:\n%s" % done.stderr[-2000:])
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    label = "capture (%s)" % args.mode
    names = [label if name == "capture" else name for name in CONFIGS]
    print("%d processes x %d rounds, %d ops on %d float32 each\n"
          % (args.processes, args.rounds, args.ops, args.numel))
    print("| process | " + " | ".join("%s µs / op (faults / op)" % n for n in names) + " |")
    print("|---|" + "---:|" * len(CONFIGS))
    for i, row in enumerate(rows, 1):
        print("| %d | %s |" % (i, " | ".join("%.0f (%.0f)" % tuple(row[c]) for c in CONFIGS)))
    print("| median | %s |" % " | ".join(
        "%.0f (%.0f)" % (statistics.median(r[c][0] for r in rows),
                         statistics.median(r[c][1] for r in rows)) for c in CONFIGS))


if __name__ == "__main__":
    main()
