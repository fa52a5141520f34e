"""The writer under real faults: SIGKILL, a full disk, a file-size limit, same-second starts.

Every test runs ``writer_kill_program.py`` (a real torch training loop that
makes a NaN at a known step) in subprocesses and reads what they left with
the reader, as a user would after the fault. The figures each case measured
(records the writer accepted vs records the reader recovered) are printed
(``pytest -s``) for docs/reliability.md.
"""

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tb_numerics_plugin import records
from tb_numerics_plugin.analysis.summary import analyze_run
from tb_numerics_plugin.filenames import STATUS_SUFFIX, SUFFIXES
from dumps import read_run as _read

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "writer_kill_program.py")
INTERVAL = 0.4  # flush_interval_s of the programs
BAD_LINE = "return -torch.log(probs).mean()  # THE BAD LINE"
KINDS = ("execution", "graph_execution_traces")


def _start(tmp_path, name, *args, preexec_fn=None, dump_parent=None):
    dump = (dump_parent or tmp_path) / name
    err = open(tmp_path / (name + ".stderr"), "w")
    proc = subprocess.Popen([sys.executable, PROGRAM, str(dump), *args], stdout=subprocess.PIPE,
                            stderr=err, text=True, preexec_fn=preexec_fn)
    err.close()
    return proc, dump


def _wait_for(proc, word):
    """Reads the program's lines up to the first ``word ...`` one; returns its JSON."""
    for line in proc.stdout:
        if line.startswith(word + " "):
            return json.loads(line[len(word) + 1:])
    proc.wait(timeout=60)
    pytest.fail("program ended (rc %s) before printing %r" % (proc.returncode, word))


def _kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stdout.close()


def _sidecar(dump, prefix=None):
    paths = [prefix + "." + STATUS_SUFFIX] if prefix else list(dump.glob("*." + STATUS_SUFFIX))
    (path,) = paths
    with open(path) as f:
        return json.loads(f.read())


def _no_damage(dump):
    """Every record of every file frames and checksums correctly; no temporary file is left."""
    assert not [p.name for p in dump.iterdir() if p.name.endswith(".tmp")]
    for path in dump.iterdir():
        if path.name.rsplit(".", 1)[-1] in SUFFIXES:
            scanned = records.scan(str(path))
            assert not scanned.corruptions and scanned.next_offset == path.stat().st_size, path


def _story_is_whole(run, host=None):
    """Every kept trace and execution finds its graph op, stack frames and source file."""
    n = run.num_graph_execution_traces(host)
    for d in run.graph_execution_trace_digests(0, n, host=host):
        op = run.op_info(d["graph_id"], d["op_name"], host=host)  # KeyError: op not on disk
        for frame in run.stack_frames(op["stack_frame_ids"], host=host):
            assert 0 <= frame["file_index"] < len(run.source_files(host))
    for i in range(run.num_executions(host)):
        ex = run.execution(i, host=host)
        if ex.get("graph_id"):
            assert ex["graph_id"] in run.graph_ids(host)
        run.stack_frames(ex.get("stack_frame_ids") or [], host=host)


def _figures(case, accepted, run, host=None, sidecar=None):
    got = {"execution": run.num_executions(host),
           "graph_execution_traces": run.num_graph_execution_traces(host)}
    print("\n[writer-fault] %s: accepted %s%s recovered %s" % (
        case, {k: accepted[k] for k in KINDS},
        " sidecar %s" % {k: sidecar[k] for k in KINDS} if sidecar else "", got))
    return got


# ---- (a) SIGKILL at several points of a real training run ---------------------------------

KILL_POINTS = [
    # (case, word to wait for, seconds to wait after it)
    ("first step, before any timed flush", "step 0", 0.0),
    ("early training, just after a timed flush", "step 0", 0.25),
    ("mid-training", "step 300", 0.0),
    ("right after the NaN step", "step 600", 0.0),
    ("training after the NaN, one interval later", "step 700", INTERVAL),
    ("stalled after the NaN, 2 intervals later", "stall", 2 * INTERVAL),
]


@pytest.mark.parametrize("case,word,after", KILL_POINTS, ids=[k[0] for k in KILL_POINTS])
def test_sigkill_at_any_point_leaves_a_story_whose_every_trace_has_its_op(
        tmp_path, case, word, after):
    proc, dump = _start(tmp_path, "dump", "--steps", "900", "--nan-step", "600",
                        "--flush-interval", str(INTERVAL))
    try:
        accepted = _wait_for(proc, word)["written"]
        time.sleep(after)
    finally:
        _kill(proc)
    _no_damage(dump)
    run = _read(dump)
    _story_is_whole(run)
    status = _sidecar(dump)
    got = _figures(case, accepted, run, sidecar=status["written"])
    assert status["state"] == "open" and status["lost"] == {}
    for kind in KINDS:  # written before each flush's data: never less than what is on disk
        assert got[kind] <= status["written"][kind]
    first = analyze_run(run)["first_bad_tensor"]
    if word == "stall":  # stalled long enough: everything accepted is on disk
        assert got == {k: accepted[k] for k in KINDS}
    if first is not None or word in ("stall", "step 700"):
        assert first["op_type"] == "aten.log.default"
        assert first["source"] is not None and first["source"]["code"].startswith(BAD_LINE)


