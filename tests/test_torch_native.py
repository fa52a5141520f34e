"""The native per-op path's choice (``torch/native.py``, ``torch/native_build.py``).

The whole torch test-suite runs on the default path (the native hook) and
again with ``TB_NUMERICS_CAPTURE=python`` (``make test``); these tests check
how a capture comes to one path or the other: the hook by default, the dispatch
mode by name, a bad name refused, the choice logged once, and a build that fails,
finds a lock left by a killed build, or waits for another process's build.
The records of the two paths are compared in ``test_torch_native_records.py``;
the hook inside the process it records in ``test_torch_native_process.py``.
"""

import logging
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.torch import native, native_build
from dumps import read_run
from native_programs import capture

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_native_hook_is_the_default_and_the_dispatch_mode_is_chosen_by_name(
        monkeypatch, tmp_path, caplog):
    monkeypatch.delenv(native.ENV, raising=False)
    assert native.load() is not None, native.failure()  # a compiler is here, and in CI
    with tbn.enable_dump_debug_info(str(tmp_path / "a"), "FULL_HEALTH") as handle:
        assert native.installed()
        torch.ones(3).exp()
    assert handle.capture_path == "native" and not native.installed()
    caplog.clear()  # (a first build's warning, in a fresh cache)
    with caplog.at_level(logging.INFO, logger="tb_numerics_plugin.torch"):
        handle = capture(monkeypatch, "python", tmp_path / "b", lambda: torch.ones(3).exp())
    assert handle.capture_path == "python"
    # the dispatch mode by name is no fallback: no warning for it
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    for run in ("a", "b"):  # eager ops: one execution each, the same on both paths
        ops_run = [e["op_type"] for e in read_run(tmp_path / run).execution_digests()]
        assert ops_run == ["aten.ones.default", "aten.exp.default"], (run, ops_run)


def test_a_bad_capture_path_names_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(native.ENV, "fast")
    with pytest.raises(ValueError, match="TB_NUMERICS_CAPTURE must be one of python, native, "
                                         "not 'fast'"):
        tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH")


FAILED_BUILD = textwrap.dedent('''
    import logging, sys, torch
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    from tb_numerics_plugin import torch as tbn
    with tbn.enable_dump_debug_info(sys.argv[1], "FULL_HEALTH") as handle:
        torch.full((3,), 0.0).log()
    print("path", handle.capture_path, "errors", handle._session.errors)
''')


def _build_env(tmp_path):
    """A fresh cache and no compiler: a build starts and fails at once."""
    env = dict(os.environ, TB_NUMERICS_CACHE=str(tmp_path / "c"),
               CXX=str(tmp_path / "no-such-compiler"), PYTHONPATH=ROOT)  # this checkout's name
    env.pop(native.ENV, None)
    return env


