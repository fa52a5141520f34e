"""FileSetWriter: naming, metadata first, circular buffer, streaming flushes, idempotence."""

import os
import subprocess
import sys
import threading

import pytest

from tb_numerics_plugin import filenames, records, writer
from tb_numerics_plugin.proto import debug_event_pb2


def _events(path):
    return [debug_event_pb2.DebugEvent.FromString(p) for _, p in records.scan(path).records]


def _execution(i):
    event = debug_event_pb2.DebugEvent()
    event.execution.op_type = "Op%d" % i
    return event


def test_writes_six_files_named_like_tensorflow(tmp_path):
    w = writer.FileSetWriter(str(tmp_path), host_name="hostA", part="rank1")
    w.close()
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 6
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
