"""OverflowGrowth: a module's abs-max growing toward its dtype's limit, said before it overflows.

The rule, per (kind, module) series of one host's numerics series
(:meth:`RunReader.trends`) whose dtype has a limit (``schema.DTYPE_MAX``:
float16 65504, bfloat16, float32, float64):

1. Points: the steps with a finite abs_max, before the series' first step
   with ``nonfinite > 0`` (from there on the InfNan alerts speak); of those
   the last :data:`WINDOW` (50); of those the ones with abs_max > 0 (log2 of
   zero has no value). At least :data:`MIN_POINTS` (5) are needed.
2. Fit: the least-squares line of log2(abs_max) against the step: slope b
   bits per step and R^2. An alert needs b > 0, R^2 >= :data:`MIN_R2` (0.5:
   a trend, not noise) and a fitted growth b * span >= :data:`MIN_GROWTH_BITS`
   (2 bits, x4) over the window, span = last step - first step of the points.
3. Horizon: the headroom at the last point, log2(limit / abs_max_last), over b
   is the steps left to overflow at this rate; an alert needs it <= span
   (it overflows within as many steps again as the window covers).
   ``projected_overflow_step`` = last step + ceil(headroom / b).

Alerts are dicts (:func:`host_alerts`), most urgent first (fewest steps left).
The thresholds are module constants here, not in ``schema.py``: they are this
rule's alone. Pure numpy; imports neither torch nor tensorflow.
"""

import math
import weakref

import numpy as np

from tb_numerics_plugin import schema

ALERT_TYPE = "OverflowGrowth"
WINDOW = 50
MIN_POINTS = 5
MIN_R2 = 0.5
MIN_GROWTH_BITS = 2.0
_CACHE = weakref.WeakKeyDictionary()  # SeriesReader -> (generation, alerts)


def fit(steps, abs_max):
    """The least-squares line of log2(abs_max) against steps.

    Args:
      steps: int array of n >= 2 distinct steps.
      abs_max: float array of n positive finite values.

    Returns:
      ``(slope in bits per step, R^2)``; R^2 is 0.0 when the values are all equal.
    """
    x = np.asarray(steps, np.float64)
    y = np.log2(np.asarray(abs_max, np.float64))
    dx = x - x.mean()
    dy = y - y.mean()
    sxx = float((dx * dx).sum())
    syy = float((dy * dy).sum())
    if sxx == 0.0:
        return 0.0, 0.0
    slope = float((dx * dy).sum()) / sxx
    if syy == 0.0:
        return slope, 0.0
    residual = float(((dy - slope * dx) ** 2).sum())
    return slope, max(0.0, 1.0 - residual / syy)


def _points(steps, abs_max, nonfinite):
    """The (steps, abs_max) the rule fits for one module: step 1 of the module docstring."""
    present = np.isfinite(abs_max)
    bad = np.flatnonzero(nonfinite > 0)
    if len(bad):
        present[bad[0]:] = False
    index = np.flatnonzero(present)[-WINDOW:]
    index = index[abs_max[index] > 0]
    return steps[index], abs_max[index]


def series_alert(host, kind, module, dtype, steps, abs_max, nonfinite):
    """The OverflowGrowth alert of one module's series, or None.

    Args:
      host: the host label. kind: the series kind. module: the module path.
      dtype: the module's dtype name.
      steps: int64[n] sorted steps; abs_max, nonfinite: float64[n] (NaN absent).

    Returns:
      dict (see :func:`host_alerts`) or None.
    """
    limit = schema.DTYPE_MAX.get(dtype)
    if limit is None:
        return None
    xs, ys = _points(steps, abs_max, nonfinite)
    if len(xs) < MIN_POINTS:
        return None
    slope, r2 = fit(xs, ys)
    span = int(xs[-1] - xs[0])
    if not (slope > 0 and r2 >= MIN_R2 and slope * span >= MIN_GROWTH_BITS):
        return None
    headroom = max(0.0, math.log2(limit / float(ys[-1])))
    if headroom / slope > span:
        return None
    overflow_step = int(xs[-1]) + int(math.ceil(headroom / slope))
    return {
        "alert_type": ALERT_TYPE,
        "host": host,
        "series_kind": kind,
        "module": module,
        "dtype": dtype,
        "limit": limit,
        "first_step": int(xs[0]),
        "last_step": int(xs[-1]),
        "abs_max_first": float(ys[0]),
        "abs_max_last": float(ys[-1]),
        "bits_per_step": slope,
        "r_squared": r2,
        "num_points": len(xs),
        "headroom_bits": headroom,
        "projected_overflow_step": overflow_step,
        "message": "%s %s abs max grew %.2g -> %.2g over steps %d-%d (x%.2f per step); at this "
                   "rate it reaches the %s limit %.6g near step %d" % (
                       module, kind, ys[0], ys[-1], xs[0], xs[-1], 2.0 ** slope, dtype, limit,
                       overflow_step),
    }


def host_alerts(series):
    """Every OverflowGrowth alert of one host's series, most urgent first.

    Args:
      series: a :class:`~tb_numerics_plugin.reader.trends.SeriesReader` (call under
        the run's lock).

    Returns:
      list of dicts: ``alert_type`` "OverflowGrowth", ``host``, ``series_kind``,
      ``module``, ``dtype``, ``limit``, ``first_step``/``last_step`` (of the
      fitted points), ``abs_max_first``/``abs_max_last``, ``bits_per_step``,
      ``r_squared``, ``num_points``, ``headroom_bits`` (at the last point),
      ``projected_overflow_step`` and ``message``; sorted by steps left to
      overflow, then kind and module order. Cached until the series grows.
    """
    cached = _CACHE.get(series)
    if cached is not None and cached[0] == series.generation:
        return cached[1]
    alerts = []
    for kind in series.kinds():
        steps, modules, abs_max = series.table(kind, "abs_max")
        _, _, nonfinite = series.table(kind, "nonfinite")
        for row, module in enumerate(modules):
            alert = series_alert(series.host, kind, module, series.dtype(kind, module), steps,
                                 abs_max[row], nonfinite[row])
            if alert is not None:
                alerts.append(alert)
    alerts.sort(key=lambda a: a["projected_overflow_step"] - a["last_step"])
    _CACHE[series] = (series.generation, alerts)
    return alerts


def run_alerts(run):
    """The OverflowGrowth alerts of every host of ``run`` (hosts sorted, each host's most
    urgent first). Call ``run.update()`` first."""
    with run.lock:
        out = []
        for host in run.hosts:
            out.extend(host_alerts(run.trends(host)))
        return out
