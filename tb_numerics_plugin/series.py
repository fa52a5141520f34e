"""Numerics over time: one small summary per module, kind and step, as TensorBoard scalars.

A writer process keeps, beside its tfdbg2 file set, a TensorBoard event file
``<file set prefix>.numerics.tfevents`` (TensorBoard reads every file whose
name holds ``tfevents``; TensorFlow's ``DebugDataReader`` and our file-set
pattern ignore it). Its records are ``tensorboard.Event`` protos in TFRecord
framing:

- the first: ``file_version: "brain.Event:2"``;
- one per summarized step: ``step``, ``wall_time`` and a ``summary`` with one
  ``simple_value`` per (kind, stat, module): tag
  ``numerics.<kind>.<stat>/[<part>/]<module>`` (:func:`tag`), so that the
  Scalars tab groups one chart per module under each kind and stat;
- in the same event, the first time a (kind, module) is seen and whenever its
  dtype changes, a descriptor value: tag ``numerics.<kind>.dtype/[<part>/]<module>``,
  ``metadata.plugin_data`` {plugin_name "numerics", content JSON
  ``{"version": 1, "kind", "module", "dtype"}``} and the dtype name as a
  string tensor. The Scalars tab ignores it (not a scalar).

Kinds (:data:`KINDS`): ``output`` (floating outputs of a module's forward),
``grad`` (gradients flowing into those outputs in backward), ``weight``
(a layer's parameters, written by writers that cannot see activations).
Stats (:data:`STATS`): abs_max, min, max, mean, std over finite elements;
nonfinite (count of -inf, +inf and NaN); headroom_bits =
log2(dtype limit / abs_max) (left out when abs_max is 0 or the dtype has no
limit). ``<part>`` names the rank (``rank3``) for writers that have one, so
the ranks of one dump root keep apart tags. A module called several times in
a step (shared layers, gradient accumulation) gets one merged summary.

This module is the format's one definition: the torch capture and the Keras
callback encode through it and the reader decodes through it. Pure Python,
numpy and protobuf.
"""

import json
import logging
import math
import os
import re
import time

import numpy as np
from tensorboard.compat.proto import event_pb2, tensor_pb2

from tb_numerics_plugin import records, schema

SUFFIX = "numerics.tfevents"
KINDS = ("output", "grad", "weight")
STATS = ("abs_max", "min", "max", "mean", "std", "nonfinite", "headroom_bits")
DESCRIPTOR_PLUGIN = "numerics"
FORMAT_VERSION = 1
_TAG_RE = re.compile(r"^numerics\.(%s)\.(%s|dtype)/(.+)$" % ("|".join(KINDS), "|".join(STATS)))
_DT_STRING = 7
_log = logging.getLogger("tb_numerics_plugin.series")

# Raw health row (torch/health.py, docs/format.md): counts, extrema, sum and squared deviations.
RAW_NEG_INF, RAW_POS_INF, RAW_NAN, RAW_NEG, RAW_ZERO, RAW_POS = range(6)
RAW_MIN, RAW_MAX, RAW_ABS_MIN_NONZERO, RAW_ABS_MAX, RAW_SUM, RAW_SUM_SQ_DEV = range(6, 12)


def check_trends(value):
    """Validates a ``trends`` argument (the torch capture's, the callbacks').

    Args:
      value: True (every step), False (off) or a positive int N (steps divisible by N).

    Returns:
      int: N (1 for True, 0 for False).

    Raises:
      ValueError: anything else (the message names ``trends``).
    """
    if value is True or value is False:
        return int(value)
    if isinstance(value, int) and value >= 1:
        return int(value)
    raise ValueError("trends must be True, False or a positive int (summarize every Nth "
                     "step), not %r" % (value,))


def path_for(prefix):
    """The series file of the file set with path prefix ``prefix``."""
    return "%s.%s" % (prefix, SUFFIX)


def tag(kind, stat, module, part=None):
    """The scalar tag of one series (``stat`` may also be ``"dtype"``, the descriptor)."""
    return "numerics.%s.%s/%s%s" % (kind, stat, part + "/" if part else "", module)


