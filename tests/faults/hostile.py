"""Hostile records and files crafted into a dump directory, for fault tests of every layer.

Each case of :data:`CASES` takes a dump root holding one file set (the
miniature dump of ``tests/dumps.py``: :func:`base_dump`), damages it in one
way and returns a :class:`Case` naming the file and offset a warning must
name. Record cases append the hostile record, then a good *sentinel* record
of the same file, so a test can check that nothing after the hostile record
was lost (:func:`sentinel_present`).

Usage::

    root = hostile.base_dump(str(tmp_path / "d"))
    case = hostile.CASES["trace_mode_1000"](root)
    run = Logdir(root).run("."); run.update()
    assert any(case.path in w and "offset %d" % case.offset in w for w in run.warnings)
"""

import dataclasses
import glob
import json
import os
import struct

import numpy as np

import dumps
from tb_numerics_plugin import records
from tb_numerics_plugin.filenames import STATUS_SUFFIX
from tb_numerics_plugin.proto import debug_event_pb2

SENTINEL_WALL = 9000.0
SENTINEL_OP = "sentinel_op"


@dataclasses.dataclass
class Case:
    """One hostile change: its kind (group), the file it touched, the offset a warning names
    (None when the warning names only the file), and the file of its sentinel record."""

    name: str
    kind: str
    path: str
    offset: object = None
    sentinel: str = None


def base_dump(root, **kw):
    """Writes the miniature FULL_HEALTH dump of tests/dumps.py (closed writer) into ``root``."""
    dumps.write_dump(root, **kw)
    return root


def file_of(root, suffix):
    """The one file of ``root`` ending in ``.<suffix>``."""
    (path,) = glob.glob(os.path.join(glob.escape(root), "*." + suffix))
    return path


def status_path(root):
    return file_of(root, STATUS_SUFFIX)


def write_status(root, **fields):
    """Rewrites the writer-status sidecar of ``root`` in place with ``fields`` changed."""
    path = status_path(root)
    with open(path, "rb") as f:
        status = json.loads(f.read().decode())
    status.update(fields)
    text = json.dumps(status).encode()
    with open(path, "r+b") as f:
        f.write(text.ljust(4096, b" "))


def append_raw(path, data):
    """Appends ``data`` as is; returns the offset it starts at."""
    offset = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(data)
    return offset


def append_payload(path, payload):
    """Appends one framed record; returns its offset."""
    return append_raw(path, records.encode(payload))


def not_utf8(event, field_setter):
    """Serializes ``event`` after ``field_setter(event, placeholder)`` with the placeholder's
    bytes replaced by invalid UTF-8 of the same length (protobuf refuses to write it)."""
    placeholder = "\u00e9\u00e9"  # 4 bytes: c3 a9 c3 a9
    field_setter(event, placeholder)
    data = event.SerializeToString()
    return data.replace(placeholder.encode(), b"\xff\xfe\xc3\x28", 1)


def trace(op_name="Log", values=dumps.GOOD, mode=dumps.FULL_HEALTH, wall_time=2000.0,
          tensor=None):
    """A serialized graph-execution trace; ``tensor(proto)`` may rewrite its TensorProto."""
    ev = debug_event_pb2.DebugEvent()
    ev.ParseFromString(dumps.trace_payload(op_name, values, wall_time, mode=mode))
    if tensor is not None:
        ev.graph_execution_trace.tensor_proto.Clear()
        tensor(ev.graph_execution_trace.tensor_proto)
    return ev.SerializeToString()


def execution(op_type="Exec", values=dumps.GOOD, mode=dumps.FULL_HEALTH, wall_time=2000.0,
              tensor=None):
    """A serialized Execution with one output."""
    ev = debug_event_pb2.DebugEvent(wall_time=wall_time)
    ex = ev.execution
    ex.op_type, ex.num_outputs, ex.tensor_debug_mode = op_type, 1, mode
    ex.output_tensor_ids.append(99)
    proto = ex.tensor_protos.add()
    if tensor is not None:
        tensor(proto)
    else:
        proto.dtype = 2
        proto.tensor_shape.dim.add().size = len(values)
        proto.tensor_content = np.asarray(values, "<f8").tobytes()
    return ev.SerializeToString()


