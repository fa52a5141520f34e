"""FileSetWriter: naming, metadata first, circular buffer, streaming flushes, idempotence,
the status sidecar, write ordering, the flush thread, write errors and forks."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from tb_numerics_plugin import filenames, records, status_sidecar, writer
from tb_numerics_plugin.proto import debug_event_pb2


def _events(path):
    return [debug_event_pb2.DebugEvent.FromString(p) for _, p in records.scan(path).records]


def _execution(i):
    event = debug_event_pb2.DebugEvent()
    event.execution.op_type = "Op%d" % i
    return event


def test_writes_six_files_named_like_tensorflow_and_a_status_sidecar(tmp_path):
    w = writer.FileSetWriter(str(tmp_path), host_name="hostA", part="rank1")
    w.close()
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 7
    assert names.pop() == "%s.%s" % (os.path.basename(w.prefix), filenames.STATUS_SUFFIX)
    for name, suffix in zip(names, sorted(filenames.SUFFIXES)):
        parts = name.split(".")
        assert parts[0] == "tfdbg_events" and parts[1].isdigit()
        assert parts[2:4] == ["hostA", "rank1"] and parts[-1] == suffix


def test_metadata_record_comes_first_with_file_version_and_run_id(tmp_path):
    w = writer.FileSetWriter(str(tmp_path), tfdbg_run_id="run42", tensorflow_version="x")
    w.close()
    (meta,) = _events(w.path("metadata"))
    assert meta.debug_metadata.file_version == "debug.Event:1"
    assert meta.debug_metadata.tfdbg_run_id == "run42"
    assert meta.wall_time > 0


def test_circular_buffer_keeps_exactly_the_last_n(tmp_path):
    w = writer.FileSetWriter(str(tmp_path), circular_buffer_size=5)
    for i in range(23):
        w.write_event(_execution(i))
    w.flush()
    w.flush()
    assert [e.execution.op_type for e in _events(w.path("execution"))] == [
        "Op%d" % i for i in range(18, 23)
    ]
    w.close()
    assert len(_events(w.path("execution"))) == 5


def test_unbounded_mode_streams_everything(tmp_path):
    w = writer.FileSetWriter(str(tmp_path), circular_buffer_size=-1)
    for i in range(300):
        w.write_event(_execution(i))
    w.close()
    assert len(_events(w.path("execution"))) == 300


def test_source_files_are_written_once_and_indexed_in_order(tmp_path):
    w = writer.FileSetWriter(str(tmp_path))
    assert w.add_source_file("/a.py", ["x = 1"]) == 0
    assert w.add_source_file("/b.py", ["y = 2"]) == 1
    assert w.add_source_file("/a.py", ["x = 1"]) == 0
    w.close()
    files = [e.source_file.file_path for e in _events(w.path("source_files"))]
    assert files == ["/a.py", "/b.py"]


@pytest.mark.parametrize("buffer_size", [3, -1])
def test_groups_of_records_land_in_their_files_in_order(tmp_path, buffer_size):
    """write_serialized_groups (a captured execution's traces and its Execution under
    one lock): each group in its own file, in order, the ring's last N kept; a group
    with an unknown suffix writes none of the others."""
    w = writer.FileSetWriter(str(tmp_path), circular_buffer_size=buffer_size)
    trace = debug_event_pb2.DebugEvent()
    trace.graph_execution_trace.op_name = "Net/relu_0"
    for i in range(4):
        w.write_serialized_groups([
            ("graph_execution_traces", [trace.SerializeToString()] * 2),
            ("execution", (_execution(i).SerializeToString(),)),
            ("execution", [_execution(10 + i).SerializeToString()])])
    with pytest.raises(ValueError, match="'debug_metadata'"):
        w.write_serialized_groups([("execution", [_execution(99).SerializeToString()]),
                                   ("debug_metadata", [b""])])
    w.close()
    ops = [e.execution.op_type for e in _events(w.path("execution"))]
    expected = [name for i in range(4) for name in ("Op%d" % i, "Op%d" % (10 + i))]
    assert ops == (expected if buffer_size < 0 else expected[-3:])
    traces = _events(w.path("graph_execution_traces"))
    assert len(traces) == (8 if buffer_size < 0 else 3)
    assert {t.graph_execution_trace.op_name for t in traces} == {"Net/relu_0"}


def test_close_twice_is_harmless_and_writing_after_close_raises(tmp_path):
    w = writer.FileSetWriter(str(tmp_path))
    w.close()
    w.close()
    w.flush()
    with pytest.raises(ValueError, match="closed"):
        w.write_event(_execution(0))


def test_metadata_events_cannot_be_written_twice(tmp_path):
    w = writer.FileSetWriter(str(tmp_path))
    event = debug_event_pb2.DebugEvent()
    event.debug_metadata.file_version = "x"
    with pytest.raises(ValueError):
        w.write_event(event)
    w.close()


def test_concurrent_writers_lose_no_record(tmp_path):
    w = writer.FileSetWriter(str(tmp_path), circular_buffer_size=-1)

    def work(k):
        for i in range(500):
            w.write_event(_execution(k * 1000 + i))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    w.close()
    got = sorted(int(e.execution.op_type[2:]) for e in _events(w.path("execution")))
    assert got == sorted(k * 1000 + i for k in range(4) for i in range(500))


_EXIT_PROGRAM = r"""
import os, sys, time
from tb_numerics_plugin import writer
from tb_numerics_plugin.proto import debug_event_pb2
w = writer.FileSetWriter(sys.argv[1], circular_buffer_size=int(sys.argv[2]), flush_interval_s=0.0)
for i in range(100):
    e = debug_event_pb2.DebugEvent(); e.execution.op_type = "Op%d" % i
    w.write_event(e)
