"""Run discovery at scale: a logdir of N run directories, listed and opened as the plugin does.

The plugin's first ``runs`` request lists the runs (``Logdir.runs()``) and opens each one
(``Logdir.run(name)``); this times both and the peak memory, for each N given.

    python bench/reader_runs.py [--runs 2000 10000] [--keep DIR]

Each run directory holds one empty file set (six files named as tfdbg2 names
them): discovery reads names, not contents. Run it with ``PYTHONPATH`` pointing
at another checkout to compare implementations.
"""

import argparse
import os
import resource
import shutil
import tempfile
import time
import tracemalloc

from tb_numerics_plugin.filenames import SUFFIXES
from tb_numerics_plugin.reader import Logdir


def make_logdir(root, n):
    """``n`` run directories ``job/run_00000 ...`` under ``root``, 100 per parent folder."""
    for i in range(n):
        d = os.path.join(root, "group_%03d" % (i // 100), "run_%05d" % i)
        os.makedirs(d)
        for suffix in SUFFIXES:
            open(os.path.join(d, "tfdbg_events.1700000000.vm.%s" % suffix), "wb").close()


def measure(root):
    """Seconds and peak traced MiB to list every run and open each one."""
    tracemalloc.start()
    start = time.perf_counter()
    logdir = Logdir(root)
    names = logdir.runs()
    listed = time.perf_counter() - start
    for name in names:
        logdir.run(name)
    total = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1] / 2 ** 20
    tracemalloc.stop()
    return len(names), listed, total, peak


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--keep", help="build the logdirs here and keep them")
    args = parser.parse_args()
    print("| runs | list (s) | list + open every run (s) | peak traced MiB |")
    print("|---:|---:|---:|---:|")
    for n in args.runs:
        root = os.path.join(args.keep, str(n)) if args.keep else tempfile.mkdtemp()
        try:
            if not os.path.isdir(os.path.join(root, "group_000")):
                make_logdir(root, n)
            found, listed, total, peak = measure(root)
            assert found == n, (found, n)
            print("| %d | %.2f | %.2f | %.1f |" % (n, listed, total, peak), flush=True)
        finally:
            if not args.keep:
                shutil.rmtree(root)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("\nmax RSS of this process: %.0f MiB" % rss)


if __name__ == "__main__":
    main()
