"""Alerts of a run: InfNan, OverflowHeadroom and MaskedNonFinite, per graph trace and
per execution.

Rules:

- **InfNan**: the debug values show at least one -inf, +inf or NaN, and the
  lineage analysis (:mod:`lineage`) finds that they propagate: they reach a
  model output, an optimizer step or an unknown fate. Which modes can say
  so: CURT_HEALTH (a flag), CONCISE_HEALTH, FULL_HEALTH, FULL_NUMERICS
  (counts), FULL_TENSOR (counts derived from the tensor). SHAPE and
  NO_TENSOR carry no health: they never raise InfNan.
- **MaskedNonFinite** (quiet, not an alarm): non-finite values that every
  reader masks (softmax over -inf, ``where``, a cast to integers) or
  gradients of a step a loss scaler skipped.
- **OverflowHeadroom** (FULL_NUMERICS only, the one mode that records
  magnitudes): a finite tensor whose largest absolute value is within a
  factor 2 of its dtype's largest finite value (float16 65504, bfloat16
  3.3895e38, float32 3.4028e38, float64 1.798e308), i.e. one more doubling
  overflows. Tensors already holding inf/NaN raise InfNan instead.

Order of alerts: graph traces before executions, then by index, in the
order of ``TYPES`` at the same index. Results are cached (``cache.for_run``)
until ``update()`` indexes new data.
"""

import numpy as np

from tb_numerics_plugin import schema
from tb_numerics_plugin.analysis import cache as cache_lib
from tb_numerics_plugin.analysis import health as health_lib
from tb_numerics_plugin.analysis import lineage as lineage_lib

TYPES = ("InfNan", "OverflowHeadroom", "MaskedNonFinite")
ALARMS = ("InfNan", "OverflowHeadroom")
KINDS = ("graph_execution_trace", "execution")
_ABS_MAX = health_lib.FULL_HEALTH_WIDTH + 3  # index of abs_max in FULL_NUMERICS
_DTYPE = 2
_NUMERICS = health_lib.MODE_CODES["FULL_NUMERICS"]


def headroom_mask(modes, values):
    """Vectorized OverflowHeadroom rule over health rows (see module docstring)."""
    out = np.zeros(len(modes), bool)
    if not len(modes) or values.ndim != 2 or values.shape[1] <= _ABS_MAX:
        return out
    rows = np.flatnonzero(np.asarray(modes) == _NUMERICS)
    if not len(rows):
        return out
    limit = np.full(len(rows), np.inf)
    dtype = values[rows, _DTYPE]
    for enum, name in health_lib.DTYPE_NAMES.items():
        if name in health_lib.DTYPE_MAX:
            limit[dtype == enum] = health_lib.DTYPE_MAX[name]
    abs_max = values[rows, _ABS_MAX]
    near = np.isfinite(abs_max) & (abs_max * schema.HEADROOM_FACTOR >= limit)
    out[rows[near]] = True
    return out & ~health_lib.bad_mask(modes, values)


def lineage(run, host=None):
    """The :class:`lineage.Lineage` of one host, cached with the run's analysis."""
    fs = run.fileset(host)
    with run.lock:
        cache = cache_lib.for_run(run)
        found = cache.get(("lineage", fs.label))
        if found is None:
            found = cache[("lineage", fs.label)] = lineage_lib.Lineage(run, fs.label)
        return found


def _split(lin):
    """Bad traces and executions split into (propagating, masked) index arrays."""
    traces = lin.bad_traces
    prop_t = np.array([lin.classify(("t", int(i)))[0] for i in traces], bool)
    execs = lin.bad_executions
    prop_e = np.array([lin.execution_status(int(i))[0] for i in execs], bool)
    return (traces[prop_t], traces[~prop_t]), (execs[prop_e], execs[~prop_e])


def _tables(run, host):
    """``{(type, kind): sorted int64 indices}`` for one host, cached."""
    fs = run.fileset(host)
    key = ("alerts", fs.label)
    with run.lock:
        cache = cache_lib.for_run(run)
        cached = cache.get(key)
        if cached is None:
            (prop_t, masked_t), (prop_e, masked_e) = _split(lineage(run, fs.label))
            cached = {
                ("InfNan", "graph_execution_trace"): prop_t.astype(np.int64),
                ("InfNan", "execution"): prop_e.astype(np.int64),
                ("MaskedNonFinite", "graph_execution_trace"): masked_t.astype(np.int64),
                ("MaskedNonFinite", "execution"): masked_e.astype(np.int64),
                ("OverflowHeadroom", "graph_execution_trace"): np.flatnonzero(
                    headroom_mask(*fs.traces.health_rows())),
                ("OverflowHeadroom", "execution"): np.flatnonzero(
                    headroom_mask(*fs.executions.health_rows())),
            }
            cache[key] = cached
        return fs, cached


def counts(run, host=None):
    """``{type: n}`` for every type of ``TYPES`` over traces and executions of one host."""
    _, tables = _tables(run, host)
    return {t: int(sum(len(tables[(t, k)]) for k in KINDS)) for t in TYPES}


