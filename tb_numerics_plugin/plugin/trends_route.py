"""The body of ``GET trends``: one host's numerics series as a modules x steps grid.

Steps become columns; when a host has more summarized steps than the
request's ``max_steps``, consecutive steps share a column (a *bucket* of
``ceil(steps / max_steps)`` steps) and each stat is reduced the way that
keeps its warning: abs_max and max by their maximum, min by its minimum,
mean and std by their mean, nonfinite by its sum, headroom_bits by its
minimum. docs/http_api.md has the contract.
"""

import math
import warnings

import numpy as np

from tb_numerics_plugin import schema, series
from tb_numerics_plugin.analysis import growth as growth_lib

DEFAULT_MAX_STEPS = 400
MAX_STEPS_CAP = 2000
_REDUCE = {"abs_max": np.nanmax, "max": np.nanmax, "min": np.nanmin, "mean": np.nanmean,
           "std": np.nanmean, "nonfinite": np.nansum, "headroom_bits": np.nanmin}


def bucket_size(num_steps, max_steps):
    """Steps per column so that ``num_steps`` fit in at most ``max_steps`` columns (>= 1)."""
    return max(1, math.ceil(num_steps / max(1, max_steps)))


def bucketed(values, stat, bucket):
    """Reduces each run of ``bucket`` consecutive columns of ``values`` to one column.

    Args:
      values: float64[m, n], NaN where absent.
      stat: the stat the values are (picks the reduction, see the module docstring).
      bucket: columns per bucket (the last bucket may hold fewer).

    Returns:
      float64[m, ceil(n / bucket)]: NaN where a bucket holds no value.
    """
    if bucket == 1:
        return values
    m, n = values.shape
    cols = math.ceil(n / bucket)
    padded = np.full((m, cols * bucket), np.nan)
    padded[:, :n] = values
    grouped = padded.reshape(m, cols, bucket)
    with warnings.catch_warnings():  # all-NaN buckets: NaN is the answer, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        out = _REDUCE[stat](grouped, axis=2)
    if stat == "nonfinite":  # nansum of nothing is 0; absent stays absent
        out[np.isnan(grouped).all(axis=2)] = np.nan
    return out


def _floats(row):
    """A row for JSON: NaN (absent) as None; infinities are left to ``json_safe``."""
    return [None if v != v else v for v in row.tolist()]


def trends_body(reader, host, kind, stat, max_steps):
    """The ``trends`` answer for one host (call under the run's lock).

    Args:
      reader: the run's RunReader. host: a host label of it.
      kind: one of ``series.KINDS``. stat: one of ``series.STATS``.
      max_steps: most columns (already capped at :data:`MAX_STEPS_CAP`).

    Returns:
      dict: ``run``, ``host``, ``kind``, ``stat``, ``kinds``, ``stats``,
      ``steps``, ``step_span``, ``bucket``, ``modules``, ``growth``.
    """
    trends = reader.trends(host)
    steps, modules, values = trends.table(kind, stat)
    _, _, headroom = trends.table(kind, "headroom_bits")
    _, _, nonfinite = trends.table(kind, "nonfinite")
    bucket = bucket_size(len(steps), max_steps)
    starts = steps[::bucket]
    ends = steps[np.minimum(np.arange(len(starts)) * bucket + bucket - 1, len(steps) - 1)] \
        if len(steps) else steps
    values = bucketed(values, stat, bucket)
    headroom = bucketed(headroom, "headroom_bits", bucket)
    nonfinite = bucketed(nonfinite, "nonfinite", bucket)
    rows = []
    for i, module in enumerate(modules):
        dtype = trends.dtype(kind, module)
        rows.append({"module": module, "dtype": dtype, "limit": schema.DTYPE_MAX.get(dtype),
                     "values": _floats(values[i]), "headroom_bits": _floats(headroom[i]),
                     "nonfinite": _floats(nonfinite[i])})
    return {
        "run": reader.name,
        "host": host,
        "kind": kind,
        "stat": stat,
        "kinds": trends.kinds(),
        "stats": list(series.STATS),
        "steps": starts.tolist(),
        "step_span": [[int(a), int(b)] for a, b in zip(starts.tolist(), ends.tolist())],
        "bucket": bucket,
        "modules": rows,
        "growth": growth_lib.host_alerts(trends),
    }