def op_creation(op_name="hostile_op", num_outputs=1, graph_id=dumps.GRAPH_ID):
    ev = debug_event_pb2.DebugEvent()
    c = ev.graph_op_creation
    c.op_type, c.op_name, c.graph_id, c.num_outputs = "Hostile", op_name, graph_id, num_outputs
    c.input_names.append("x:0")
    return ev.SerializeToString()


def _sentinel(suffix):
    if suffix == "graph_execution_traces":
        return trace(SENTINEL_OP, wall_time=SENTINEL_WALL)
    if suffix == "execution":
        return execution(SENTINEL_OP, wall_time=SENTINEL_WALL)
    if suffix == "graphs":
        return op_creation(SENTINEL_OP)
    ev = debug_event_pb2.DebugEvent()
    if suffix == "stack_frames":
        ev.stack_frame_with_id.id = SENTINEL_OP
        ev.stack_frame_with_id.file_line_col.line = 1
    else:
        ev.source_file.file_path = SENTINEL_OP
        ev.source_file.lines.append("pass")
    return ev.SerializeToString()


def sentinel_present(run, suffix):
    """Whether the sentinel record after a hostile one was read."""
    if suffix == "graph_execution_traces":
        n = run.num_graph_execution_traces()
        return any(d["op_name"] == SENTINEL_OP for d in run.graph_execution_trace_digests(0, n))
    if suffix == "execution":
        return any(d["op_type"] == SENTINEL_OP
                   for d in run.execution_digests(0, run.num_executions()))
    try:
        if suffix == "graphs":
            return run.op_info(dumps.GRAPH_ID, SENTINEL_OP) is not None
        if suffix == "stack_frames":
            return bool(run.stack_frames([SENTINEL_OP]))
    except KeyError:
        return False
    return any(f["file_path"] == SENTINEL_OP for f in run.source_files())


def _record_case(name, kind, suffix, payload):
    def make(root):
        path = file_of(root, suffix)
        offset = append_payload(path, payload() if callable(payload) else payload)
        append_payload(path, _sentinel(suffix))
        return Case(name, kind, path, offset, suffix)
    make.__name__ = name
    return make


def _huge_length(suffix):
    """A length header of 2**29 whose CRC is valid, then nothing of it: a lie mid-file."""
    def make(root):
        path = file_of(root, suffix)
        length = struct.pack("<Q", 1 << 29)
        offset = append_raw(path, length + struct.pack("<I", records.masked_crc32c(length)))
        append_payload(path, _sentinel(suffix))
        return Case("huge_length_" + suffix, "length", path, offset, suffix)
    make.__name__ = "huge_length_" + suffix
    return make


def _huge_shape(values):
    def tensor(proto):
        proto.dtype = 1
        proto.tensor_shape.dim.add().size = 1 << 31
        proto.float_val.extend(values)
    return tensor


def _negative_dim(proto):
    proto.dtype = 1
    proto.tensor_shape.dim.add().size = -4
    proto.float_val.append(1.0)


def _misaligned(proto):
    proto.dtype = 2
    proto.tensor_shape.dim.add().size = 1
    proto.tensor_content = b"\x01" * 7


def _trace_op_not_utf8():
    ev = debug_event_pb2.DebugEvent()
    ev.ParseFromString(trace())
    return not_utf8(ev, lambda e, p: setattr(e.graph_execution_trace, "op_name", p))


def _execution_not_utf8():
    ev = debug_event_pb2.DebugEvent()
    ev.ParseFromString(execution())
    return not_utf8(ev, lambda e, p: setattr(e.execution, "op_type", p))


def _frame_code_not_utf8():
    ev = debug_event_pb2.DebugEvent()
    ev.stack_frame_with_id.id = "f-hostile"
    return not_utf8(ev, lambda e, p: setattr(e.stack_frame_with_id.file_line_col, "code", p))


