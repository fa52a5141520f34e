"""Builds the JSON-safe dicts of docs/internals.md from one file set's index.

Pure functions of a :class:`FileSet`; the RunReader picks the file set
(host) and checks ranges.
"""

import numpy as np

from tb_numerics_plugin.reader import graphs, steps
from tb_numerics_plugin.reader import health as health_lib
from tb_numerics_plugin.reader import tensors
from tb_numerics_plugin.reader.executions import output_values
from tb_numerics_plugin.reader.graphs import split_input_name


def _health(mode, values, nvals):
    return health_lib.decode(mode, values[:nvals]) if nvals else None


def trace_digest(fs, index):
    """The digest dict of graph execution trace ``index`` of file set ``fs``."""
    t = fs.traces
    k = int(t.cols["key"][index])
    keys = t.keys
    graph_id = keys.context[k]
    op = fs.graphs.op(graph_id, keys.op_name[k])
    mode = keys.mode[k]
    return {
        "index": int(index),
        "host": fs.label,
        "op_name": keys.op_name[k],
        "op_type": op.op_type if op is not None else None,
        "output_slot": keys.output_slot[k],
        "graph_id": graph_id,
        "graph_name": fs.graphs.graph_name(graph_id),
        "wall_time": float(t.cols["wall_time"][index]),
        "step": steps.value(t.cols["step"][index]),
        "tensor_debug_mode": health_lib.mode_name(mode),
        "health": _health(mode, t.cols["values"][index], int(t.cols["nvals"][index])),
    }


def _debug_value(mode, proto):
    """A debug tensor as JSON: health vector as floats, FULL_TENSOR as nested lists.

    ``mode`` is the name the digest shows (an unknown mode was read as UNSPECIFIED).
    """
    try:
        arr = tensors.to_array(proto)
    except ValueError:
        return None
    if mode == "FULL_TENSOR":
        return tensors.to_json_list(arr)
    if not arr.size:
        return None
    return [health_lib.json_float(x) for x in arr.astype(np.float64).ravel()]


def trace(fs, index):
    """The full dict of trace ``index``: digest plus its record's details.

    Raises:
      RecordUnavailable: the record can no longer be read (file replaced, damaged).
    """
    out = trace_digest(fs, index)
    offset = int(fs.traces.cols["offset"][index])
    event = fs.read_event("graph_execution_traces", offset)
    gt = event.graph_execution_trace
    out["device_name"] = gt.device_name
    out["debug_tensor_value"] = (
        _debug_value(out["tensor_debug_mode"], gt.tensor_proto)
        if gt.HasField("tensor_proto") else None
    )
    out["graph_ids"] = fs.graphs.graph_ids_outward(gt.tfdbg_context_id)
    return out


def execution_digest(fs, index):
    """The digest dict of execution ``index`` of file set ``fs``."""
    e = fs.executions
    c = e.cols
    graph = int(c["graph_id"][index])
    mode = int(c["mode"][index])
    return {
        "index": int(index),
        "host": fs.label,
        "op_type": e.strings.values[int(c["op_type"][index])],
        "graph_id": e.strings.values[graph] if graph >= 0 else None,
        "wall_time": float(c["wall_time"][index]),
        "step": steps.value(c["step"][index]),
        "output_tensor_ids": e.output_ids(index),
        "tensor_debug_mode": health_lib.mode_name(mode),
        "health": _health(mode, c["values"][index], int(c["nvals"][index])),
    }


