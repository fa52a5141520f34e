"""Installs the wheel into fresh venvs that already hold a user's TensorFlow, and checks we
break nothing: protobuf unchanged, `import tensorflow` clean, report and plugin routes working.

    python bench/install_beside_tf.py [--tf 2.17.* 2.19.*] [--keep DIR]

Prints one table row per TensorFlow version (needs the package index; minutes per version).
"""

import argparse
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1800, **kw)


def _version(python, dist):
    proc = _run([python, "-c", "import importlib.metadata as m; print(m.version(%r))" % dist])
    return proc.stdout.strip() if proc.returncode == 0 else "missing"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _routes_ok(venv, logdir):
    """Starts the venv's tensorboard on ``logdir``; True when our runs and summary routes answer."""
    port = _free_port()
    proc = subprocess.Popen([os.path.join(venv, "bin", "tensorboard"), "--logdir", logdir,
                             "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/")
    base = "http://127.0.0.1:%d/data/plugin/numerics/" % port
    try:
        for _ in range(120):
            try:
                runs = json.load(urllib.request.urlopen(base + "runs", timeout=5))["runs"]
                break
            except OSError:
                time.sleep(1)
        else:
            return False
        summary = json.load(urllib.request.urlopen(base + "summary?run=torch_mnist", timeout=30))
        return len(runs) == 2 and summary.get("first_bad_tensor") is not None
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def check(tf_spec, wheel, workdir):
    venv = os.path.join(workdir, "tf-" + tf_spec.replace("*", "x"))
    python = os.path.join(venv, "bin", "python")
    _run([sys.executable, "-m", "venv", venv])
    pip = [python, "-m", "pip", "install", "-q"]
    proc = _run(pip + ["tensorflow-cpu==" + tf_spec])
    if proc.returncode != 0:
        return {"tf": tf_spec, "error": proc.stderr[-500:]}
    before = _version(python, "protobuf")
    proc = _run(pip + [wheel])
    after = _version(python, "protobuf")
    tf_import = _run([python, "-c", "import tensorflow as tf; print(tf.__version__)"],
                     env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    report = _run([os.path.join(venv, "bin", "tb-numerics"), "report", "--check",
                   os.path.join(ROOT, "demo_logdir")], cwd="/")
    return {
        "tf": _version(python, "tensorflow-cpu"), "install_rc": proc.returncode,
        "protobuf": before if before == after else "%s -> %s" % (before, after),
        "import_tf_clean": tf_import.returncode == 0 and "Error" not in tf_import.stderr,
        "report_rc": report.returncode, "routes": _routes_ok(venv, os.path.join(ROOT, "demo_logdir")),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tf", nargs="+", default=["2.17.*", "2.19.*"])
    parser.add_argument("--keep", help="build the venvs here and keep them")
    args = parser.parse_args()
    workdir = args.keep or tempfile.mkdtemp(prefix="tbn-beside-tf-")
    wheels = os.path.join(workdir, "wheel")
    proc = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                 "-w", wheels, ROOT])
    if proc.returncode != 0:
        sys.exit(proc.stderr)
    (wheel,) = glob.glob(os.path.join(wheels, "*.whl"))
    print("| TensorFlow | protobuf (before -> after) | pip install | import tensorflow | "
          "report --check (1 = alerts) | plugin routes |")
    print("|---|---|---|---|---|---|")
    try:
        for spec in args.tf:
            r = check(spec, wheel, workdir)
            if "error" in r:
                print("| %s | could not install TF: %s | | | | |" % (spec, r["error"]))
                continue
            print("| %s | %s | exit %d | %s | exit %d | %s |" % (
                r["tf"], r["protobuf"], r["install_rc"], "clean" if r["import_tf_clean"] else
                "ERROR", r["report_rc"], "ok" if r["routes"] else "FAILED"))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
