"""analyze_run: the per-run story of `tb-numerics report --json` (docs/report.md)."""

import numpy as np

from tb_numerics_plugin import schema
from tb_numerics_plugin.analysis import alerts as alerts_lib
from tb_numerics_plugin.analysis import first_bad
from tb_numerics_plugin.analysis import growth as growth_lib
from tb_numerics_plugin.analysis import health as health_lib
from tb_numerics_plugin.analysis import cache as cache_lib
from tb_numerics_plugin.analysis.source import model_frame, user_frame
from tb_numerics_plugin.reader import views


def _input_part(item):
    h = item["health"]
    if h is None:
        return "%s was not traced, so whether it was already bad is unknown" % item["name"]
    if h.get("any_inf_or_nan"):
        return "%s was already bad (%s)" % (item["name"], schema.counts_phrase(h))
    text = "%s was finite" % item["name"]
    if h.get("zero"):
        text += " and held %s zeros" % (h["zero"] if h["zero"] != h.get("size") else "only")
    if "min" in h and "max" in h:
        text += " (min %s, max %s)" % (h["min"], h["max"])
    return text


def explain(producer, inputs, propagated):
    """The root-cause sentence: who produced the bad values, and what its inputs were.

    Args:
      producer: digest of the op that produced them (its inputs were not bad).
      inputs: that op's inputs (``first_bad.trace_inputs``).
      propagated: digests of ops that only passed bad inputs on, first bad first.

    Returns:
      str.
    """
    name = producer["op_type"] or producer["op_name"]
    where = " (graph %s)" % producer["graph_name"] if producer.get("graph_name") else ""
    bad_inputs = [i for i in inputs if i["health"] and i["health"].get("any_inf_or_nan")]
    if bad_inputs:
        # Bad values that came from outside the traced graph (e.g. a bad
        # function argument): this op is not where they were made.
        text = "%s%s holds %s but only propagated them: %s, coming from outside the graph" % (
            name, where, schema.counts_phrase(producer["health"]),
            "; ".join("its input " + _input_part(i) for i in bad_inputs))
    else:
        text = "%s%s produced %s" % (name, where, schema.counts_phrase(producer["health"]))
        if not inputs:
            text += "; it has no traced data inputs"
        elif len(inputs) == 1:
            text += "; its only input " + _input_part(inputs[0])
        else:
            text += "; its inputs: " + "; ".join(_input_part(i) for i in inputs)
    text += "."
    if not bad_inputs and any(i["health"] is None for i in inputs):
        text += " It is the first bad tensor traced, so it is the likely producer."
    if propagated:
        text = "%s only propagated bad inputs. %s" % (
            ", ".join(d["op_name"] for d in propagated), text)
    return text


def _trace_story(run, host, index):
    fs = run.fileset(host)
    digest = run.graph_execution_trace_digests(index, index + 1, host=host)[0]
    producer, inputs, propagated = first_bad.producer_walk(run, fs, digest)
    try:
        stack = run.op_info(producer["graph_id"], producer["op_name"],
                            host=host)["stack_frame_ids"]
    except KeyError:
        stack = []
    return producer, inputs, stack, explain(producer, inputs, []), ("t", producer["index"])


def _execution_story(run, host, index):
    fs = run.fileset(host)
    ex, inputs = first_bad.execution_inputs(run, fs, index)
    slot = alerts_lib.lineage(run, host).execution_status(index)[1] or 0
    digest = dict(views.execution_digest(fs, index), op_name=ex["op_type"], output_slot=slot,
                  graph_name=ex["graph_name"] or "")
    text = explain(digest, inputs, [])
    return digest, inputs, ex["stack_frame_ids"], text, ("e", index, slot)


def module_of(op_name):
    """The module path in a torch op name (``backward/`` dropped), or "" for eager ops."""
    scope = op_name.rsplit("/", 1)[0] if "/" in op_name else ""
    if scope.startswith("backward/"):
        scope = scope[len("backward/"):].rsplit("/", 1)[0] if "/" in scope[9:] else ""
    return "" if scope in ("eager", "backward") else scope