def execution(fs, index):
    """The full dict of execution ``index``.

    Raises:
      RecordUnavailable: the record can no longer be read (file replaced, damaged).
    """
    out = execution_digest(fs, index)
    offset = int(fs.executions.cols["offset"][index])
    event = fs.read_event("execution", offset)
    ex = event.execution
    # A hostile num_outputs (2**31 - 1) must size nothing downstream: past the cap, the
    # record's own output ids say how many outputs there are.
    n = int(ex.num_outputs)
    out["num_outputs"] = n if 0 <= n <= graphs.MAX_OUTPUTS else len(ex.output_tensor_ids)
    out["input_tensor_ids"] = list(ex.input_tensor_ids)
    out["output_tensor_ids"] = list(ex.output_tensor_ids)
    out["output_dtypes"] = [health_lib.dtype_name(d) for d in ex.output_dtypes]
    out["output_tensor_device_ids"] = list(ex.output_tensor_device_ids)
    out["debug_tensor_values"] = [_debug_value(out["tensor_debug_mode"], p)
                                  for p in ex.tensor_protos]
    out["stack_frame_ids"] = list(ex.code_location.stack_frame_ids)
    out["graph_name"] = (
        fs.graphs.graph_name(ex.graph_id) if ex.graph_id else None
    )
    return out


def execution_output_dtypes(fs, index):
    """DataType numbers of the outputs of execution ``index`` ([] when not recorded)."""
    offset = int(fs.executions.cols["offset"][index])
    event = fs.read_event("execution", offset)
    return list(event.execution.output_dtypes)


def execution_health_vectors(fs, index):
    """Per-output health vectors of execution ``index`` (None where absent)."""
    offset = int(fs.executions.cols["offset"][index])
    event = fs.read_event("execution", offset)
    return output_values(event.execution)


def source_lines(fs, index):
    """The lines of source file ``index`` (re-read from the dump).

    Raises:
      IndexError: no such source file. RecordUnavailable: its record no longer reads.
    """
    files = fs.graphs.source_files
    if not 0 <= index < len(files):
        raise IndexError("source file index %d out of range" % index)
    return list(fs.read_event("source_files", files[index][0]).source_file.lines)


def graph_info(fs, graph_id):
    """Raises KeyError for an unknown graph."""
    g = fs.graphs.graphs[graph_id]
    return {
        "graph_id": graph_id,
        "name": g["name"],
        "outer_graph_id": g["outer"],
        "inner_graph_ids": list(g["inner"]),
        "num_ops": len(fs.graphs.ops_by_graph.get(graph_id, ())),
    }


def op_info(fs, graph_id, op_name):
    """Raises KeyError for an unknown graph or op."""
    gi = fs.graphs
    op = gi.ops[(graph_id, op_name)]
    inputs = []
    for name in op.input_names:
        producer, slot = split_input_name(name.lstrip("^"))
        src = gi.ops.get((graph_id, producer))
        inputs.append({"op_name": producer, "output_slot": slot,
                       "op_type": src.op_type if src is not None else None})
    table = gi.consumers(graph_id)
    consumers = []
    for slot in range(max(int(op.num_outputs), 1 if (op_name, 0) in table else 0)):
        consumers.append([
            {"op_name": c, "input_slot": s, "op_type": gi.ops[(graph_id, c)].op_type}
            for c, s in table.get((op_name, slot), ())
        ])
    return {
        "graph_id": graph_id,
        "graph_ids": gi.graph_ids_outward(graph_id),
        "op_type": op.op_type,
        "op_name": op.op_name,
        "num_outputs": int(op.num_outputs),
        "device_name": op.device_name,
        "host": fs.label,
        "input_names": list(op.input_names),
        "inputs": inputs,
        "consumers": consumers,
        "stack_frame_ids": list(op.code_location.stack_frame_ids),
    }


def stack_frame(fs, frame_id):
    """Raises KeyError for an unknown frame id."""
    flc = fs.graphs.stack_frames[frame_id]
    files = fs.graphs.source_files
    index = int(flc.file_index)
    path, host = (files[index][1], files[index][2]) if 0 <= index < len(files) else ("", "")
    return {
        "id": frame_id,
        "host_name": host,
        "file_path": path,
        "file_index": index,
        "lineno": int(flc.line),
        "func": flc.func,
        "code": flc.code,
    }
