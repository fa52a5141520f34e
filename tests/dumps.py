"""Small tfdbg2 dumps written with our FileSetWriter, for reader/analysis/CLI tests.

The graph is the demo's story in miniature: graph ``loss`` holds
``x = Placeholder``, ``Log(x)``, ``mul(Log)``; each step traces Log and mul.
From step ``bad_from`` on, Log gets 3 -inf of 10 elements and mul NaN.
"""

import struct

import numpy as np

from tb_numerics_plugin import records
from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.writer import FileSetWriter

USER_FILE = "/home/user/train.py"
USER_LINES = ["import tensorflow as tf", "", "def loss(x):", "    y = tf.math.log(x)",
              "    return y * 2"]
LIB_FILE = "/usr/lib/python3/site-packages/tensorflow/python/ops/math_ops.py"
GRAPH_ID = "g-loss"
DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"
FULL_HEALTH, FULL_NUMERICS = 4, 6
GOOD = [0, -1, 1, 1, 10, 0, 0, 0, 2, 3, 5]
LOG_BAD = [0, -1, 1, 1, 10, 3, 0, 0, 7, 0, 0]
MUL_BAD = [0, -1, 1, 1, 10, 0, 0, 3, 7, 0, 0]


def _event(**kw):
    ev = debug_event_pb2.DebugEvent(**kw)
    return ev


def write_structure(writer):
    """Source files, stack frames, graph and ops of the miniature model."""
    user = writer.add_source_file(USER_FILE, USER_LINES)
    lib = writer.add_source_file(LIB_FILE, ["def log(x):", "  return gen_math_ops.log(x)"])
    frames = {"f-user-log": (user, 4), "f-user-mul": (user, 5), "f-lib": (lib, 2)}
    for fid, (index, line) in frames.items():
        ev = _event()
        ev.stack_frame_with_id.id = fid
        ev.stack_frame_with_id.file_line_col.file_index = index
        ev.stack_frame_with_id.file_line_col.line = line
        ev.stack_frame_with_id.file_line_col.func = "loss"
        writer.write_event(ev)
    ev = _event()
    ev.debugged_graph.graph_id = GRAPH_ID
    ev.debugged_graph.graph_name = "loss"
    writer.write_event(ev)
    for op_type, name, inputs, stack in (
        ("Placeholder", "x", [], []),
        ("Log", "Log", ["x:0"], ["f-user-log", "f-lib"]),
        ("Mul", "mul", ["Log:0"], ["f-user-mul", "f-lib"]),
    ):
        ev = _event()
        c = ev.graph_op_creation
        c.op_type, c.op_name, c.graph_id, c.graph_name = op_type, name, GRAPH_ID, "loss"
        c.num_outputs = 1
        c.device_name = DEVICE
        c.input_names.extend(inputs)
        c.code_location.stack_frame_ids.extend(stack)
        writer.write_event(ev)


def trace_payload(op_name, values, wall_time, mode=FULL_HEALTH, graph_id=GRAPH_ID):
    """A serialized graph-execution-trace DebugEvent."""
    ev = _event(wall_time=wall_time)
    t = ev.graph_execution_trace
    t.tfdbg_context_id, t.op_name, t.tensor_debug_mode, t.device_name = (
        graph_id, op_name, mode, DEVICE)
    t.tensor_proto.dtype = 2
    t.tensor_proto.tensor_shape.dim.add().size = len(values)
    t.tensor_proto.tensor_content = np.asarray(values, "<f8").tobytes()
    return ev.SerializeToString()


def write_dump(root, steps=5, bad_from=3, host="testhost", part=None, t0=1000.0):
    """Writes the miniature dump; returns the FileSetWriter (closed).

    Traces: per step ``Log`` then ``mul``; bad from step ``bad_from`` (None = never).
    """
    writer = FileSetWriter(root, circular_buffer_size=-1, host_name=host, part=part)
    write_structure(writer)
    for step in range(steps):
        bad = bad_from is not None and step >= bad_from
        for k, (name, vals) in enumerate((("Log", LOG_BAD), ("mul", MUL_BAD))):
            wall = t0 + step + 0.1 * k
            writer.write_serialized("graph_execution_traces",
                                    trace_payload(name, vals if bad else GOOD, wall))
    ex = _event(wall_time=t0 + steps)
    ex.execution.op_type = "__inference_loss_1"
    ex.execution.num_outputs = 1
    ex.execution.output_tensor_ids.append(7)
    ex.execution.tensor_debug_mode = FULL_HEALTH
    proto = ex.execution.tensor_protos.add()
    proto.dtype = 2
    proto.tensor_shape.dim.add().size = 11
    proto.tensor_content = np.asarray(MUL_BAD if bad_from is not None else GOOD,
                                      "<f8").tobytes()
    writer.write_event(ex)
    writer.close()
    return writer


def append_record(path, payload):
    """Appends one framed record to a file."""
    with open(path, "ab") as f:
        f.write(records.encode(payload))


def record_offsets(path):
    """Offsets of the records of a file, in order."""
    return [offset for offset, _ in records.scan(path).records]


def flip_byte(path, offset):
    """Flips every bit of the byte at ``offset``."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(struct.pack("B", byte[0] ^ 0xFF))


def read_run(root, name="."):
    """The run ``name`` under ``root``, read with our reader and indexed once."""
    from tb_numerics_plugin.reader import Logdir

    run = Logdir(str(root)).run(name)
    run.update()
    return run



def traces(run, host=None):
    """Every graph-execution trace of ``run`` (e.g. from :func:`read_run`) in file order,
    as ``run.graph_execution_trace`` returns them; ``host``: the host whose file set to
    read, None for the run's only one."""
    n = run.num_graph_execution_traces(host)
    return [run.graph_execution_trace(i, host) for i in range(n)]