# ---- (d) the flush timer writes while the program stalls ----------------------------------

def test_a_stalled_program_has_its_last_records_on_disk_while_still_alive(tmp_path):
    # The NaN comes from an eager op outside any module, the last op before the stall:
    # its execution is still open when the program stops making progress.
    proc, dump = _start(tmp_path, "dump", "--steps", "3", "--nan-step", "-1", "--eager-nan",
                        "--flush-interval", str(INTERVAL))
    try:
        _wait_for(proc, "stall")
        time.sleep(2 * INTERVAL)
        deadline = time.monotonic() + 60  # a bound for a loaded machine, not a speed claim
        while True:
            run = _read(dump)
            if run.num_executions() and run.execution(run.num_executions() - 1)[
                    "op_type"] == "aten.log.default":
                break
            assert time.monotonic() < deadline, "the stalled execution never reached the disk"
            time.sleep(INTERVAL)
        assert proc.poll() is None  # read from a live, stalled process
        first = analyze_run(run)["first_bad_tensor"]
        assert first["op_type"] == "aten.log.default"
        assert first["source"]["code"].startswith("torch.log(torch.zeros(3))")
        status = _sidecar(dump)
        assert status["state"] == "open"
        assert status["written"]["execution"] == run.num_executions()
    finally:
        _kill(proc)


# ---- (b) ENOSPC / EFBIG -----------------------------------------------------------------------

def _limit_file_size(limit):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def _run_to_the_end(tmp_path, name, *args, preexec_fn=None, dump_parent=None):
    proc, dump = _start(tmp_path, name, "--exit", "--flush-interval", str(INTERVAL), *args,
                        preexec_fn=preexec_fn, dump_parent=dump_parent)
    out, _ = proc.communicate(timeout=300)
    stderr = (tmp_path / (name + ".stderr")).read_text()
    assert proc.returncode == 0, stderr
    (done,) = [json.loads(l[5:]) for l in out.splitlines() if l.startswith("done ")]
    return done, dump, stderr


def _assert_lost_and_said(done, dump, stderr, errno_name):
    assert done["same_losses"]  # the program's own result is untouched
    status = _sidecar(dump)
    assert status["state"] == "closed"
    assert status["lost"].get(errno_name, 0) > 0, status
    assert errno_name in status["first_error"] and dump.name in status["first_error"]
    assert stderr.count("tb-numerics could not write") == 1  # logged once, naming the file
    assert errno_name in stderr and str(dump) in stderr
    _no_damage(dump)
    if status["circular_buffer_size"] < 0:  # streaming: every accepted record is on disk or lost
        on_disk = sum(len(records.scan(str(p)).records) for p in dump.iterdir()
                      if p.name.rsplit(".", 1)[-1] in SUFFIXES and not p.name.endswith("metadata"))
        assert on_disk + sum(status["lost"].values()) == sum(status["written"].values())
    run = _read(dump)
    _story_is_whole(run)
    return status, run


@pytest.mark.parametrize("buffer", [-1, 1000], ids=["streaming", "ring"])
def test_file_size_limit_loses_records_counted_in_the_sidecar_never_the_step(tmp_path, buffer):
    done, dump, stderr = _run_to_the_end(
        tmp_path, "dump", "--steps", "300", "--buffer", str(buffer), "--flush-after-first-step",
        preexec_fn=_limit_file_size(64 << 10))
    status, run = _assert_lost_and_said(done, dump, stderr, "EFBIG")
    got = _figures("EFBIG 64 KiB, buffer %d (lost %s)" % (buffer, status["lost"]),
                   status["written"], run)
    # streaming: what fit under the limit; ring: the last window a rewrite could write
    # (a failed rewrite leaves the previous complete file, never an empty one)
    assert 0 < got["graph_execution_traces"] < status["written"]["graph_execution_traces"]


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 2 MiB tmpfs with about 128 KiB left free; skipped where mounting is not permitted."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command: the tmpfs variant needs one")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here: %s" % proc.stderr.strip())
    try:
        with open(mount / "filler", "wb") as f:
            f.write(b"\0" * ((2 << 20) - (128 << 10)))
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize("buffer", [-1, 1000], ids=["streaming", "ring"])
def test_full_disk_loses_records_counted_in_the_sidecar_never_the_step(
        tmp_path, small_tmpfs, buffer):
    done, dump, stderr = _run_to_the_end(
        tmp_path, "dump", "--steps", "300", "--buffer", str(buffer), "--flush-after-first-step",
        dump_parent=small_tmpfs)
    status, run = _assert_lost_and_said(done, dump, stderr, "ENOSPC")
    got = _figures("ENOSPC tmpfs, buffer %d (lost %s)" % (buffer, status["lost"]),
                   status["written"], run)
    assert 0 < got["graph_execution_traces"] < status["written"]["graph_execution_traces"]