def _path(run, host, node):
    """``(hops, sink)``: the propagation path from the root to what it reached."""
    lin = alerts_lib.lineage(run, host)
    nodes, sink = lin.path(node)
    hops = []
    for n in nodes:
        if n[0] == "t":
            d = run.graph_execution_trace_digests(n[1], n[1] + 1, host=host)[0]
            hops.append({"kind": "graph_execution_trace", "index": n[1], "host": host,
                         "op_name": d["op_name"], "op_type": d["op_type"],
                         "output_slot": d["output_slot"], "health": d["health"]})
        else:
            d = run.execution_digests(n[1], n[1] + 1, host=host)[0]
            health = lin.execution_outputs(n[1])[n[2]][2]
            hops.append({"kind": "execution", "index": n[1], "host": host,
                         "op_name": d["op_type"], "op_type": d["op_type"],
                         "output_slot": n[2], "health": health})
    return hops, sink


def _path_sentence(hops, sink):
    if len(hops) <= 1:
        return " It reached %s directly." % _SINK_WORDS.get(sink, sink)
    names = [h["op_name"] for h in hops[1:]]
    shown = names if len(names) <= 5 else names[:3] + ["…"] + names[-2:]
    return " It reached %s through %s (%d op%s)." % (
        _SINK_WORDS.get(sink, sink), " → ".join(shown), len(names), "" if len(names) == 1 else "s")


_SINK_WORDS = {
    "model output": "the output of the top-level model call",
    "optimizer step": "an optimizer step",
    "never read": "a value nothing read afterwards (the loss, or a result left unused)",
    "untraced reader": "an op that was not traced (its result is unknown)",
    "analysis limit": "the limit of the lineage analysis",
}


def _frame(src):
    return None if src is None else {k: src[k] for k in ("file", "line", "code", "func", "kind")}


def first_bad_tensor(run):
    """The ``first_bad_tensor`` object of the report, or None when nothing propagates."""
    found = first_bad.locate(run)
    if found is None:
        return None
    host, kind, index = found
    story = _trace_story if kind == "graph_execution_trace" else _execution_story
    digest, inputs, stack, text, node = story(run, host, index)
    hops, sink = _path(run, host, node)
    text += _path_sentence(hops, sink)
    root_kind = "graph_execution_trace" if node[0] == "t" else "execution"
    return {
        "kind": root_kind,
        "index": node[1],
        "host": host,
        "op_type": digest["op_type"] or "",
        "op_name": digest["op_name"],
        "module": module_of(digest["op_name"]) if root_kind == "graph_execution_trace" else "",
        "output_slot": digest["output_slot"],
        "graph_name": digest.get("graph_name") or "",
        "wall_time": digest["wall_time"],
        "step": digest["step"],
        "health": digest["health"],
        "source": _frame(model_frame(run, stack, host)),
        "user_source": _frame(user_frame(run, stack, host)),
        "stack_frame_ids": list(stack),
        "inputs": [{k: i[k] for k in ("name", "op_type", "health", "source")} for i in inputs],
        "path": hops,
        "sink": sink,
        "explanation": text,
    }


def _mode_warning(mode):
    if mode in ("SHAPE", "NO_TENSOR"):
        return ("tensor_debug_mode %s records no inf/NaN information: no bad tensor can be "
                "found in this dump; re-run with FULL_HEALTH (or CONCISE_HEALTH, CURT_HEALTH) "
                "to find them" % mode)
    return None


def steps_summary(run):
    """``{"count", "first", "last"}`` of the training steps marked on any host (count 0 and
    None, None for a dump without steps)."""
    marked = sorted(set().union(*(run.steps(h) for h in run.hosts)))
    return {"count": len(marked), "first": marked[0] if marked else None,
            "last": marked[-1] if marked else None}


LOWEST_HEADROOM = 5


