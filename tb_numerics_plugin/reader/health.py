"""Health vectors of tfdbg2 tensor debug modes: layouts, decoding, badness.

The reader uses it to build digests, the analysis to raise alerts. The
layouts, mode and dtype tables are the project's one vocabulary in
:mod:`tb_numerics_plugin.schema`; this module decodes and judges vectors
with them.
"""

import math

import numpy as np

from tb_numerics_plugin.schema import (  # noqa: F401  (re-exported: the reader's names)
    BAD_SLOTS,
    DTYPE_MAX,
    DTYPE_NAMES,
    FULL_HEALTH_WIDTH,
    FULL_KEYS,
    HEALTH_MODES,
    MODE_CODES,
    MODE_NAMES,
    NUMERIC_KEYS,
    dtype_name,
)

_BAD_SLOTS_BY_CODE = {MODE_CODES[name]: cols for name, cols in BAD_SLOTS.items()}
_THREE_SLOTS = MODE_CODES["REDUCE_INF_NAN_THREE_SLOTS"]


def mode_name(mode):
    """Returns the name of a TensorDebugMode given as int or name.

    Raises:
      ValueError: unknown mode.
    """
    if isinstance(mode, str):
        if mode not in MODE_CODES:
            raise ValueError("unknown tensor_debug_mode %r" % mode)
        return mode
    if int(mode) not in MODE_NAMES:
        raise ValueError("unknown tensor_debug_mode %r" % mode)
    return MODE_NAMES[int(mode)]


