"""Vectorized location of the parts of graph-execution-trace records.

TF's writer and ours serialize a trace the same way (protobuf writes fields
in number order)::

    DebugEvent: 09 <wall_time: 8 bytes> 52 <len> GraphExecutionTrace
    GraphExecutionTrace: 0a <context id> 12 <op name> [18 <slot>] [20 <mode>]
                         2a <len> TensorProto [32 <device name>] [a8 06 <step>]

:func:`locate` checks that layout for all records at once with a handful
of numpy operations; records that do not match (other writers, unknown
fields) go through the generic vectorized wire walk, so any valid encoding
is read, only slower.
"""

import dataclasses

import numpy as np

from tb_numerics_plugin.reader import wire
from tb_numerics_plugin.reader.steps import NO_STEP

_WALL_TIME, _TRACE, _TENSOR_PROTO, _STEP = 1, 10, 5, 101


@dataclasses.dataclass
class TraceParts:
    """Positions in the chunk, one entry per record (int64 arrays).

    ``wall`` is -1 when the record has no wall_time; ``k_end`` is where the
    trace's *key* bytes end: the start of a trailing step field, else
    ``t_end``; ``tp_tag`` is -1 when it has no tensor_proto (then
    ``tp_start == tp_end == k_end``); ``step`` is the step field's value or
    :data:`NO_STEP`; ``usable`` is False for records that are not graph
    execution traces.
    """

    usable: np.ndarray
    wall: np.ndarray
    t_start: np.ndarray
    t_end: np.ndarray
    tp_tag: np.ndarray
    tp_start: np.ndarray
    tp_end: np.ndarray
    k_end: np.ndarray
    step: np.ndarray


def _varint3(arr, pos):
    """Varints of at most 3 bytes at ``pos``: (value, size); size 0 = longer (unsupported)."""
    b0 = arr[pos].astype(np.int64)
    if (b0 < 0x80).all():  # the common case: lengths and enums below 128
        return b0, np.ones(len(pos), np.int64)
    b1 = arr[pos + 1].astype(np.int64)
    b2 = arr[pos + 2].astype(np.int64)
    one, two, three = b0 < 0x80, b1 < 0x80, b2 < 0x80
    value = np.where(one, b0, np.where(two, (b0 & 0x7F) | (b1 << 7),
                                       (b0 & 0x7F) | ((b1 & 0x7F) << 7) | (b2 << 14)))
    size = np.where(one, 1, np.where(two, 2, np.where(three, 3, 0)))
    return value, size


def _canonical(arr, starts, ends):
    """The fast path: TraceParts for all records plus a mask of those that fit the layout."""
    limit = len(arr) - 3  # _varint3 reads up to 2 bytes past a position

    def at(pos):
        return np.minimum(pos, limit)

    ok = (arr[at(starts)] == 0x09) & (arr[at(starts + 9)] == 0x52)
    length, size = _varint3(arr, at(starts + 10))
    t_start = starts + 10 + size
    t_end = t_start + length
    ok &= (size > 0) & (t_end == ends)
    pos = t_start
    for tag in (0x0A, 0x12):  # context id, op name: length-delimited
        here = arr[at(pos)] == tag
        ln, sz = _varint3(arr, at(pos + 1))
        ok &= ~here | (sz > 0)
        pos = np.where(here, pos + 1 + sz + ln, pos)
    for tag in (0x18, 0x20):  # output slot, mode: varints
        here = arr[at(pos)] == tag
        _, sz = _varint3(arr, at(pos + 1))
        ok &= ~here | (sz > 0)
        pos = np.where(here, pos + 1 + sz, pos)
    has_tp = (arr[at(pos)] == 0x2A) & (pos < t_end)
    ln, sz = _varint3(arr, at(pos + 1))
    tp_start = np.where(has_tp, pos + 1 + sz, t_end)
    tp_end = np.where(has_tp, tp_start + ln, t_end)
    ok &= np.where(has_tp, (sz > 0) & (tp_end <= t_end),
                   (pos == t_end) | (arr[at(pos)] == 0x32))
    k_end, step, step_ok = _tail_step(arr, np.where(has_tp, tp_end, pos), t_end, at)
    ok &= step_ok
    parts = TraceParts(ok.copy(), starts + 1, t_start, t_end, np.where(has_tp, pos, -1),
                       np.where(has_tp, tp_start, k_end), np.where(has_tp, tp_end, k_end),
                       k_end, step)
    return parts, ok