def test_a_failed_build_falls_back_to_the_dispatch_mode_and_is_not_tried_again(tmp_path):
    """The default path, where the hook cannot be built (no compiler): the build is
    announced (the program waits for it), and the dispatch mode records the run. The
    failure is noted in the cache: the next process says so without building, and
    ``tb-numerics build-native`` tries again."""
    script = tmp_path / "worker.py"
    script.write_text(FAILED_BUILD)
    env = _build_env(tmp_path)
    failed = tmp_path / "c" / "native" / native_build.build_name() / native_build.FAILED
    building = "WARNING tb-numerics: building the native capture hook for torch %s in %s" % (
        torch.__version__, failed.parent)
    fallback = "WARNING tb-numerics: per-op capture path: python (the native hook is unavailable"
    runs = []
    for dump in ("first", "second"):
        proc = subprocess.run([sys.executable, str(script), str(tmp_path / dump)], env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert "path python errors 0" in proc.stdout and fallback in proc.stderr
        first = analyze_run(read_run(tmp_path / dump))["first_bad_tensor"]
        assert first is not None and first["op_type"] == "aten.log.default"
        runs.append(proc.stderr)
    assert building in runs[0] and "no-such-compiler" in runs[0]
    assert "no-such-compiler" in failed.read_text()
    assert building not in runs[1]
    assert "an earlier build failed and is not tried again (%s; `tb-numerics build-native` " \
           "tries again)" % failed in runs[1] and "no-such-compiler" in runs[1]
    proc = subprocess.run([sys.executable, "-m", "tb_numerics_plugin", "build-native"],
                          env=env, capture_output=True, text=True, timeout=300)
    # (the CLI leaves logging unconfigured: Python's last-resort handler, no level name)
    assert proc.returncode != 0 and building.replace("WARNING ", "") in proc.stderr, proc.stderr
    assert "earlier build" not in proc.stderr and failed.exists()


def test_a_build_lock_left_by_a_killed_build_is_removed_not_waited_on(tmp_path):
    """torch's build (up to 2.13) waits on its lock file for ever; one found while no
    process holds the builders' flock was left by a killed build, however recent.
    Removed with a warning naming it, the build runs (and here fails at once: no
    compiler), and the capture goes on on the dispatch mode. torch 2.14 holds an OS lock
    of that file instead: the file is left alone, and does not block the build."""
    script = tmp_path / "worker.py"
    script.write_text(FAILED_BUILD)
    lock = tmp_path / "c" / "native" / native_build.build_name() / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()  # as a build killed a moment ago leaves it
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "dump")],
                          env=_build_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "path python errors 0" in proc.stdout
    assert "building the native capture hook for torch" in proc.stderr
    removed = "WARNING tb-numerics: removing %s, a build lock left" % lock
    if native_build.lock_file_blocks():
        assert removed in proc.stderr and not lock.exists()
    else:
        assert "removing" not in proc.stderr


def test_a_build_in_progress_in_another_process_is_waited_for(tmp_path):
    """Another process holding the builders' flock is building: a second one says so and
    waits (its torch lock stays), then goes on when the flock is released."""
    import fcntl

    script = tmp_path / "worker.py"
    script.write_text(FAILED_BUILD)
    directory = tmp_path / "c" / "native" / native_build.build_name()
    directory.mkdir(parents=True)
    (directory / "lock").touch()  # the live builder's torch lock
    stderr = tmp_path / "stderr.txt"
    with open(directory / native_build.BUILD_LOCK, "a") as held, open(stderr, "w") as err:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "dump")],
                                env=_build_env(tmp_path), stdout=subprocess.PIPE, stderr=err,
                                text=True)
        try:
            deadline = time.time() + 120
            while "waiting for it" not in stderr.read_text() and time.time() < deadline:
                assert proc.poll() is None, stderr.read_text()
                time.sleep(0.2)
            time.sleep(1)
            assert proc.poll() is None and (directory / "lock").exists(), stderr.read_text()
            (directory / "lock").unlink()  # the live build ends: its lock goes, then the flock
        finally:
            fcntl.flock(held.fileno(), fcntl.LOCK_UN)
        out, _ = proc.communicate(timeout=120)
    text = stderr.read_text()
    assert proc.returncode == 0, text
    assert "another process is building the native capture hook in %s; waiting for it" % (
        directory) in text
    assert "removing" not in text and "path python errors 0" in out
    assert text.index("waiting for it") < text.index("building the native capture hook for")


def test_the_choice_is_logged_once(monkeypatch, tmp_path, caplog):
    native._State.logged.clear()
    with caplog.at_level(logging.INFO, logger="tb_numerics_plugin.torch"):
        for i in range(2):
            capture(monkeypatch, "native", tmp_path / str(i), lambda: torch.ones(2).exp())
    said = [r.getMessage() for r in caplog.records if "per-op capture path" in r.getMessage()]
    assert said == ["tb-numerics: per-op capture path: native (C++ dispatch-key hook)"]
