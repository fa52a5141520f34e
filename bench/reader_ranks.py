"""Ranks read in parallel: time to the first alert of a run of R ranks, by worker processes.

Usage::

    python bench/reader_ranks.py [--ranks 8] [--traces 1000000] [--repeat 1] [--keep DIR]

Writes one rank's FULL_HEALTH dump with ``bench/reader_scale.py``'s generator (``--traces``
graph traces of a four-graph training step, the Log op going -inf near the end) and copies
its file set under R rank names (``tfdbg_events.<ts>.bench.rank<i>.*``), so every rank holds
the same records. Then, each in a fresh interpreter (peak RSS its own), ``RunReader.update``
plus ``analyze_run`` (the first bad tensor merged across ranks) with ``workers`` = 1 (one
after the other, in-process) and 2 ... the cores of this machine. Prints a markdown table:
seconds, ratio to one worker, and the peak RSS of the reading process (the workers' own
memory is not in it).
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def make_run(root, ranks, traces):
    """``root/job``: ``ranks`` copies of one generated file set, one per rank name."""
    import reader_scale  # pylint: disable=import-outside-toplevel

    base = os.path.join(root, "base")
    reader_scale.generate(base, traces)
    run = os.path.join(root, "job")
    os.makedirs(run)
    for name in os.listdir(base):
        stamp_host, suffix = name.split(".bench.", 1)
        for rank in range(ranks):
            shutil.copyfile(os.path.join(base, name),
                            os.path.join(run, "%s.bench.rank%d.%s" % (stamp_host, rank, suffix)))
    shutil.rmtree(base)
    return run


def measure(run_dir, workers):
    """One reading: seconds to index every rank and to the first alert, and the answer."""
    from tb_numerics_plugin.analysis import analyze_run  # pylint: disable=import-outside-toplevel
    from tb_numerics_plugin.reader.run import RunReader  # pylint: disable=import-outside-toplevel

    t0 = time.perf_counter()
    run = RunReader(run_dir, "job")
    run.update(workers=workers)
    t_index = time.perf_counter() - t0
    summary = analyze_run(run)
    t_alert = time.perf_counter() - t0
    first = summary["first_bad_tensor"]
    return {"workers": workers, "index_s": t_index, "first_alert_s": t_alert,
            "hosts": len(run.hosts), "traces": summary["num_graph_execution_traces"],
            "first_bad": first and [first["host"], first["index"]],
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _child(run_dir, workers, repeat):
    cmd = [sys.executable, os.path.abspath(__file__), "--measure", run_dir, str(workers)]
    runs = []
    for _ in range(repeat):
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print("workers %d: %s" % (workers, json.dumps(runs[-1])), file=sys.stderr)
    return min(runs, key=lambda r: r["first_alert_s"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--traces", type=int, default=1_000_000, help="graph traces per rank")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--keep", help="write the dump here and keep it")
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure[0], int(args.measure[1]))))
        return 0
    from tb_numerics_plugin.reader import parallel  # pylint: disable=import-outside-toplevel

    cores = parallel.cores()
    root = args.keep or tempfile.mkdtemp(prefix="reader_ranks_")
    try:
        t0 = time.perf_counter()
        run_dir = make_run(root, args.ranks, args.traces)
        size = sum(os.path.getsize(os.path.join(run_dir, f)) for f in os.listdir(run_dir))
        print("%d ranks x %d traces (%.0f MB) written in %.0f s; %d cores" % (
            args.ranks, args.traces, size / 1e6, time.perf_counter() - t0, cores),
            file=sys.stderr)
        results = [_child(run_dir, w, args.repeat) for w in range(1, max(cores, 1) + 1)]
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    answers = {json.dumps(r["first_bad"]) for r in results}
    assert len(answers) == 1, "the workers changed the answer: %s" % answers
    base = results[0]["first_alert_s"]
    print("%d ranks x %d graph traces (%.0f MB), first bad tensor %s" % (
        args.ranks, args.traces, size / 1e6, results[0]["first_bad"]))
    print()
    print("| workers (cores used) | index all ranks | first alert | vs 1 worker | peak RSS (reading process) |")
    print("|---|---|---|---|---|")
    for r in results:
        print("| %d | %.2f s | %.2f s | %.2fx | %.0f MB |" % (
            r["workers"], r["index_s"], r["first_alert_s"], r["first_alert_s"] / base,
            r["rss_mb"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