def type_column(run, kind, host=None):
    """Per record of one kind of one host, its alert type as an index into ``TYPES``
    (-1: none), as an int8 array; a record with several types gets the first of ``TYPES``."""
    fs, tables = _tables(run, host)
    n = len(fs.traces) if kind == "graph_execution_trace" else len(fs.executions)
    out = np.full(n, -1, np.int8)
    for t in range(len(TYPES) - 1, -1, -1):  # the first type is written last: it wins
        out[tables[(TYPES[t], kind)]] = t
    return out


def _check_type(alert_type):
    if alert_type is not None and alert_type not in TYPES:
        raise ValueError("unknown alert_type %r (known: %s)" % (alert_type, ", ".join(TYPES)))


def _message(alert_type, digest, kind):
    what = (
        "%s:%d" % (digest["op_name"], digest["output_slot"])
        if kind == "graph_execution_trace"
        else digest["op_type"]
    )
    where = " in graph %s" % digest["graph_name"] if digest.get("graph_name") else ""
    h = digest["health"] or {}
    if alert_type == "OverflowHeadroom":
        return "%s%s: abs max %s is within 2x of the %s limit" % (
            what, where, h.get("abs_max"), h.get("dtype"))
    masked = " (masked: no path reaches the loss, an output or an optimizer step)" \
        if alert_type == "MaskedNonFinite" else ""
    return "%s%s: %s%s" % (what, where, schema.counts_phrase(h), masked)


def _alert(run, fs, alert_type, kind, index):
    if kind == "graph_execution_trace":
        d = run.graph_execution_trace_digests(index, index + 1, host=fs.label)[0]
    else:
        d = run.execution_digests(index, index + 1, host=fs.label)[0]
        d = dict(d, op_name=d["op_type"], output_slot=None, graph_name=None)
    return {
        "alert_type": alert_type,
        "kind": kind,
        "index": int(index),
        "host": fs.label,
        "op_type": d["op_type"],
        "op_name": d["op_name"],
        "output_slot": d["output_slot"],
        "graph_id": d["graph_id"],
        "wall_time": d["wall_time"],
        "health": d["health"],
        "message": _message(alert_type, d, kind),
    }


def list_alerts(run, host=None, alert_type=None, begin=0, end=None):
    """One page of the alerts of one host, in the module's order.

    Args:
      run: RunReader (already updated).
      host: host label, None = first host.
      alert_type: one of ``TYPES``, or None for the alarms (``ALARMS``: InfNan and
        OverflowHeadroom; MaskedNonFinite only when asked by name).
      begin, end: Python-style range over the ordered alerts, clipped.

    Returns:
      (total, [alert dict]).

    Raises:
      KeyError: unknown host. ValueError: unknown alert_type.
    """
    _check_type(alert_type)
    fs, order = _ordered(run, host, alert_type)
    total = order.shape[1]
    b = max(0, min(int(begin or 0), total))
    e = total if end is None or end < 0 else max(b, min(int(end), total))
    return total, [_alert(run, fs, TYPES[t], KINDS[k], i) for k, i, t in order[:, b:e].T]


def _ordered(run, host, alert_type):
    """All alerts of one host as a (3, n) array of (kind, index, type) rows, in order; cached."""
    fs, tables = _tables(run, host)
    key = ("alert_order", fs.label, alert_type)
    with run.lock:
        cache = cache_lib.for_run(run)
        cached = cache.get(key)
        if cached is None:
            parts = []
            wanted = ALARMS if alert_type is None else (alert_type,)
            for k, kind in enumerate(KINDS):
                for t, typ in enumerate(TYPES):
                    if typ in wanted:
                        idx = tables[(typ, kind)]
                        parts.append(np.stack([np.full(len(idx), k), idx, np.full(len(idx), t)]))
            rows = np.concatenate(parts, axis=1).astype(np.int64)
            cached = rows[:, np.lexsort((rows[2], rows[1], rows[0]))]
            cache[key] = cached
        return fs, cached


def next_alert(run, index, direction=+1, kind="graph_execution_trace", host=None,
               alert_type=None):
    """The first alert strictly after (direction=+1) or before (-1) ``index``.

    Returns:
      alert dict, or None when there is none in that direction.

    Raises:
      KeyError: unknown host. ValueError: bad kind, direction or alert_type.
    """
    _check_type(alert_type)
    if kind not in KINDS:
        raise ValueError("unknown kind %r (known: %s)" % (kind, ", ".join(KINDS)))
    if direction not in (1, -1):
        raise ValueError("direction must be +1 or -1, got %r" % (direction,))
    fs, tables = _tables(run, host)
    best = None
    for typ in ALARMS if alert_type is None else (alert_type,):
        idx = tables[(typ, kind)]
        if direction > 0:
            pos = np.searchsorted(idx, index, side="right")
            cand = int(idx[pos]) if pos < len(idx) else None
        else:
            pos = np.searchsorted(idx, index, side="left") - 1
            cand = int(idx[pos]) if pos >= 0 else None
        if cand is not None and (best is None or (cand - best[0]) * direction < 0):
            best = (cand, typ)
    return None if best is None else _alert(run, fs, best[1], kind, best[0])
