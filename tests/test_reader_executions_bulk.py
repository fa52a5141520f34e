"""Execution records read in bulk give exactly what the per-record protobuf path gives.

Each test reads one execution file both ways, chunk by chunk as the reader
does: ``ExecutionTable.add_frames`` (vectorized, falling back per record) and
``ExecutionTable.add_records`` (protobuf for every record), then compares every
column, the tensor ids, the interned strings and the warnings. Each also says
which records the bulk decoder must read itself, so that a fast path that
silently fell back for everything would fail.
"""

import glob
import os
import struct

import numpy as np
import pytest

import tf_programs
from tb_numerics_plugin import records
from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.reader import exec_layout, wire
from tb_numerics_plugin.reader.executions import ExecutionTable

FULL_HEALTH = 4
GOOD = [-1, 0, 1, 2, 6, 0, 0, 0, 2, 2, 2]
BAD = [-1, 0, 1, 2, 6, 1, 0, 2, 1, 1, 1]


def _read_both(path, chunk_size=8 << 20):
    """(bulk table, per-record table, bulk decoder's slow mask over all records)."""
    bulk, per_record = ExecutionTable(), ExecutionTable()
    decoder = exec_layout.Decoder()
    slow = []
    for frames, base in wire.iter_frames(path, 0, chunk_size=chunk_size):
        bulk.add_frames(frames, base, path)
        per_record.add_records(
            [(base + s - records.HEADER_SIZE, frames.buf[s : s + n])
             for s, n in zip(frames.starts.tolist(), frames.lengths.tolist())], path)
        if len(frames.starts):
            slow.append(decoder.decode(frames.buf, frames.starts,
                                       frames.starts + frames.lengths).slow)
    return bulk, per_record, np.concatenate(slow) if slow else np.zeros(0, bool)


def _assert_same(bulk, per_record):
    assert set(bulk.cols._data) == set(per_record.cols._data)
    for name in bulk.cols._data:
        a, b = bulk.cols[name], per_record.cols[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert np.array_equal(a, b, equal_nan=True), name
    assert bulk.outputs["id"].tolist() == per_record.outputs["id"].tolist()
    assert bulk.inputs["id"].tolist() == per_record.inputs["id"].tolist()
    assert bulk.strings.values == per_record.strings.values
    assert bulk.warnings == per_record.warnings


def _execution_files(root):
    files = glob.glob(os.path.join(root, "**", "*.execution"), recursive=True)
    assert files, "no execution file under %s" % root
    return files


@pytest.mark.parametrize("mode", tf_programs.MODES)
def test_tf_dumps_read_the_same_in_bulk_and_per_record(tf_dumps, mode):
    for path in _execution_files(os.path.join(tf_dumps, mode)):
        for chunk_size in (8 << 20, 4096):  # one chunk; many, with records split across them
            bulk, per_record, slow = _read_both(path, chunk_size)
            _assert_same(bulk, per_record)
            assert len(bulk) == len(slow) > 0
            if mode == "FULL_TENSOR":  # left to protobuf: whole tensors, not health vectors
                assert slow.all()
            else:
                assert not slow.any()


@pytest.mark.parametrize("mode", ["FULL_HEALTH", "CONCISE_HEALTH", "FULL_NUMERICS", "SHAPE",
                                  "FULL_TENSOR"])
def test_torch_dumps_read_the_same_in_bulk_and_per_record(tmp_path, mode):
    torch_mnist = pytest.importorskip("tb_numerics_plugin.demo.torch_mnist")
    torch_mnist.run(str(tmp_path), mode, steps=2)
    for path in _execution_files(str(tmp_path)):
        bulk, per_record, slow = _read_both(path)
        _assert_same(bulk, per_record)
        assert len(bulk) > 0
        assert slow.all() if mode == "FULL_TENSOR" else not slow.any()


# -- hand-built records --------------------------------------------------------


def _varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number, wire_type, data):
    key = _varint(number << 3 | wire_type)
    if wire_type == 2:
        return key + _varint(len(data)) + data
    return key + data


