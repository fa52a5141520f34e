"""The C encoding of records (``_record.c``) against the protobuf build.

Health rows are read in place from float64 blocks (bad ones named); graph
executions and graph execution traces encoded in C are byte for byte what
protobuf writes, trace prefixes told apart by graph, slot and device.
"""

import numpy as np
import pytest
import torch

from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.torch import encoder, recorder

pytestmark = pytest.mark.skipif(recorder._c_record is None, reason="_record.c was not built")


def test_the_c_encoding_reads_rows_in_place_and_names_bad_ones():
    encode = recorder._c_record.encode_traces
    row = [0, 1, 2, 3, 0, 5, -1.0, 9.0, 1.0, 9.0, 20.0, 4.0]  # 1 +inf, 2 NaN, 8 finite
    rows = [np.zeros((1, 12)), np.array([row] * 2) * [[0], [1]]]
    trace = ("Net/mul_0", 0, 7, (1, 1), (1, torch.Size([2, 5]), -1), "/cpu:0", 1.5)

    def run(blocks, payload=(1, 1)):
        item = trace[:3] + (payload,) + trace[4:]
        return encode([item], blocks, "g1", "FULL_HEALTH", b"", {}, {},
                      lambda *key: (b"", b""))

    (event,) = run(rows)
    values = np.frombuffer(debug_event_pb2.DebugEvent.FromString(event)
                           .graph_execution_trace.tensor_proto.tensor_content, "<f8")
    # [id, device, dtype, rank, size, -inf, +inf, nan, neg, zero, pos]
    assert list(values) == [7, -1, 1, 2, 10, 0, 1, 2, 3, 0, 5]
    with pytest.raises(IndexError, match=r"health payload \(1, 2\) is past the fetched rows"):
        run(rows, (1, 2))
    with pytest.raises(TypeError, match=r"health rows block 1 is not float64 \[n, 12\]"):
        run([rows[0], rows[1][:, :6].copy()])
    with pytest.raises(TypeError, match="bytes-like"):  # lists are the Python encoding's
        run([r.tolist() for r in rows])


@pytest.mark.parametrize("step", [None, 0, 7, -3])
def test_a_graph_execution_is_encoded_in_c_as_protobuf_writes_it(step):
    c_encoder, py_encoder = encoder.Encoder("FULL_HEALTH"), encoder.Encoder("FULL_HEALTH")
    c_encoder.c_record = recorder._c_record
    assert py_encoder.c_record is None  # the protobuf build the C one must match
    cases = [
        ("Net.forward", "g0", [3, 4, -1, 2 ** 40], [9], "host-1", ("f1", "f2"), 1.5e9),
        ("Adam.step", "g12", [], [], "", (), 0.0),  # nothing read or returned, no host
        ("Модель.forward", "g3", [-1], [5, 6, 7], "h", ["f" * 300], 2.25),  # non-ASCII, long
        # past the encoder's stack storage: ids, a code location and a message of kilobytes
        ("Net.forward", "g4", list(range(-3, 600)), list(range(300)), "h" * 200,
         ["%x" % i * 40 for i in range(12)], 3.5),
    ]
    for op_type, graph_id, in_ids, out_ids, host, stack_ids, wall in cases:
        args = (op_type, graph_id, in_ids, out_ids, host, stack_ids, wall, step)
        made = c_encoder.graph_execution_event(*args)
        assert made == py_encoder.graph_execution_event(*args)
        ex = debug_event_pb2.DebugEvent.FromString(made).execution
        assert (ex.op_type, ex.graph_id, list(ex.input_tensor_ids), ex.num_outputs) == (
            op_type, graph_id, in_ids, len(out_ids))
        assert ex.step == (step or 0) and ex.tensor_debug_mode == py_encoder.mode_enum
    with pytest.raises(TypeError, match="integer"):
        c_encoder.graph_execution_event("Net.forward", "g0", ["x"], [], "h", (), 1.0, None)


def test_trace_prefixes_are_told_apart_by_slot_and_device_in_the_c_table():
    c_encoder, py_encoder = encoder.Encoder("NO_TENSOR"), encoder.Encoder("NO_TENSOR")
    c_encoder.c_record = recorder._c_record
    # one op name on two devices and two slots, and the same name in another graph
    traces = [("Net/split_0", slot, 10 + i, None, None, device, 1.0 + i)
              for i, (slot, device) in enumerate([(0, "/cpu:0"), (1, "/cpu:0"),
                                                  (0, "/gpu:0"), (1, "/gpu:0"), (0, "")])]
    for graph_id in ("g0", "g1", "g0"):  # the second "g0" answered from the table
        made = c_encoder.trace_events(traces, graph_id, [], b"")
        assert made == py_encoder.trace_events(traces, graph_id, [], b"")
        parsed = [debug_event_pb2.DebugEvent.FromString(e).graph_execution_trace for e in made]
        assert [(t.tfdbg_context_id, t.output_slot, t.device_name) for t in parsed] == [
            (graph_id, 0, "/cpu:0"), (graph_id, 1, "/cpu:0"), (graph_id, 0, "/gpu:0"),
            (graph_id, 1, "/gpu:0"), (graph_id, 0, "")]
    assert set(c_encoder._trace_places) == {"g0", "g1"}
