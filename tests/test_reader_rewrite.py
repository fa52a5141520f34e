"""A reader following a circular-buffer dump sees each flushed window, never stale offsets."""

from tb_numerics_plugin import writer
from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.reader import Logdir


def _write_executions(w, first, count):
    for i in range(first, first + count):
        event = debug_event_pb2.DebugEvent(wall_time=1000.0 + i)
        event.execution.op_type = "Op%d" % i
        w.write_event(event)


def _op_types(run):
    return [d["op_type"] for d in run.execution_digests(0, run.num_executions())]


def test_reader_follows_ring_rewrites_across_flushes(tmp_path):
    w = writer.FileSetWriter(str(tmp_path), circular_buffer_size=5)
    run = Logdir(str(tmp_path)).run(".")
    _write_executions(w, 0, 3)
    w.flush()
    run.update()
    assert _op_types(run) == ["Op0", "Op1", "Op2"]
    _write_executions(w, 3, 10)
    w.flush()
    assert run.update() is True
    assert _op_types(run) == ["Op8", "Op9", "Op10", "Op11", "Op12"]
    full = run.execution(4)
    assert full["op_type"] == "Op12"
    w.close()


def test_streamed_file_is_read_incrementally_not_restarted(tmp_path):
    w = writer.FileSetWriter(str(tmp_path), circular_buffer_size=-1, flush_interval_s=0.0)
    run = Logdir(str(tmp_path)).run(".")
    _write_executions(w, 0, 4)
    run.update()
    fs = run.fileset(None)
    table = fs.executions
    _write_executions(w, 4, 4)
    run.update()
    assert fs.executions is table
    assert _op_types(run) == ["Op%d" % i for i in range(8)]
    w.close()
