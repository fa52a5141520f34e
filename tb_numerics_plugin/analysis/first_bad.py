"""The first bad tensor of a run and what fed it.

Which one is first: the earliest *propagating* bad tensor (see
:mod:`lineage`; masked ones such as an attention mask's -inf never count).
Within a host, eager executions and graph traces form one sequence ordered
by wall time (a torch capture stamps a call's Execution at its start,
TensorFlow at its end, and each trace when its op ran); across hosts, the
earliest wall time wins. From there the walk goes back through bad inputs
to the op whose inputs were all finite: the producer, the root.

An input's value comes from its latest trace at or before the reading
trace, in the same graph. A function argument (a ``Placeholder``) is not
traced inside the function; its value is the call Execution's input tensor
id of that position, found as a torch trace carrying the id or as the
output of an earlier execution.
"""

import numpy as np

from tb_numerics_plugin.analysis import alerts as alerts_lib
from tb_numerics_plugin.reader import views
from tb_numerics_plugin.reader.graphs import split_input_name

_MAX_WALK = 64


def locate(run):
    """``(host, kind, index)`` of the earliest propagating bad tensor, or None.

    kind is "graph_execution_trace" or "execution".
    """
    best = None
    for host in run.hosts:
        fs, tables = alerts_lib._tables(run, host)
        torch_first = run.dataflow(host).writer == "torch"
        for kind, table in (("graph_execution_trace", fs.traces), ("execution", fs.executions)):
            idx = tables[("InfNan", kind)]
            if not len(idx):
                continue
            walls = table.wall_times()[idx]
            j = int(np.argmin(walls))
            # ties: a torch call's Execution precedes its traces, TF's follows them
            rank = (kind == "execution") != torch_first
            cand = (float(walls[j]), rank, host, kind, int(idx[j]))
            if best is None or cand[:2] < best[:2]:
                best = cand
    return None if best is None else best[2:]


def _trace_digest(run, fs, index):
    return run.graph_execution_trace_digests(index, index + 1, host=fs.label)[0]


def _execution_source(fs, index, slot):
    """The ``source`` of a value that execution ``index`` output at ``slot``."""
    return {"kind": "execution", "index": index, "output_slot": slot,
            "op_type": views.execution_digest(fs, index)["op_type"]}


def _execution_output_health(run, fs, index, slot):
    """Health of output ``slot`` of execution ``index``, or None when not recorded."""
    outputs = alerts_lib.lineage(run, fs.label).execution_outputs(index)
    return outputs[slot][2] if slot < len(outputs) else None


def _value_of_tensor(run, fs, tensor_id, before_execution, before_trace):
    """``(source, health, trace index or None)`` of the value with ``tensor_id``:
    a torch trace carrying it, else the execution that output it."""
    flow = run.dataflow(fs.label)
    if tensor_id is None or tensor_id < 0:
        return None, None, None
    t = flow.trace_with_tensor_id(tensor_id, before_trace)
    if t is not None:
        return {"kind": "graph_execution_trace", "index": t}, \
            _trace_digest(run, fs, t)["health"], t
    found = flow.producer_execution(tensor_id, before_execution)
    if found is None:
        return None, None, None
    index, slot = found
    return _execution_source(fs, index, slot), _execution_output_health(run, fs, index, slot), \
        None


def _argument_value(run, fs, graph_id, placeholder, trace_index):
    """``(source, health, trace index)`` of a function argument, through the call's
    input tensor ids; Nones when not found."""
    flow = run.dataflow(fs.label)
    call = flow.call_of_trace(trace_index)
    names = flow.placeholders(graph_id)
    if call is None or placeholder not in names:
        return None, None, None
    inputs = fs.executions.input_ids(call)
    k = names.index(placeholder)
    if k >= len(inputs):
        return None, None, None
    begin = flow.call_traces(call)[0]
    return _value_of_tensor(run, fs, inputs[k], call, begin)


def trace_inputs(run, fs, digest):
    """The data inputs of a bad trace's op with their health.

    Returns:
      list of ``{"name", "op_type", "health", "trace_index", "source"}``:
      trace_index is None when the health came from elsewhere or is unknown;
      source says where the value came from (docs/report.md), None if unknown.
    """
    try:
        op = run.op_info(digest["graph_id"], digest["op_name"], host=fs.label)
    except KeyError:
        return []
    flow = run.dataflow(fs.label)
    out = []
    for name in op["input_names"]:
        if name.startswith("^"):
            continue  # control edge: carries no values
        producer, slot = split_input_name(name)
        src = fs.graphs.op(digest["graph_id"], producer)
        item = {"name": "%s:%d" % (producer, slot),
                "op_type": src.op_type if src is not None else None,
                "health": None, "trace_index": None, "source": None}
        t = flow.latest_trace(digest["graph_id"], producer, slot, digest["index"])
        if t is not None:
            item["trace_index"] = t
            item["source"] = {"kind": "graph_execution_trace", "index": t}
            item["health"] = _trace_digest(run, fs, t)["health"]
        elif item["op_type"] == "Placeholder":
            item["source"], item["health"], item["trace_index"] = _argument_value(
                run, fs, digest["graph_id"], producer, digest["index"])
        out.append(item)
    return out


def execution_inputs(run, fs, index):
    """Inputs of an execution: the producing records' values and health."""
    ex = run.execution(index, host=fs.label)
    wall = fs.traces.wall_times()
    before_trace = int(np.searchsorted(wall, ex["wall_time"], side="right")) if len(wall) else 0
    out = []
    for tid in ex["input_tensor_ids"]:
        item = {"name": "tensor %d" % tid, "op_type": None, "health": None, "trace_index": None,
                "source": None}
        item["source"], item["health"], item["trace_index"] = _value_of_tensor(
            run, fs, tid, index, before_trace)
        src = item["source"]
        if src is not None and src["kind"] == "execution":
            item["op_type"] = src["op_type"]
            item["name"] = "%s:%d" % (src["op_type"], src["output_slot"])
        elif src is not None:
            d = _trace_digest(run, fs, src["index"])
            item["op_type"] = d["op_type"]
            item["name"] = "%s:%d" % (d["op_name"], d["output_slot"])
        out.append(item)
    return ex, out


def _bad(item):
    return item["health"] is not None and bool(item["health"].get("any_inf_or_nan"))


def producer_walk(run, fs, digest):
    """Follows bad inputs of a trace back to the op that produced the bad values.

    Returns:
      (producer digest, its inputs, [digests of the ops that only propagated,
      from the first bad tensor back]).
    """
    propagated = []
    inputs = trace_inputs(run, fs, digest)
    for _ in range(_MAX_WALK):
        bad = [i for i in inputs if i["trace_index"] is not None and _bad(i)]
        if not bad:
            break
        propagated.append(digest)
        digest = _trace_digest(run, fs, bad[0]["trace_index"])
        inputs = trace_inputs(run, fs, digest)
    return digest, inputs, propagated