# ---- (c) two processes, one host, one second, no RANK -----------------------------------------

def test_two_processes_started_in_the_same_second_keep_two_whole_file_sets(tmp_path):
    start_at = float(int(time.time()) + 12) + 0.05  # after both imported torch
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    procs = [subprocess.Popen([sys.executable, PROGRAM, str(tmp_path / "dump"), "--exit",
                               "--steps", "30", "--start-at", str(start_at)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    dones = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        (done,) = [json.loads(l[5:]) for l in out.splitlines() if l.startswith("done ")]
        dones.append(done)
    names = sorted(os.path.basename(d["prefix"]) for d in dones)
    assert names[0].split(".")[1] == names[1].split(".")[1], names  # the same second
    assert names[1].startswith(names[0] + ".p")  # the second one got a pid/token part
    run = _read(tmp_path / "dump")
    assert len(run.hosts) == 2
    for done in dones:
        host = os.path.basename(done["prefix"]).split(".", 2)[2]
        got = _figures("same-second start, set %s" % host, done["status"]["written"], run, host)
        assert got == {k: done["status"]["written"][k] for k in KINDS}
        _story_is_whole(run, host)
    _no_damage(tmp_path / "dump")


TF_READ = textwrap.dedent("""
    import sys
    from tensorflow.python.debug.lib import debug_events_reader
    with debug_events_reader.DebugDataReader(sys.argv[1]) as reader:
        reader.update()
        print(len(reader.executions()), len(reader.graph_execution_traces()))
""")


def test_tensorflow_reads_a_set_named_after_a_collision(tmp_path):
    pytest.importorskip("tensorflow")
    dump = tmp_path / "dump"
    dump.mkdir()
    host = socket.gethostname()
    now = int(time.time())
    # Every name the capture could want in the next minute is taken (by empty files).
    taken = [dump / ("tfdbg_events.%d.%s.metadata" % (t, host)) for t in range(now - 1, now + 60)]
    for path in taken:
        path.touch()
    done, _, _ = _run_to_the_end(tmp_path, "dump", "--steps", "5")
    for path in taken:
        path.unlink()
    (metadata,) = dump.glob("*.metadata")
    assert ".%s.p" % host in metadata.name  # the host, then the pid/token part
    out = subprocess.run([sys.executable, "-c", TF_READ, str(dump)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    executions, traces = map(int, out.stdout.split())
    written = done["status"]["written"]
    assert (executions, traces) == (written["execution"], written["graph_execution_traces"])


GRAPH_TOO_BIG = textwrap.dedent("""
    import json, sys
    from tb_numerics_plugin import writer
    from tb_numerics_plugin.proto import debug_event_pb2

    def op(name, pad=0):
        e = debug_event_pb2.DebugEvent()
        e.graph_op_creation.op_name = name
        e.graph_op_creation.input_names.append("x" * pad)
        return e

    def trace(name):
        e = debug_event_pb2.DebugEvent()
        e.graph_execution_trace.op_name = name
        return e

    w = writer.FileSetWriter(sys.argv[1], circular_buffer_size=-1, flush_interval_s=3600)
    w.write_event(op("small"))
    w.write_event(trace("small"))
    w.flush()
    w.write_event(op("big", pad=100000))  # over the file-size limit on its own
    for _ in range(10):
        w.write_event(trace("big"))
    w.flush()
    w.write_event(trace("small"))  # its op is on disk, but a definition before it is not
    w.close()
    print(json.dumps(w.status()))
""")


def test_traces_wait_for_their_definitions_and_are_counted_when_these_cannot_be_written(
        tmp_path):
    dump = tmp_path / "dump"
    proc = subprocess.run([sys.executable, "-c", GRAPH_TOO_BIG, str(dump)], capture_output=True,
                          text=True, timeout=120, preexec_fn=_limit_file_size(64 << 10))
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert status["lost"] == {"EFBIG": 1 + 10 + 1}  # the big op, its 10 traces, the last trace
    _no_damage(dump)
    run = _read(dump)
    assert run.num_graph_execution_traces() == 1  # the first trace, whose op made it
    _story_is_whole(run)