def _tail_step(arr, pos, t_end, at):
    """The optional ``[32 <device name>] [a8 06 <step>]`` ending a trace from ``pos``.

    Returns:
      (k_end, step, ok): where the key bytes end (the step's tag, else
      ``t_end``), the step or NO_STEP, and whether the tail has that layout
      (anything else goes through the generic walk).
    """
    dev = (arr[at(pos)] == 0x32) & (pos < t_end)
    ln, sz = _varint3(arr, at(pos + 1))
    ok = ~dev | (sz > 0)
    pos = np.where(dev, pos + 1 + sz + ln, pos)
    has_step = (pos < t_end) & (arr[at(pos)] == 0xA8) & (arr[at(pos + 1)] == 0x06)
    step = np.full(len(pos), NO_STEP, np.int64)
    if not has_step.any():  # TF's dumps, unmarked records: nothing more to read
        return t_end, step, ok & (pos == t_end)
    rows = np.flatnonzero(has_step)
    value, after = wire.varint(arr, pos[rows] + 2)
    step[rows] = value.astype(np.int64)
    ends = pos.copy()
    ends[rows] = after
    ok &= np.where(has_step, ends == t_end, pos == t_end)
    return np.where(has_step, pos, t_end), step, ok


def _generic(arr, starts, ends, rows, parts):
    """Fills ``parts`` for ``rows`` with the generic wire walk."""
    top, malformed = wire.walk(arr, starts[rows], ends[rows], (_WALL_TIME, _TRACE))
    trace = top[_TRACE]
    good = ~malformed & (trace.tag >= 0)
    t_start = np.where(good, trace.start, 0)
    t_end = np.where(good, trace.start + trace.length, 0)
    inner, bad = wire.walk(arr, t_start, t_end, (_TENSOR_PROTO, _STEP))
    good &= ~bad
    tp = inner[_TENSOR_PROTO]
    has_tp = tp.tag >= 0
    tp_end = np.where(has_tp, tp.start + tp.length, 0)
    st = inner[_STEP]
    has_step = good & (st.tag >= 0)
    has_step[has_step] = arr[st.tag[has_step]] == 0xA8  # a varint, as the schema says
    # The step leaves the key only as the trace's last field (where protobuf
    # writes it); elsewhere it stays in the key bytes, which TraceKeys dedupes.
    after = wire.varint(arr, np.where(has_step, st.start, 0))[1]
    tail = has_step & (after == t_end) & (st.tag > tp_end)
    k_end = np.where(tail, st.tag, t_end)
    parts.usable[rows] = good
    parts.wall[rows] = top[_WALL_TIME].start
    parts.t_start[rows] = t_start
    parts.t_end[rows] = t_end
    parts.tp_tag[rows] = np.where(has_tp, tp.tag, -1)
    parts.tp_start[rows] = np.where(has_tp, tp.start, k_end)
    parts.tp_end[rows] = np.where(has_tp, tp_end, k_end)
    parts.k_end[rows] = k_end
    parts.step[rows] = np.where(has_step, st.value.astype(np.int64), NO_STEP)


def locate(arr, starts, ends):
    """Finds wall time, trace message and tensor_proto of each record.

    Args:
      arr: the chunk as a uint8 array.
      starts, ends: int64 payload bounds of each record.

    Returns:
      TraceParts.
    """
    parts, ok = _canonical(arr, starts, ends)
    rows = np.flatnonzero(~ok)
    if len(rows):
        _generic(arr, starts, ends, rows, parts)
    return parts
