"""First alert from a logdir on S3 (a moto server on loopback) against the same logdir on disk.

Usage::

    python bench/reader_s3.py [--traces 1000000] [--repeat 2]

Writes ``bench/reader_scale.py``'s dump (``--traces`` FULL_HEALTH graph traces, 0.53
executions per trace, the first alert near the end), starts ``moto_server`` on a loopback
port, uploads the dump to a bucket, then measures, each in a fresh interpreter (best of
``--repeat``): time to the first alert (``Logdir(...).runs()``, ``run.update()``,
``analyze_run``) on the local directory, and on ``s3://`` with an empty mirror (every byte
fetched with range requests), then one more ``update()`` of that S3 run with nothing new
(the cost of staying fresh: one listing). Prints a markdown table.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def measure(logdir):
    from tb_numerics_plugin.analysis import analyze_run  # pylint: disable=import-outside-toplevel
    from tb_numerics_plugin.reader import Logdir  # pylint: disable=import-outside-toplevel

    t0 = time.perf_counter()
    source = Logdir(logdir)
    (name,) = source.runs()
    run = source.run(name)
    run.update()
    summary = analyze_run(run)
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    grew = run.update()
    again = time.perf_counter() - t1
    return {"first_alert_s": first, "idle_update_s": again, "grew": grew,
            "first_bad": summary["first_bad_tensor"]["index"],
            "traces": summary["num_graph_execution_traces"]}


def _child(logdir, repeat, env):
    runs = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as mirror:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure", logdir],
                                 check=True, capture_output=True, text=True,
                                 env=dict(env, TB_NUMERICS_MIRROR=mirror))
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print("%s: %s" % (logdir, runs[-1]), file=sys.stderr)
    return min(runs, key=lambda r: r["first_alert_s"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return 0
    import reader_scale  # pylint: disable=import-outside-toplevel
    import s3fs  # pylint: disable=import-outside-toplevel

    root = tempfile.mkdtemp(prefix="reader_s3_")
    server = None
    try:
        dump = os.path.join(root, "run")
        reader_scale.generate(dump, args.traces)
        size = sum(os.path.getsize(os.path.join(dump, f)) for f in os.listdir(dump))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen(
            [os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1",
             "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                   AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL="http://127.0.0.1:%d" % port)
        os.environ.update(env)
        fs = s3fs.S3FileSystem()
        fs.mkdir("bench")
        t0 = time.perf_counter()
        fs.put(dump, "bench/logs/run", recursive=True)
        print("uploaded %.0f MB in %.1f s" % (size / 1e6, time.perf_counter() - t0),
              file=sys.stderr)
        local = _child(dump, args.repeat, env)
        remote = _child("s3://bench/logs", args.repeat, env)
    finally:
        if server is not None:
            server.terminate()
        shutil.rmtree(root, ignore_errors=True)
    assert local["first_bad"] == remote["first_bad"] and local["traces"] == remote["traces"]
    print("%d graph traces + executions (%.0f MB), moto %s on loopback, best of %d" % (
        local["traces"], size / 1e6, _moto_version(), args.repeat))
    print()
    print("| logdir | first alert | vs local | update with nothing new |")
    print("|---|---|---|---|")
    for label, r in (("local directory", local), ("s3:// (empty mirror)", remote)):
        print("| %s | %.2f s | %.2fx | %.3f s |" % (
            label, r["first_alert_s"], r["first_alert_s"] / local["first_alert_s"],
            r["idle_update_s"]))
    return 0


def _moto_version():
    import moto  # pylint: disable=import-outside-toplevel

    return moto.__version__


if __name__ == "__main__":
    sys.exit(main())