def json_float(x):
    """A float as JSON allows it: non-finite values as "NaN"/"Infinity"/"-Infinity"."""
    x = float(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


def _count(x):
    return int(x) if math.isfinite(x) else 0


def decode(mode, values, dtype=None):
    """Turns one health vector into a Health dict (docs/internals.md).

    Args:
      mode: TensorDebugMode as int or name.
      values: the debug tensor's values (sequence of numbers), or None.
        FULL_TENSOR expects the FULL_HEALTH-layout vector the reader derived.
      dtype: dtype name to report when the layout does not carry one.

    Returns:
      dict, or None when the mode carries no values (NO_TENSOR, UNSPECIFIED)
      or ``values`` is None/empty.

    Raises:
      ValueError: unknown mode, or fewer values than the mode's layout needs.
    """
    name = mode_name(mode)
    if values is None or len(values) == 0 or name in ("NO_TENSOR", "UNSPECIFIED"):
        return None
    v = [float(x) for x in values]
    health = {"mode": name}
    if name == "CURT_HEALTH":
        _need(name, v, 2)
        health["any_inf_or_nan"] = bool(v[1])
    elif name == "CONCISE_HEALTH":
        _need(name, v, 5)
        health.update(size=_count(v[1]), neg_inf=_count(v[2]), pos_inf=_count(v[3]),
                      nan=_count(v[4]))
    elif name == "REDUCE_INF_NAN_THREE_SLOTS":
        _need(name, v, 3)
        health.update(neg_inf=int(bool(v[0])), pos_inf=int(bool(v[1])), nan=int(bool(v[2])))
    elif name == "SHAPE":
        _need(name, v, 4)
        rank = _count(v[2])
        health.update(dtype=dtype_name(v[1]), rank=rank, size=_count(v[3]),
                      shape=[_count(d) for d in v[4 : 4 + min(rank, 6)]])
        return health
    else:  # FULL_HEALTH, FULL_NUMERICS, FULL_TENSOR (derived)
        _need(name, v, FULL_HEALTH_WIDTH)
        health.update(device_id=_count(v[1]), dtype=dtype_name(v[2]), rank=_count(v[3]))
        health.update({k: _count(x) for k, x in zip(FULL_KEYS, v[4:11])})
        if name == "FULL_NUMERICS":
            _need(name, v, FULL_HEALTH_WIDTH + len(NUMERIC_KEYS))
            health.update({k: json_float(x) for k, x in zip(NUMERIC_KEYS, v[11:17])})
    if "any_inf_or_nan" not in health:
        health["any_inf_or_nan"] = bool(health["neg_inf"] or health["pos_inf"] or health["nan"])
    if dtype is not None and "dtype" not in health:
        health["dtype"] = dtype
    return health


def _need(name, values, n):
    if len(values) < n:
        raise ValueError("%s needs %d values, got %d" % (name, n, len(values)))


def is_bad(mode_code, values):
    """Whether one health vector (a sequence of floats) shows inf or NaN."""
    cols = _BAD_SLOTS_BY_CODE.get(int(mode_code), ())
    if int(mode_code) == _THREE_SLOTS:
        return any(c < len(values) and values[c] != 0 for c in cols)  # NaN != 0 too
    return any(c < len(values) and values[c] > 0 for c in cols)


def bad_mask(modes, values):
    """Vectorized: which rows show inf or NaN.

    Args:
      modes: int array of TensorDebugMode codes, one per row.
      values: float 2-D array of health vectors (NaN-padded), one per row.

    Returns:
      bool array; False for rows whose mode carries no health.
    """
    modes = np.asarray(modes)
    out = np.zeros(len(modes), bool)
    if not len(modes) or values.ndim != 2:
        return out
    slots = BAD_SLOTS
    # a pass per mode, not np.bincount: that copies the codes to int64 first (10M traces: 80 MB)
    present = [code for code in MODE_CODES.values() if (modes == code).any()]
    for name, cols in slots.items():
        code = MODE_CODES[name]
        if code not in present or max(cols) >= values.shape[1]:
            continue
        hit = np.zeros(len(modes), bool)
        for c in cols:
            if code == _THREE_SLOTS:
                hit |= ~(values[:, c] == 0)  # -inf, +inf or NaN itself
            else:
                hit |= values[:, c] > 0  # CURT's flag is 1.0 when bad
        if len(present) == 1:
            return hit
        out |= hit & (modes == code)
    return out


# Per mode: (values needed, slots that must be finite, slots that are counts:
# finite, whole, 0 <= x <= 2**53). SHAPE's dims are counts up to its nvals.
_LAYOUT_RULES = {
    "CURT_HEALTH": (2, (0, 1), ()),
    "CONCISE_HEALTH": (5, (0,), (1, 2, 3, 4)),
    "FULL_HEALTH": (11, (0, 1, 2), tuple(range(3, 11))),
    "FULL_TENSOR": (11, (0, 1, 2), tuple(range(3, 11))),
    "FULL_NUMERICS": (17, (0, 1, 2), tuple(range(3, 11))),
    "SHAPE": (4, (0, 1), tuple(range(2, 10))),
    "REDUCE_INF_NAN_THREE_SLOTS": (3, (), ()),
}
_MAX_COUNT = float(1 << 53)
# Longest health vector kept (FULL_NUMERICS has 17 values, SHAPE 10): a longer
# one is not health, and must not widen a table's value column for every row.
MAX_VALUES = 32
INVALID_VECTOR = ("holds a debug tensor that does not fit its tensor_debug_mode (wrong number "
                  "of values, or counts that are not whole non-negative numbers); its health "
                  "is dropped")


def known_mode(code):
    """Whether ``code`` is a TensorDebugMode this reader knows."""
    return int(code) in MODE_NAMES


def invalid_rows(modes, values, nvals):
    """Vectorized check of health vectors against their mode's layout.

    A vector is invalid when it has fewer values than its layout needs, a
    non-finite id/device/dtype slot, or a count (size, rank, inf/NaN/sign
    counts, SHAPE dims) that is not a whole number in [0, 2**53].

    Args:
      modes: int array of mode codes; values: NaN-padded 2-D float array;
      nvals: int array of values per row (0 = none: always valid).

    Returns:
      bool array, True for invalid rows.
    """
    modes = np.asarray(modes)
    nvals = np.asarray(nvals)
    bad = np.zeros(len(modes), bool)
    width = values.shape[1] if values.ndim == 2 else 0
    for name, (need, finite, counts) in _LAYOUT_RULES.items():
        rows = np.flatnonzero((modes == MODE_CODES[name]) & (nvals > 0))
        if not len(rows):
            continue
        n = nvals[rows]
        hit = n < need
        with np.errstate(invalid="ignore"):
            for c in finite:
                if c < width:
                    hit |= ~np.isfinite(values[rows, c])
            for c in counts:
                if c >= width:
                    continue
                x = values[rows, c]
                wrong = ~np.isfinite(x) | (x < 0) | (x > _MAX_COUNT) | (np.floor(x) != x)
                hit |= wrong & (c < n)
        bad[rows] = hit
    return bad


def counts_of_array(array, dtype_enum=0, device_id=-1):
    """Derives a FULL_HEALTH-layout vector from a whole tensor (FULL_TENSOR mode).

    Args:
      array: numpy array of any dtype and shape.
      dtype_enum: TF DataType number to record.
      device_id: device id to record.

    Returns:
      float64 array of 11 values (tensor_id -1).
    """
    a = np.asarray(array)
    size = a.size
    if a.dtype.kind in "fc":
        x = a.real.astype(np.float64, copy=False).ravel() if a.dtype.kind == "c" else a.ravel()
        nan = int(np.isnan(x).sum())
        neg_inf = int(np.isneginf(x).sum())
        pos_inf = int(np.isposinf(x).sum())
        finite = x[np.isfinite(x)]
    elif a.dtype.kind in "iub":
        nan = neg_inf = pos_inf = 0
        finite = a.ravel()
    else:
        return np.array([-1, device_id, dtype_enum, a.ndim, size] + [0] * 6, np.float64)
    neg = int((finite < 0).sum())
    zero = int((finite == 0).sum())
    pos = int(finite.size - neg - zero)
    return np.array(
        [-1, device_id, dtype_enum, a.ndim, size, neg_inf, pos_inf, nan, neg, zero, pos],
        np.float64,
    )
