"""Alerts of a run: InfNan and OverflowHeadroom, per graph trace and per execution.

Rules:

- **InfNan**: the debug values show at least one -inf, +inf or NaN. Which
  modes can say so: CURT_HEALTH (a flag), CONCISE_HEALTH, FULL_HEALTH,
  FULL_NUMERICS (counts), FULL_TENSOR (counts derived from the tensor).
  SHAPE and NO_TENSOR carry no health: they never raise InfNan.
- **OverflowHeadroom** (FULL_NUMERICS only, the one mode that records
  magnitudes): a finite tensor whose largest absolute value is within a
  factor 2 of its dtype's largest finite value (float16 65504, bfloat16
  3.3895e38, float32 3.4028e38, float64 1.798e308), i.e. one more doubling
  overflows. Tensors already holding inf/NaN raise InfNan instead.

Order of alerts: graph traces before executions, then by index, InfNan
before OverflowHeadroom at the same index. Results are cached on the
RunReader until ``update()`` indexes new data.
"""

import numpy as np

from tb_numerics_plugin.analysis import health as health_lib

TYPES = ("InfNan", "OverflowHeadroom")
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
    near = np.isfinite(abs_max) & (abs_max * 2 >= limit)
    out[rows[near]] = True
    return out & ~health_lib.bad_mask(modes, values)


def _tables(run, host):
    """``{(type, kind): sorted int64 indices}`` for one host, cached on the run."""
    fs = run.fileset(host)
    key = ("alerts", fs.label)
    with run.lock:
        cached = run.cache.get(key)
        if cached is None:
            c = fs.executions.cols
            cached = {
                ("InfNan", "graph_execution_trace"): run.bad_trace_indices(fs.label),
                ("InfNan", "execution"): run.bad_execution_indices(fs.label),
                ("OverflowHeadroom", "graph_execution_trace"): np.flatnonzero(
                    headroom_mask(fs.traces.modes(), fs.traces.cols["values"])),
                ("OverflowHeadroom", "execution"): np.flatnonzero(
                    headroom_mask(c["mode"], c["values"])),
            }
            run.cache[key] = cached
        return fs, cached


def counts(run, host=None):
    """``{"InfNan": n, "OverflowHeadroom": n}`` over traces and executions of one host."""
    _, tables = _tables(run, host)
    return {t: int(sum(len(tables[(t, k)]) for k in KINDS)) for t in TYPES}


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
    if "nan" in h:
        detail = "%d -inf, %d +inf, %d NaN" % (h["neg_inf"], h["pos_inf"], h["nan"])
        if "size" in h:
            detail += " of %d elements" % h["size"]
    else:
        detail = "holds inf or NaN (%s records no counts)" % h.get("mode")
    return "%s%s: %s" % (what, where, detail)


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
      alert_type: "InfNan", "OverflowHeadroom" or None for both.
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
        cached = run.cache.get(key)
        if cached is None:
            parts = []
            for k, kind in enumerate(KINDS):
                for t, typ in enumerate(TYPES):
                    if alert_type in (None, typ):
                        idx = tables[(typ, kind)]
                        parts.append(np.stack([np.full(len(idx), k), idx, np.full(len(idx), t)]))
            rows = np.concatenate(parts, axis=1).astype(np.int64)
            cached = rows[:, np.lexsort((rows[2], rows[1], rows[0]))]
            run.cache[key] = cached
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
    for typ in TYPES:
        if alert_type not in (None, typ):
            continue
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
