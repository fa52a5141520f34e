"""Every valid encoding of a trace reads the same: fast path, generic walk, other value fields, chunking."""

import glob
import os

import numpy as np

import dumps
from tb_numerics_plugin import records
from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.reader import Logdir, wire
from tb_numerics_plugin.writer import FileSetWriter


def _trace_event(op_name="Log", values=dumps.LOG_BAD, wall=5.0):
    return debug_event_pb2.DebugEvent.FromString(dumps.trace_payload(op_name, values, wall))


def _read(tmp_path, payloads):
    with FileSetWriter(str(tmp_path), circular_buffer_size=-1, host_name="h") as w:
        dumps.write_structure(w)
        for p in payloads:
            w.write_serialized("graph_execution_traces", p)
    run = Logdir(str(tmp_path)).run(".")
    run.update()
    return run


def test_values_in_packed_double_val_read_like_tensor_content(tmp_path):
    ev = _trace_event()
    tp = ev.graph_execution_trace.tensor_proto
    tp.ClearField("tensor_content")
    tp.double_val.extend(dumps.LOG_BAD)
    run = _read(tmp_path, [ev.SerializeToString()])
    assert run.graph_execution_trace_digests(0, 1)[0]["health"]["neg_inf"] == 3
    assert list(run.bad_trace_indices()) == [0]


def test_float32_health_values_are_read(tmp_path):
    ev = _trace_event()
    tp = ev.graph_execution_trace.tensor_proto
    tp.dtype = 1
    tp.tensor_content = np.asarray(dumps.LOG_BAD, "<f4").tobytes()
    run = _read(tmp_path, [ev.SerializeToString()])
    assert run.graph_execution_trace(0)["debug_tensor_value"] == [float(v) for v in dumps.LOG_BAD]


def test_record_without_wall_time_takes_the_generic_walk(tmp_path):
    ev = _trace_event()
    ev.ClearField("wall_time")
    ev.step = 7
    run = _read(tmp_path, [ev.SerializeToString(), dumps.trace_payload("mul", dumps.GOOD, 6.0)])
    digests = run.graph_execution_trace_digests(0, None)
    assert [(d["op_name"], d["wall_time"]) for d in digests] == [("Log", 0.0), ("mul", 6.0)]
    assert digests[0]["health"]["neg_inf"] == 3


def test_fields_in_unusual_order_read_the_same(tmp_path):
    ev = _trace_event()
    t = ev.graph_execution_trace
    # Hand-built: tensor_proto first, then op name, context and mode; wall time last.
    body = b"".join([
        b"\x2a" + _varint(len(t.tensor_proto.SerializeToString()))
        + t.tensor_proto.SerializeToString(),
        b"\x12" + _varint(len(t.op_name)) + t.op_name.encode(),
        b"\x0a" + _varint(len(t.tfdbg_context_id)) + t.tfdbg_context_id.encode(),
        b"\x20\x04",
    ])
    payload = b"\x52" + _varint(len(body)) + body + b"\x09" + np.float64(9.5).tobytes()
    run = _read(tmp_path, [payload])
    (d,) = run.graph_execution_trace_digests(0, None)
    assert (d["op_name"], d["op_type"], d["wall_time"]) == ("Log", "Log", 9.5)
    assert d["health"]["neg_inf"] == 3


def test_same_op_on_two_devices_gets_two_keys(tmp_path):
    a = _trace_event(values=dumps.GOOD)
    b = _trace_event(values=dumps.GOOD)
    b.graph_execution_trace.device_name = "/device:GPU:1"
    run = _read(tmp_path, [a.SerializeToString(), b.SerializeToString()] * 3)
    devices = [run.graph_execution_trace(i)["device_name"] for i in range(6)]
    assert devices == [dumps.DEVICE, "/device:GPU:1"] * 3


def test_non_trace_record_in_the_trace_file_is_skipped_with_a_warning(tmp_path):
    ev = debug_event_pb2.DebugEvent(wall_time=1.0)
    ev.execution.op_type = "Oops"
    run = _read(tmp_path, [ev.SerializeToString(), dumps.trace_payload("Log", dumps.GOOD, 2.0)])
    assert run.num_graph_execution_traces() == 1
    assert any("not a graph execution trace" in w for w in run.warnings)


def test_small_chunks_frame_exactly_like_the_canonical_scanner(ours_dump):
    (path,) = glob.glob(os.path.join(ours_dump, "*.graph_execution_traces"))
    expected = [offset for offset, _ in records.scan(path).records]
    for chunk in (50, 97, 300):
        got = []
        for frames, base in wire.iter_frames(path, 0, chunk_size=chunk):
            got.extend((base + frames.starts - 12).tolist())
        assert got == expected


def _varint(n):
    out = b""
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def test_modes_mixed_across_updates_keep_each_vector(tmp_path):
    run = _read(tmp_path, [dumps.trace_payload("Log", [0, 1], 1.0, mode=2)] * 2)
    (path,) = glob.glob(os.path.join(str(tmp_path), "*.graph_execution_traces"))
    numerics = dumps.LOG_BAD + [-1.0, 2.0, 0.5, 2.0, 0.1, 1.0]
    dumps.append_record(path, dumps.trace_payload("mul", numerics, 2.0, mode=dumps.FULL_NUMERICS))
    run.update()
    first, second, third = run.graph_execution_trace_digests(0, None)
    assert first["health"] == {"mode": "CURT_HEALTH", "any_inf_or_nan": True}
    assert third["health"]["abs_max"] == 2.0 and third["health"]["neg_inf"] == 3
    assert run.tensor_debug_mode == "CURT_HEALTH"  # the most common mode of the traces
    assert list(run.bad_trace_indices()) == [0, 1, 2]


def test_long_op_names_take_the_per_record_key_path(tmp_path):
    long_name = "scope/" * 60 + "Log"  # 363 bytes: a 2-byte length, too long to group in bulk
    payloads = [dumps.trace_payload(long_name, dumps.LOG_BAD, 1.0 + i) for i in range(3)]
    run = _read(tmp_path, payloads + [dumps.trace_payload("mul", dumps.GOOD, 9.0)])
    names = [d["op_name"] for d in run.graph_execution_trace_digests(0, None)]
    assert names == [long_name] * 3 + ["mul"]
    assert list(run.bad_trace_indices()) == [0, 1, 2]