def _lowest_headroom(series):
    """Per (kind, module) its least headroom over the steps; the :data:`LOWEST_HEADROOM`
    lowest of the host, least first."""
    found = []
    for kind in series.kinds():
        steps, modules, bits = series.table(kind, "headroom_bits")
        _, _, abs_max = series.table(kind, "abs_max")
        bits = np.where(np.isfinite(bits), bits, np.nan)  # a hostile file's inf is no headroom
        for row in np.flatnonzero(np.isfinite(bits).any(axis=1)).tolist():
            col = int(np.nanargmin(bits[row]))
            value = float(abs_max[row, col])
            found.append({"kind": kind, "module": modules[row],
                          "dtype": series.dtype(kind, modules[row]), "step": int(steps[col]),
                          "headroom_bits": float(bits[row, col]),
                          "abs_max": value if np.isfinite(value) else None})
    found.sort(key=lambda e: e["headroom_bits"])
    return found[:LOWEST_HEADROOM]


def trends_summary(run):
    """The ``trends`` object of the report: per host with a numerics series, ``{"steps",
    "first_step", "last_step", "kinds", "lowest_headroom"}`` ({} when no host has one)."""
    out = {}
    for host in run.hosts:
        series = run.trends(host)
        steps = series.steps()
        if not steps:
            continue
        out[host] = {"steps": len(steps), "first_step": steps[0], "last_step": steps[-1],
                     "kinds": series.kinds(), "lowest_headroom": _lowest_headroom(series)}
    return out


def _core(run):
    """The summary's part computed from the tfdbg2 records (cached per ``run.generation``)."""
    hosts = run.hosts
    mode = run.tensor_debug_mode
    counts = {t: 0 for t in alerts_lib.TYPES}
    for host in hosts:
        for t, n in alerts_lib.counts(run, host).items():
            counts[t] += n
    return {
        "run": run.name,
        "hosts": hosts,
        "tensor_debug_mode": mode,
        "num_executions": sum(run.num_executions(h) for h in hosts),
        "num_graph_execution_traces": sum(run.num_graph_execution_traces(h) for h in hosts),
        "num_graphs": sum(len(run.graph_ids(h)) for h in hosts),
        "steps": steps_summary(run),
        "alerts": counts,
        "first_bad_tensor": first_bad_tensor(run),
        "warnings": [],  # filled per call: the series' warnings change on their own
        "health_available": mode in health_lib.HEALTH_MODES,
        "incomplete": bool(run.incomplete),
        "writers": {host: run.writer_status(host) for host in hosts},
    }


def analyze_run(run):
    """The per-run summary (docs/report.md).

    The part read from the tfdbg2 records is cached until ``run.update()`` indexes
    new data; ``trends`` and ``growth`` until it reads new numerics series rows.

    Args:
      run: a RunReader; call ``run.update()`` first.

    Returns:
      a new dict with keys run, hosts, tensor_debug_mode, num_executions,
      num_graph_execution_traces, num_graphs, steps (:func:`steps_summary`),
      alerts, first_bad_tensor, warnings, health_available, incomplete
      (records were lost or unreadable: ``run.incomplete``), writers (host ->
      writer status or None), trends (:func:`trends_summary`) and growth (the
      OverflowGrowth alerts, :func:`growth.run_alerts`). Nested values are
      shared with the cache: do not modify them.
    """
    with run.lock:
        cache = cache_lib.for_run(run)
        core = cache.get("summary")
        if core is None:
            core = cache["summary"] = _core(run)
        over_time = cache.get("trends")
        if over_time is None or over_time[0] != run.trends_generation:
            over_time = cache["trends"] = (run.trends_generation, trends_summary(run),
                                           growth_lib.run_alerts(run))
        warnings = list(run.warnings)
        if _mode_warning(core["tensor_debug_mode"]):
            warnings.append(_mode_warning(core["tensor_debug_mode"]))
        return dict(core, warnings=warnings, trends=over_time[1], growth=over_time[2])