def parse_tag(text):
    """``(kind, stat, part, module)`` of a tag :func:`tag` made, else None (part may be None)."""
    m = _TAG_RE.match(text)
    if m is None:
        return None
    rest = m.group(3)
    part, sep, module = rest.partition("/")
    if not sep:
        part, module = None, rest
    return m.group(1), m.group(2), part, module


def headroom_bits(abs_max, dtype):
    """log2(limit of ``dtype`` / ``abs_max``), or None (no limit, abs_max 0 or not finite)."""
    limit = schema.DTYPE_MAX.get(dtype)
    if limit is None or not (abs_max > 0) or not math.isfinite(abs_max):
        return None
    return math.log2(limit / abs_max)


def raw_row(values):
    """The raw health row of an array, computed with numpy (for writers without torch).

    Same layout and meaning as the torch kernels' rows (``torch/health.py``):
    counts of -inf, +inf, NaN, negative, zero and positive finite elements;
    finite min, max, smallest nonzero |x|, largest |x|; sum and squared
    deviations from the finite mean. Computed in float64.
    """
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    fin = np.isfinite(x)
    f = x[fin]
    row = np.array([np.count_nonzero(x == -np.inf), np.count_nonzero(x == np.inf),
                    np.count_nonzero(np.isnan(x)), np.count_nonzero(f < 0),
                    np.count_nonzero(f == 0), np.count_nonzero(f > 0),
                    np.inf, -np.inf, np.inf, -1.0, 0.0, 0.0])
    if f.size:
        a = np.abs(f)
        nonzero = a[a > 0]
        total = float(f.sum())
        row[RAW_MIN:] = [f.min(), f.max(), nonzero.min() if nonzero.size else np.inf, a.max(),
                         total, float(((f - total / f.size) ** 2).sum())]
    return row


def merge_raw(rows, dtype):
    """One summary from raw health rows of the same module, kind and step.

    Args:
      rows: array-like of raw rows (``health.RAW_WIDTH`` wide, moments level).
      dtype: numpy-style dtype name of the tensors.

    Returns:
      {stat: float} with the stats of :data:`STATS` that have a value (min, max,
      mean, std and abs_max are left out when no element is finite).
    """
    # Plain floats: a step merges one or two rows per (kind, module) for dozens of modules,
    # where numpy's per-call overhead would cost more than the arithmetic.
    if isinstance(rows, np.ndarray):
        rs = rows.astype(np.float64, copy=False).reshape(-1, 12).tolist()
    else:
        rs = [r if isinstance(r, list) else np.asarray(r, np.float64).tolist() for r in rows]
    counts = [r[RAW_NEG] + r[RAW_ZERO] + r[RAW_POS] for r in rs]
    n = float(sum(counts))
    out = {"nonfinite": float(sum(r[RAW_NEG_INF] + r[RAW_POS_INF] + r[RAW_NAN] for r in rs))}
    if n > 0:
        mean = sum(r[RAW_SUM] for r in rs) / n
        m2 = 0.0
        for r, c in zip(rs, counts):
            m2 += r[RAW_SUM_SQ_DEV]
            if c > 0:
                m2 += c * (r[RAW_SUM] / c - mean) ** 2
        abs_max = float(max(r[RAW_ABS_MAX] for r in rs))
        out.update(min=float(min(r[RAW_MIN] for r in rs)), max=float(max(r[RAW_MAX] for r in rs)),
                   abs_max=abs_max, mean=mean, std=math.sqrt(max(m2, 0.0) / n))
        bits = headroom_bits(abs_max, dtype)
        if bits is not None:
            out["headroom_bits"] = bits
    return out


def file_version_record(wall_time=None):
    """The framed first record of a series file."""
    event = event_pb2.Event(wall_time=time.time() if wall_time is None else wall_time,
                            file_version="brain.Event:2")
    return records.encode(event.SerializeToString())


