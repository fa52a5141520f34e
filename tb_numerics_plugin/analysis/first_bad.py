"""The first bad tensor of a run and what fed it.

Which one is first: within a host, trace order; across hosts, the earliest
wall time. Graph traces are considered first; executions only when no graph
trace is bad (eager-only programs).

An input's health comes from its latest trace at or before the bad trace,
in the same graph. Function arguments (``Placeholder`` ops of a function
graph) are not traced inside the function; their values are the inputs of
the function-call Execution (the first execution written at or after the
trace: TF writes a call's traces before its Execution record), and the
health of those comes from the execution that produced them.
"""

import numpy as np

from tb_numerics_plugin.analysis import health as health_lib
from tb_numerics_plugin.reader import views
from tb_numerics_plugin.reader.graphs import split_input_name

_MAX_WALK = 64


def locate(run):
    """``(host, kind, index)`` of the first bad tensor, or None."""
    for kind, finder in (("graph_execution_trace", run.bad_trace_indices),
                         ("execution", run.bad_execution_indices)):
        best = None
        for host in run.hosts:
            idx = finder(host)
            if not len(idx):
                continue
            fs = run.fileset(host)
            table = fs.traces if kind == "graph_execution_trace" else fs.executions
            wall = float(table.cols["wall_time"][idx[0]])
            if best is None or wall < best[0]:
                best = (wall, host, int(idx[0]))
        if best is not None:
            return best[1], kind, best[2]
    return None


def _latest_trace(fs, graph_id, op_name, slot, at_or_before):
    """Index of the latest trace of ``op_name:slot`` in ``graph_id`` at or before an index."""
    keys = fs.traces.keys
    kids = [k for k in range(len(keys))
            if keys.op_name[k] == op_name and keys.context[k] == graph_id
            and keys.output_slot[k] == slot]
    if not kids:
        return None
    col = fs.traces.cols["key"][: at_or_before + 1]
    hits = np.flatnonzero(np.isin(col, kids))
    return int(hits[-1]) if len(hits) else None


def _producer_execution(fs, tensor_id, before):
    """``(execution index, output position)`` of the latest execution before ``before``
    that output ``tensor_id``, or None."""
    ids = fs.executions.outputs["id"]
    begins = fs.executions.cols["out_begin"][:before]
    hits = np.flatnonzero(ids[: fs.executions.cols["out_end"][before - 1]] == tensor_id) \
        if before > 0 else []
    if not len(hits):
        return None
    pos = int(hits[-1])
    index = int(np.searchsorted(begins, pos, side="right") - 1)
    return index, pos - int(begins[index])


def _execution_source(fs, index, slot):
    """The ``source`` of a value that execution ``index`` output at ``slot``."""
    return {"kind": "execution", "index": index, "output_slot": slot,
            "op_type": views.execution_digest(fs, index)["op_type"]}


def _execution_output_health(fs, index, slot):
    """Health of output ``slot`` of execution ``index``, or None when not recorded."""
    vectors = views.execution_health_vectors(fs, index)
    if slot >= len(vectors) or vectors[slot] is None:
        return None
    return health_lib.decode(int(fs.executions.cols["mode"][index]), vectors[slot])


def _argument_value(run, fs, graph_id, placeholder, wall_time):
    """``(source, health)`` of a function argument, through the function-call Execution;
    ``(None, None)`` when the producing execution is not found."""
    gi = fs.graphs
    args = [n for n in gi.ops_by_graph.get(graph_id, ()) if gi.ops[(graph_id, n)].op_type
            == "Placeholder"]
    if placeholder not in args or not len(fs.executions):
        return None, None
    call = int(np.searchsorted(fs.executions.cols["wall_time"], wall_time, side="left"))
    if call >= len(fs.executions):
        return None, None
    inputs = run.execution(call, host=fs.label)["input_tensor_ids"]
    k = args.index(placeholder)
    if k >= len(inputs):
        return None, None
    found = _producer_execution(fs, inputs[k], call)
    if found is None:
        return None, None
    index, slot = found
    return _execution_source(fs, index, slot), _execution_output_health(fs, index, slot)


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
    out = []
    for name in op["input_names"]:
        if name.startswith("^"):
            continue  # control edge: carries no values
        producer, slot = split_input_name(name)
        src = fs.graphs.ops.get((digest["graph_id"], producer))
        item = {"name": "%s:%d" % (producer, slot),
                "op_type": src.op_type if src is not None else None,
                "health": None, "trace_index": None, "source": None}
        t = _latest_trace(fs, digest["graph_id"], producer, slot, digest["index"])
        if t is not None:
            item["trace_index"] = t
            item["source"] = {"kind": "graph_execution_trace", "index": t}
            item["health"] = run.graph_execution_trace_digests(t, t + 1, host=fs.label)[0]["health"]
        elif item["op_type"] == "Placeholder":
            item["source"], item["health"] = _argument_value(
                run, fs, digest["graph_id"], producer, digest["wall_time"])
        out.append(item)
    return out


def producer_walk(run, fs, digest):
    """Follows bad inputs back to the op that produced the bad values.

    Returns:
      (producer digest, its inputs, [digests of the ops that only propagated,
      from the first bad tensor back]).
    """
    propagated = []
    inputs = trace_inputs(run, fs, digest)
    for _ in range(_MAX_WALK):
        bad = [i for i in inputs if i["trace_index"] is not None and i["health"]
               and i["health"].get("any_inf_or_nan")]
        if not bad:
            break
        propagated.append(digest)
        t = bad[0]["trace_index"]
        digest = run.graph_execution_trace_digests(t, t + 1, host=fs.label)[0]
        inputs = trace_inputs(run, fs, digest)
    return digest, inputs, propagated


def execution_inputs(run, fs, index):
    """Inputs of a bad execution: the producing executions' outputs and health."""
    ex = run.execution(index, host=fs.label)
    out = []
    for tid in ex["input_tensor_ids"]:
        found = _producer_execution(fs, tid, index)
        item = {"name": "tensor %d" % tid, "op_type": None, "health": None, "trace_index": None,
                "source": None}
        if found is not None:
            j, slot = found
            item["source"] = _execution_source(fs, j, slot)
            item["op_type"] = item["source"]["op_type"]
            item["name"] = "%s:%d" % (item["op_type"], slot)
            item["health"] = _execution_output_health(fs, j, slot)
        out.append(item)
    return ex, out
