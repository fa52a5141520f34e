"""Host time per op in a forked child of a capturing process (a DataLoader worker).

A process forked while a capture runs (``DataLoader`` workers with the fork
start method) inherits the capture's per-op hook but not its writer: it must
record nothing, and its ops should cost what they cost without a capture. This
bench times a tight loop of eager ops (``y = y + 1`` on 10 float32 values) in
the parent without a capture, then, per capture path (``TB_NUMERICS_CAPTURE``),
in children forked while a NO_TENSOR capture runs, and prints the µs per op each
child adds over the uninstrumented loop. Rounds alternate the configurations
and each cell is the median of the rounds' best-of-three loops.

    python bench/capture_fork.py [--ops 20000] [--rounds 5] [--paths native,python]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from capture_overhead import PATH_VARIABLE, _variable  # noqa: E402 (bench/, this folder)
from tb_numerics_plugin import torch as tbn  # noqa: E402


def tight_loop(ops):
    """µs per op of the best of three loops of ``ops`` tiny eager ops."""
    best = float("inf")
    for _ in range(3):
        y = torch.zeros(10)
        start = time.perf_counter()
        for _ in range(ops):
            y = y + 1
        best = min(best, time.perf_counter() - start)
    return best / ops * 1e6


def in_forked_child(path, ops):
    """The child's µs per op, forked while a NO_TENSOR capture on ``path`` runs; and the
    path the capture ran (the native hook falls back to the dispatch mode)."""
    with tempfile.TemporaryDirectory() as dump, _variable(PATH_VARIABLE, path):
        with tbn.enable_dump_debug_info(dump, "NO_TENSOR", circular_buffer_size=1000) as handle:
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: reports through the pipe, never returns
                try:
                    os.write(write_end, ("%.6f" % tight_loop(ops)).encode())
                finally:
                    os._exit(0)
            os.close(write_end)
            with os.fdopen(read_end, "rb") as answer:
                text = answer.read()
            os.waitpid(pid, 0)
            ran = handle.capture_path
    if not text:
        raise SystemExit("the child forked under the %s path reported nothing" % path)
    return float(text), ran


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--paths", default="native,python")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    paths = args.paths.split(",")
    times = {"uninstrumented": []}
    times.update({path: [] for path in paths})
    ran = {}
    for _ in range(args.rounds):
        times["uninstrumented"].append(tight_loop(args.ops))
        for path in paths:
            us, ran[path] = in_forked_child(path, args.ops)
            times[path].append(us)
    base = statistics.median(times["uninstrumented"])
    print("| configuration | µs per op | µs per op added |")
    print("|---|---:|---:|")
    print("| uninstrumented (parent, no capture) | %.2f | |" % base)
    for path in paths:
        med = statistics.median(times[path])
        print("| forked child, NO_TENSOR capture (%s) | %.2f | %.2f |" % (ran[path], med,
                                                                          med - base))


if __name__ == "__main__":
    main()