def _tensor(values, dtype=2):
    tp = debug_event_pb2.DebugEvent().execution.tensor_protos.add()
    tp.dtype = dtype
    tp.tensor_shape.dim.add().size = len(values)
    tp.tensor_content = np.asarray(values, "<f8" if dtype == 2 else "<f4").tobytes()
    return tp.SerializeToString()


def _execution(op_type=b"Mul", body=b"", wall=5.0):
    """A DebugEvent payload: wall_time, then an Execution of op_type plus ``body`` bytes."""
    ex = (_field(1, 2, op_type) if op_type is not None else b"") + body
    return (_field(1, 1, struct.pack("<d", wall)) if wall is not None else b"") + _field(9, 2, ex)


def _standard(outputs=(7,), values=(GOOD,), **kw):
    ex = debug_event_pb2.DebugEvent().execution
    ex.input_tensor_ids.extend([1, 2])
    ex.output_tensor_ids.extend(outputs)
    ex.tensor_debug_mode = FULL_HEALTH
    for v in values:
        ex.tensor_protos.add().MergeFromString(_tensor(v))
    ex.code_location.host_name = "h"
    ex.code_location.stack_frame_ids.extend(["f1", "f2"])
    for k, v in kw.items():
        setattr(ex, k, v)
    return _execution(body=ex.SerializeToString())


def _write(tmp_path, payloads):
    path = str(tmp_path / "x.execution")
    with open(path, "wb") as f:
        for p in payloads:
            f.write(records.encode(p))
    return path


def _check(tmp_path, payloads, expect_slow):
    path = _write(tmp_path, payloads)
    bulk, per_record, slow = _read_both(path)
    _assert_same(bulk, per_record)
    assert slow.tolist() == list(expect_slow)
    return bulk


def test_unpacked_and_mixed_tensor_ids_read_in_bulk(tmp_path):
    mode = _field(6, 0, _varint(FULL_HEALTH))
    tp = _field(7, 2, _tensor(BAD))
    unpacked = b"".join(_field(5, 0, _varint(i)) for i in (3, 4, 5)) + _field(4, 0, _varint(9))
    mixed = (_field(5, 2, _varint(10) + _varint(300)) + _field(5, 0, _varint(11))
             + _field(4, 0, _varint(2**40)) + _field(4, 2, _varint(-1)))
    bulk = _check(tmp_path, [_execution(body=unpacked + mode + tp),
                             _execution(body=mixed + mode + tp)], [False, False])
    assert bulk.output_ids(0) == [3, 4, 5] and bulk.input_ids(0) == [9]
    assert bulk.output_ids(1) == [10, 300, 11] and bulk.input_ids(1) == [2**40, -1]


def test_representative_is_the_first_bad_output_else_the_first(tmp_path):
    bulk = _check(tmp_path, [_standard((1, 2, 3), (GOOD, BAD, BAD[:-1] + [3])),
                             _standard((4, 5), (GOOD, GOOD[:-1] + [5]))], [False, False])
    assert bulk.cols["values"][0].tolist() == BAD
    assert bulk.cols["values"][1].tolist() == GOOD


def test_missing_fields_read_as_protobuf_defaults(tmp_path):
    bulk = _check(tmp_path, [_execution(op_type=None, wall=None),  # an empty Execution
                             _execution(op_type=b""),
                             _execution(body=_field(101, 0, _varint(12)))],
                  [False, False, False])
    assert bulk.cols["wall_time"].tolist() == [0.0, 5.0, 5.0]
    assert bulk.cols["nvals"].tolist() == [0, 0, 0]
    assert bulk.steps().tolist()[2] == 12