def step_record(step, summaries, part=None, descriptors=(), wall_time=None):
    """The framed event of one step.

    Args:
      step: the training step (int).
      summaries: iterable of ``(kind, module, stats)``, stats as :func:`merge_raw` returns.
      part: the writer's part (``rank3``) or None.
      descriptors: iterable of ``(kind, module, dtype)`` to (re)declare in this event.
      wall_time: seconds since the epoch (now when None).
    """
    event = event_pb2.Event(wall_time=time.time() if wall_time is None else wall_time,
                            step=int(step))
    values = event.summary.value
    for kind, module, dtype in descriptors:
        v = values.add(tag=tag(kind, "dtype", module, part))
        v.metadata.plugin_data.plugin_name = DESCRIPTOR_PLUGIN
        v.metadata.plugin_data.content = json.dumps(
            {"version": FORMAT_VERSION, "kind": kind, "module": module, "dtype": dtype}).encode()
        v.tensor.CopyFrom(tensor_pb2.TensorProto(dtype=_DT_STRING, string_val=[dtype.encode()]))
    for kind, module, stats in summaries:
        for stat in STATS:
            value = stats.get(stat)
            if value is not None:
                values.add(tag=tag(kind, stat, module, part), simple_value=value)
    return records.encode(event.SerializeToString())


def decode_event(payload):
    """Parses one record's payload.

    Returns:
      ``(step, wall_time, values, descriptors)``: values a list of
      ``(kind, stat, part, module, float)``, descriptors a list of
      ``(kind, part, module, dtype)``; ``(None, wall_time, [], [])`` for the
      file-version event and events that hold no series.

    Raises:
      ValueError: the payload is not an Event (the message says why).
    """
    try:
        event = event_pb2.Event.FromString(payload)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise ValueError("not a tensorboard Event: %s" % exc) from None
    if not event.HasField("summary"):
        return None, event.wall_time, [], []
    values, descriptors = [], []
    for v in event.summary.value:
        parsed = parse_tag(v.tag)
        if parsed is None:
            continue
        kind, stat, part, module = parsed
        if stat == "dtype":
            if v.HasField("tensor") and v.tensor.string_val:
                descriptors.append((kind, part, module,
                                    v.tensor.string_val[0].decode("utf-8", "replace")))
        elif v.WhichOneof("value") == "simple_value":
            values.append((kind, stat, part, module, float(v.simple_value)))
    return int(event.step), event.wall_time, values, descriptors


class SeriesWriter:
    """Appends step events to one series file; never raises into the training step.

    Args:
      path: the file (``path_for(prefix)``); created with its file-version
        record when missing, appended to when it exists (a reopened file set).
      part: the writer's part (``rank3``) or None.

    Attributes:
      written: step events written. lost: step events a write error dropped.
      error: the first write error (str) or None.
    """

    def __init__(self, path, part=None):
        self.path = path
        self.part = part
        self.written = 0
        self.lost = 0
        self.error = None
        self._dtypes = {}  # (kind, module) -> dtype last declared
        self._fd = None

    def _open(self):
        if self._fd is None:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND
                         | getattr(os, "O_CLOEXEC", 0), 0o666)
            if os.fstat(fd).st_size == 0:
                os.write(fd, file_version_record())
            self._fd = fd
        return self._fd

    def write_step(self, step, summaries, wall_time=None):
        """Writes one step.

        Args:
          step: int.
          summaries: iterable of ``(kind, module, dtype, stats)``.
        """
        summaries = list(summaries)
        if not summaries:
            return
        descriptors = []
        for kind, module, dtype, _ in summaries:
            if self._dtypes.get((kind, module)) != dtype:
                self._dtypes[(kind, module)] = dtype
                descriptors.append((kind, module, dtype))
        data = step_record(step, [(k, m, s) for k, m, _, s in summaries], self.part,
                           descriptors, wall_time)
        try:
            fd = self._open()
            written = os.write(fd, data)
            if written != len(data):  # a full disk mid-record: cut back to whole records
                os.ftruncate(fd, os.fstat(fd).st_size - written)
                raise OSError("short write (%d of %d bytes)" % (written, len(data)))
            self.written += 1
        except OSError as exc:
            self.lost += 1
            for kind, module, _ in descriptors:
                self._dtypes.pop((kind, module), None)
            if self.error is None:
                self.error = "%s: %s" % (self.path, exc)
                _log.warning("tb-numerics: cannot write the numerics series %s (%s); "
                             "later steps are counted as lost", self.path, exc)

    def close(self):
        """Closes the file (a later write reopens it)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