def _source_not_utf8():
    ev = debug_event_pb2.DebugEvent()
    ev.source_file.file_path = "/hostile.py"
    return not_utf8(ev, lambda e, p: e.source_file.lines.append(p))


def _graph_cycle():
    ev = debug_event_pb2.DebugEvent()
    ev.debugged_graph.graph_id = "g-cycle"
    ev.debugged_graph.outer_context_id = "g-cycle"
    return ev.SerializeToString()


def _frame_file_index_huge():
    ev = debug_event_pb2.DebugEvent()
    ev.stack_frame_with_id.id = "f-user-log"  # replaces a frame the report shows
    ev.stack_frame_with_id.file_line_col.file_index = 2 ** 31 - 1
    ev.stack_frame_with_id.file_line_col.line = -5
    return ev.SerializeToString()


def _wrong_kind():
    return execution("misplaced")


def _truncate(suffix, keep):
    """Cuts ``suffix``'s file inside its last record (``keep`` bytes of it stay)."""
    def make(root):
        path = file_of(root, suffix)
        last = dumps.record_offsets(path)[-1]
        with open(path, "r+b") as f:
            f.truncate(last + keep)
        return Case("truncate_%s_%d" % (suffix, keep), "truncated", path, last)
    return make


def _empty(suffix):
    def make(root):
        path = file_of(root, suffix)
        open(path, "wb").close()
        return Case("empty_" + suffix, "empty", path)
    return make


def _non_utf8_file_names(root):
    """Renames the file set so its host part holds the byte 0xff (not UTF-8)."""
    broot = os.fsencode(root)
    for name in os.listdir(broot):
        if name.startswith(b"tfdbg_events."):
            os.rename(os.path.join(broot, name),
                      os.path.join(broot, name.replace(b".testhost.", b".test\xffhost.")))
    return Case("non_utf8_file_names", "file", file_of(root, "metadata"))


def _nan_wall():
    return trace(wall_time=float("nan"))


_FH = dumps.FULL_HEALTH
CASES = {}
for _case in (
    _record_case("trace_mode_-1", "mode", "graph_execution_traces", trace(mode=-1)),
    _record_case("trace_mode_9", "mode", "graph_execution_traces", trace(mode=9)),
    _record_case("trace_mode_1000", "mode", "graph_execution_traces", trace(mode=1000)),
    _record_case("execution_mode_-1", "mode", "execution", execution(mode=-1)),
    _record_case("execution_mode_1000", "mode", "execution", execution(mode=1000)),
    _record_case("trace_count_negative", "counts", "graph_execution_traces",
                 trace(values=[0, -1, 1, 1, 10, -3, 0, 0, 7, 0, 0])),
    _record_case("trace_count_nan", "counts", "graph_execution_traces",
                 trace(values=[0, -1, 1, 1, float("nan"), 0, 0, 0, 7, 0, 0])),
    _record_case("trace_count_inf", "counts", "graph_execution_traces",
                 trace(values=[0, -1, 1, 1, 10, float("inf"), 0, 0, 7, 0, 0])),
    _record_case("trace_count_huge", "counts", "graph_execution_traces",
                 trace(values=[0, -1, 1, 1, 1e300, 0, 0, 1e300, 7, 0, 0])),
    _record_case("trace_count_fraction", "counts", "graph_execution_traces",
                 trace(values=[0, -1, 1, 1, 10, 0.5, 0, 0, 7, 0, 0])),
    _record_case("trace_too_few_values", "counts", "graph_execution_traces",
                 trace(values=[0, -1, 1])),
    _record_case("trace_too_many_values", "counts", "graph_execution_traces",
                 trace(values=list(range(5000)))),
    _record_case("execution_count_nan", "counts", "execution",
                 execution(values=[0, -1, 1, 1, float("nan"), 0, 0, 0, 7, 0, 0])),
    _record_case("trace_full_tensor_huge_shape", "shape", "graph_execution_traces",
                 trace(mode=7, tensor=_huge_shape([1.0]))),
    _record_case("trace_full_tensor_huge_shape_no_values", "shape", "graph_execution_traces",
                 trace(mode=7, tensor=_huge_shape([]))),
    _record_case("trace_full_tensor_negative_dim", "shape", "graph_execution_traces",
                 trace(mode=7, tensor=_negative_dim)),
    _record_case("trace_misaligned_content", "shape", "graph_execution_traces",
                 trace(tensor=_misaligned)),
    _record_case("execution_full_tensor_huge_shape", "shape", "execution",
                 execution(mode=7, tensor=_huge_shape([1.0]))),
    _record_case("op_num_outputs_huge", "size", "graphs", op_creation(num_outputs=2**31 - 1)),
    _record_case("op_num_outputs_negative", "size", "graphs", op_creation(num_outputs=-7)),
    _huge_length("graph_execution_traces"),
    _huge_length("execution"),
    _huge_length("graphs"),
    _record_case("trace_op_not_utf8", "utf8", "graph_execution_traces", _trace_op_not_utf8),
    _record_case("execution_op_not_utf8", "utf8", "execution", _execution_not_utf8),
    _record_case("stack_frame_code_not_utf8", "utf8", "stack_frames", _frame_code_not_utf8),
    _record_case("source_line_not_utf8", "utf8", "source_files", _source_not_utf8),
    _record_case("trace_wall_nan", "wall", "graph_execution_traces", _nan_wall),
    _record_case("execution_wall_inf", "wall", "execution",
                 execution(wall_time=float("inf"))),
    _record_case("garbage_payload", "kind", "graph_execution_traces",
                 b"\xff\xff\xff not a DebugEvent"),
    _record_case("wrong_kind", "kind", "graph_execution_traces", _wrong_kind),
    _record_case("graph_cycle", "structure", "graphs", _graph_cycle),
    _record_case("frame_file_index_huge", "structure", "stack_frames", _frame_file_index_huge),
):
    CASES[_case.__name__] = _case