if sys.argv[3] == "kill":
    os._exit(1)          # a hard kill: no atexit, no close
raise SystemExit(3)      # an ordinary failing exit: atexit runs
"""


@pytest.mark.parametrize(
    "buffer_size,how,expected",
    [(-1, "kill", 100), (-1, "exit", 100), (10, "exit", 10), (10, "kill", 0)],
)
def test_what_survives_the_way_a_run_ends(tmp_path, buffer_size, how, expected):
    proc = subprocess.run(
        [sys.executable, "-c", _EXIT_PROGRAM, str(tmp_path), str(buffer_size), how],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode in (1, 3), proc.stderr
    (path,) = [p for p in tmp_path.iterdir() if p.name.endswith(".execution")]
    assert len(_events(str(path))) == expected


def _status(w):
    with open(w.path(filenames.STATUS_SUFFIX), "rb") as f:
        data = f.read()
    assert len(data) == status_sidecar.STATUS_BYTES
    return json.loads(data)


def test_status_sidecar_says_what_the_ring_kept_and_dropped(tmp_path):
    w = writer.FileSetWriter(str(tmp_path), circular_buffer_size=5, tfdbg_run_id="r1")
    assert _status(w)["state"] == "open"
    for i in range(23):
        w.write_event(_execution(i))
    w.flush()
    status = _status(w)
    assert status["written"]["execution"] == 23 and status["evicted"]["execution"] == 18
    assert status["lost"] == {} and status["first_error"] is None
    w.close()
    status = _status(w)
    assert (status["state"], status["pid"], status["tfdbg_run_id"]) == ("closed", os.getpid(), "r1")
    assert status["circular_buffer_size"] == 5


def test_a_taken_name_gets_a_pid_part_and_the_other_set_is_untouched(tmp_path):
    first = writer.FileSetWriter(str(tmp_path), host_name="h")
    # the same second is what makes names clash; pretend every nearby second is taken
    stamp = int(os.path.basename(first.prefix).split(".")[1])
    for t in range(stamp - 1, stamp + 30):
        path = tmp_path / ("tfdbg_events.%d.h.metadata" % t)
        if not path.exists():
            path.write_bytes(b"")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    second = writer.FileSetWriter(str(tmp_path), host_name="h")
    second.write_event(_execution(1))
    second.close()
    first.close()
    label = os.path.basename(second.prefix).split(".", 2)[2]
    head = "h.p%dx" % os.getpid()
    assert label.startswith(head) and len(label) == len(head) + 4  # 4 hex digits
    assert filenames.FILE_RE.match(os.path.basename(second.path("execution")))
    for name, data in before.items():
        if "metadata" in name and not name.startswith(os.path.basename(first.prefix)):
            assert (tmp_path / name).read_bytes() == data  # never overwritten
    assert len(_events(second.path("execution"))) == 1


def test_graph_records_reach_the_disk_before_the_traces_that_point_at_them(tmp_path):
    w = writer.FileSetWriter(str(tmp_path), circular_buffer_size=-1, flush_interval_s=3600)
    op = debug_event_pb2.DebugEvent()
    op.graph_op_creation.op_name = "log_0"
    w.write_event(op)
    trace = debug_event_pb2.DebugEvent()
    trace.graph_execution_trace.op_name = "log_0"
    trace.graph_execution_trace.tensor_proto.tensor_content = b"\0" * 512
    while not os.path.getsize(w.path("graph_execution_traces")):
        w.write_event(trace)  # until a flush by size, with no explicit flush
    assert [e.graph_op_creation.op_name for e in _events(w.path("graphs"))] == ["log_0"]
    w.close()


def test_the_flush_thread_writes_while_nothing_else_happens(tmp_path):
    w = writer.FileSetWriter(str(tmp_path), circular_buffer_size=-1, flush_interval_s=0.1)
    w.write_event(_execution(7))
    deadline = time.monotonic() + 60  # a bound for a loaded machine, not a speed claim
    while not os.path.getsize(w.path("execution")):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert [e.execution.op_type for e in _events(w.path("execution"))] == ["Op7"]
    assert _status(w)["written"]["execution"] == 1
    w.close()
    assert not w._timer.is_alive()


def test_a_failed_ring_rewrite_keeps_the_previous_window_and_is_counted(tmp_path, caplog):
    w = writer.FileSetWriter(str(tmp_path), circular_buffer_size=3)
    for i in range(4):
        w.write_event(_execution(i))
    w.flush()
    os.mkdir(w.path("execution") + ".tmp")  # the temporary file cannot be created: EISDIR
    for i in range(4, 6):
        w.write_event(_execution(i))
    w.flush()
    w.flush()
    assert [e.execution.op_type for e in _events(w.path("execution"))] == ["Op1", "Op2", "Op3"]
    status = _status(w)
    assert status["lost"] == {"EISDIR": 2} and "EISDIR" in status["first_error"]
    assert sum("could not write" in r.getMessage() for r in caplog.records) == 1
    os.rmdir(w.path("execution") + ".tmp")
    w.close()  # the obstacle is gone: the last window reaches the disk, nothing is lost
    assert [e.execution.op_type for e in _events(w.path("execution"))] == ["Op3", "Op4", "Op5"]
    assert _status(w)["lost"] == {}


def test_a_forked_child_writes_nothing_into_the_parents_files(tmp_path):
    w = writer.FileSetWriter(str(tmp_path), circular_buffer_size=-1, flush_interval_s=0.0)
    w.write_event(_execution(0))
    pid = os.fork()
    if pid == 0:  # the child: its writes and its exit must leave the parent's files alone
        code = 0
        try:
            for i in range(100):
                w.write_event(_execution(1000 + i))
            w.close()
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    w.write_event(_execution(1))
    w.close()
    assert [e.execution.op_type for e in _events(w.path("execution"))] == ["Op0", "Op1"]


def test_a_reopened_writer_appends_to_its_own_set_without_a_second_metadata(tmp_path):
    w = writer.FileSetWriter(str(tmp_path), circular_buffer_size=-1, flush_interval_s=0)
    w.write_event(_execution(0))
    w.close()
    assert _status(w)["state"] == "closed"
    assert w.reopen() and not w.closed
    assert _status(w)["state"] == "open"
    assert w.add_source_file("/a.py", ["x"]) == 0  # the index carries on: no duplicate
    w.write_event(_execution(1))
    w.close()
    assert len(os.listdir(tmp_path)) == 7  # still one file set
    assert [e.execution.op_type for e in _events(w.path("execution"))] == ["Op0", "Op1"]
    assert len(_events(w.path("metadata"))) == 1
    status = _status(w)
    assert status["state"] == "closed" and status["written"]["execution"] == 2


def test_a_reopened_ring_writer_keeps_the_last_n_across_both_openings(tmp_path):
    w = writer.FileSetWriter(str(tmp_path), circular_buffer_size=3)
    for i in range(2):
        w.write_event(_execution(i))
    w.close()
    w.reopen()
    for i in range(2, 5):
        w.write_event(_execution(i))
    w.close()
    assert [e.execution.op_type for e in _events(w.path("execution"))] == ["Op2", "Op3", "Op4"]
    assert _status(w)["evicted"]["execution"] == 2


def test_reopening_an_open_writer_is_harmless(tmp_path):
    w = writer.FileSetWriter(str(tmp_path))
    assert w.reopen()
    w.write_event(_execution(0))
    w.close()
    assert len(_events(w.path("execution"))) == 1