def test_graph_ids_float32_values_and_empty_tensor_protos_read_in_bulk(tmp_path):
    ex = debug_event_pb2.DebugEvent().execution
    ex.tensor_debug_mode = FULL_HEALTH
    ex.graph_id = "g-1"
    ex.tensor_protos.add()  # TF's for an int output: no value
    ex.tensor_protos.add().MergeFromString(_tensor(BAD, dtype=1))
    bulk = _check(tmp_path, [_execution(body=ex.SerializeToString()), _standard()],
                  [False, False])
    assert bulk.strings.values[bulk.cols["graph_id"][0]] == "g-1"
    assert bulk.cols["graph_id"][1] == -1
    assert bulk.cols["values"][0].tolist() == BAD


def test_full_tensor_records_take_the_protobuf_path(tmp_path):
    ex = debug_event_pb2.DebugEvent().execution
    ex.tensor_debug_mode = 7
    tp = ex.tensor_protos.add()
    tp.dtype = 1
    tp.tensor_shape.dim.add().size = 3
    tp.tensor_content = np.array([1.0, np.inf, np.nan], "<f4").tobytes()
    bulk = _check(tmp_path, [_standard(), _execution(body=ex.SerializeToString()), _standard()],
                  [False, True, False])
    assert bulk.cols["values"][1].tolist()[5:8] == [0, 1, 1]  # -inf, +inf, NaN counts


def test_unknown_fields_take_the_protobuf_path(tmp_path):
    _check(tmp_path, [_standard(),
                      _execution(body=_field(50, 0, _varint(1))),  # unknown Execution field
                      _field(2, 0, _varint(3)) + _standard(),  # DebugEvent.step
                      _execution(body=_field(6, 2, b"\x04")),  # mode with a wrong wire type
                      _execution(body=_field(1, 2, b"Add")),  # op_type twice: last one wins
                      _standard()],
           [False, True, True, True, True, False])


def test_damaged_and_hostile_records_warn_like_the_protobuf_path(tmp_path):
    payloads = [
        _standard(),
        b"",  # not a DebugEvent with an execution
        _execution(op_type=b"\xff\xfe"),  # a string that is not UTF-8
        _execution(body=_field(8, 2, _field(1, 2, b"\xc0h"))),  # ... in the code_location
        _execution(body=_field(6, 0, b"\x04") + _field(7, 2, _tensor(GOOD)[:-3])),  # cut
        _execution(wall=float("nan")),  # read in bulk: the wall time is fixed after
        _execution(body=_field(6, 0, _varint(42))),  # an unknown mode
        _standard(values=(GOOD[:5],)),  # too few values for FULL_HEALTH
        _standard(values=(GOOD + [0.0] * 30,)),  # longer than a health vector
        _standard(values=([-1, 0, 1, 2, 6, 0.5, 0, 0, 2, 2, 2],)),  # a fractional count
        _execution(body=_field(5, 2, b"\x80")),  # a packed varint that never ends
        _execution(body=_field(5, 0, b"\xff" * 10 + b"\x01")),  # an 11-byte varint
        _execution(op_type=b"Mul" + b"x" * 300),  # a long op type (read, per record)
        _standard(),
    ]
    slow = [False, True, True, True, True, False, True, False, True, False, True, True, True,
            False]
    bulk = _check(tmp_path, payloads, slow)
    assert len(bulk.warnings) == 6  # five named, then one with the count
    assert "offset" in bulk.warnings[0] and "more damaged or hostile records" in bulk.warnings[5]


def test_many_chunks_keep_offsets_and_ids_in_order(tmp_path):
    payloads = [_standard(outputs=(i, i + 1), values=(GOOD, BAD if i % 7 == 0 else GOOD))
                for i in range(300)]
    path = _write(tmp_path, payloads)
    bulk, per_record, slow = _read_both(path, chunk_size=1000)
    _assert_same(bulk, per_record)
    assert not slow.any()
    assert bulk.outputs["id"].tolist() == [j for i in range(300) for j in (i, i + 1)]
    offsets = []
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        offsets.append(pos)
        pos += 16 + struct.unpack_from("<Q", data, pos)[0]
    assert bulk.cols["offset"].tolist() == offsets