for _suffix in ("execution", "graph_execution_traces", "graphs", "stack_frames",
                "source_files", "metadata"):
    for _keep in (5, 14, 30):
        CASES["truncate_%s_%d" % (_suffix, _keep)] = _truncate(_suffix, _keep)
    CASES["empty_" + _suffix] = _empty(_suffix)
CASES["non_utf8_file_names"] = _non_utf8_file_names

EVIL = "\x1b[2J\x1b]0;pwned\x07"


def escape_dump(root):
    """A dump whose first bad op, its file name, code line and host carry terminal controls."""
    from tb_numerics_plugin.writer import FileSetWriter

    writer = FileSetWriter(root, circular_buffer_size=-1, host_name="host" + "\x1b[31m")
    user = writer.add_source_file("/home/u/ev" + EVIL + ".py",
                                  ["def loss(x):", "    y = log(x)  # " + EVIL])
    ev = debug_event_pb2.DebugEvent()
    ev.stack_frame_with_id.id = "f1"
    ev.stack_frame_with_id.file_line_col.file_index = user
    ev.stack_frame_with_id.file_line_col.line = 2
    ev.stack_frame_with_id.file_line_col.func = "lo" + EVIL
    writer.write_event(ev)
    ev = debug_event_pb2.DebugEvent()
    ev.debugged_graph.graph_id, ev.debugged_graph.graph_name = dumps.GRAPH_ID, "loss" + EVIL
    writer.write_event(ev)
    for op_type, name, inputs in (("Placeholder", "x", []), ("Log", "Lo" + EVIL, ["x:0"])):
        ev = debug_event_pb2.DebugEvent()
        c = ev.graph_op_creation
        c.op_type, c.op_name, c.graph_id, c.num_outputs = op_type, name, dumps.GRAPH_ID, 1
        c.input_names.extend(inputs)
        c.code_location.stack_frame_ids.append("f1")
        writer.write_event(ev)
    writer.write_serialized("graph_execution_traces",
                            dumps.trace_payload("Lo" + EVIL, dumps.LOG_BAD, 1000.0))
    writer.close()
    return root
