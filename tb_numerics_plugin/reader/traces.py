"""The graph-execution-trace index of one file set: numpy columns, no per-trace objects.

A trace record differs from the previous trace of the same op only in its
wall time and its debug tensor. So each record is split, with a vectorized
wire walk, into

- the wall time (8 bytes at a known place),
- the tensor_proto field (decoded in bulk: health vectors are a few
  little-endian doubles),
- everything else (context id, op name, slot, mode, device): the *key*,
  whose bytes are grouped in bulk and interned; a new key is parsed once
  with protobuf.

No Python code runs per record here; per chunk, one dict lookup per distinct
key. (Framing and CRC checks, in :mod:`wire`, are the per-record loops.)
"""

import dataclasses

import numpy as np

from tb_numerics_plugin import records
from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.reader import health as health_lib
from tb_numerics_plugin.reader import layout, tensors, wire
from tb_numerics_plugin.reader.columns import FLOAT32_IF_EXACT, Columns

_FULL_TENSOR = health_lib.MODE_CODES["FULL_TENSOR"]
_FULL_WIDTH = health_lib.FULL_HEALTH_WIDTH


class TraceKeys:
    """Distinct (context, op name, slot, mode, device) combinations of traces.

    A key is the serialized trace minus its tensor_proto field and its
    trailing step: the bytes before the tensor_proto (*prefix*: context, op
    name, slot, mode) and after it (*suffix*: device name and anything
    newer). Byte strings that decode to the same combination (a step encoded
    elsewhere than last, a field written twice) share one id.
    """

    def __init__(self):
        self.ids = {}  # prefix + suffix -> id
        self._by_identity = {}  # (context, op name, slot, mode, device) -> id
        self.by_prefix = {}  # prefix -> id of the first key seen with it
        self.suffix = []  # per id, its suffix bytes
        self.context = []  # graph id per key
        self.op_name = []
        self.output_slot = []
        self.mode = []
        self.device_name = []
        self._arrays = None
        self._suffixes = None
        self.unknown_modes = []  # (key id, mode) not yet reported

    def __len__(self):
        return len(self.context)

    def add(self, prefix, suffix):
        """Returns the id of a key, parsing it with protobuf if new; -1 if it does not parse.

        A key whose mode is unknown is kept with mode 0 (UNSPECIFIED: no
        health) and listed in :attr:`unknown_modes` for the table to report.
        """
        key = prefix + suffix
        kid = self.ids.get(key)
        if kid is not None:
            return kid
        try:
            trace = debug_event_pb2.GraphExecutionTrace.FromString(key)
        except Exception:  # DecodeError (e.g. a string field that is not UTF-8)
            return -1
        mode = int(trace.tensor_debug_mode)
        if not health_lib.known_mode(mode):
            self.unknown_modes.append((len(self.context), mode))
            mode = 0
        identity = (trace.tfdbg_context_id, trace.op_name, int(trace.output_slot), mode,
                    trace.device_name)
        kid = self._by_identity.get(identity)
        if kid is not None:
            self.ids[key] = kid
            return kid
        kid = self.ids[key] = self._by_identity[identity] = len(self.context)
        self.by_prefix.setdefault(prefix, kid)
        self.suffix.append(suffix)
        self.context.append(trace.tfdbg_context_id)
        self.op_name.append(trace.op_name)
        self.output_slot.append(int(trace.output_slot))
        self.mode.append(mode)
        self.device_name.append(trace.device_name)
        self._arrays = None
        return kid

    def suffix_table(self):
        """(suffix lengths, zero-padded suffix bytes matrix), one row per key."""
        if self._suffixes is None or len(self._suffixes[0]) != len(self.suffix):
            lengths = np.array([len(x) for x in self.suffix], np.int64)
            table = np.zeros((len(self.suffix), int(lengths.max(initial=0))), np.uint8)
            for i, x in enumerate(self.suffix):
                table[i, : len(x)] = np.frombuffer(x, np.uint8)
            self._suffixes = (lengths, table)
        return self._suffixes

    def mode_array(self):
        """Per-key mode codes as an int array (cached until a key is added)."""
        if self._arrays is None or len(self._arrays) != len(self.mode):
            self._arrays = np.asarray(self.mode, np.int64)
        return self._arrays


class TraceTable:
    """Digest columns of the graph execution traces of one file set.

    Columns: ``offset`` (of the record in the trace file), ``wall_time``,
    ``key`` (into :attr:`keys`), ``values`` (health vectors, NaN-padded;
    float32 while every value is exact in it, as counts up to 2**24 are),
    ``nvals`` (how many values the record carried; 0 = none), ``step``
    (the training step, :data:`~tb_numerics_plugin.reader.steps.NO_STEP` if unmarked).
    """

    def __init__(self):
        self.keys = TraceKeys()
        self.cols = Columns(
            {
                "offset": (np.int64, 0),
                "wall_time": (np.float64, 0),
                "key": (np.int32, 0),
                "values": (FLOAT32_IF_EXACT, 1),
                "nvals": (np.int16, 0),
                "step": (np.int64, 0),
            }
        )
        self.warnings = []

    def __len__(self):
        return len(self.cols)

    def steps(self):
        """Step of each trace (NO_STEP where unmarked; the column itself: read only)."""
        return self.cols["step"]

    def modes(self):
        """Mode code of each trace (int8: one byte a trace, as codes are 0 to 8)."""
        return self.keys.mode_array().astype(np.int8)[self.cols["key"]]

    def wall_times(self):
        """Wall time of each trace, in index order (the column itself: read only)."""
        return self.cols["wall_time"]

    def health_rows(self):
        """``(modes, values)``: each trace's mode code and NaN-padded health vector."""
        return self.modes(), self.cols["values"]

    def add_frames(self, frames, base_offset, path):
        """Indexes every record of one framed chunk of the trace file."""
        if not len(frames.starts):
            return
        arr = np.frombuffer(frames.buf, np.uint8)
        starts = frames.starts
        parts = layout.locate(arr, starts, starts + frames.lengths)
        header = records.HEADER_SIZE
        offsets = base_offset + starts - header
        self._warn_rows(path, offsets[~parts.usable], "is not a graph execution trace; skipped")
        rows = np.flatnonzero(parts.usable)
        if not len(rows):
            return
        parts = _select(parts, rows)
        offsets = offsets[rows]
        key_ids = self._key_ids(frames.buf, arr, parts)
        self._report_unknown_modes(path, offsets, key_ids)
        ok = key_ids >= 0
        self._warn_rows(path, offsets[~ok], "does not parse as a graph execution trace "
                        "(a string that is not UTF-8?); skipped")
        if not ok.all():
            rows = np.flatnonzero(ok)
            parts, offsets, key_ids = _select(parts, rows), offsets[rows], key_ids[rows]
            if not len(rows):
                return
        wall = np.zeros(len(key_ids))
        has_wall = parts.wall >= 0
        if has_wall.any():
            raw = np.ascontiguousarray(wire.gather(arr, parts.wall[has_wall], 8))
            wall[has_wall] = raw.view("<f8").ravel()
        wall = self._fix_wall_times(path, offsets, wall)
        values, nvals, broken = self._values(frames.buf, arr, parts, key_ids)
        for row, error in broken:
            self.warnings.append("%s: record at offset %d holds a debug tensor that does not "
                                 "decode (%s); its health is dropped"
                                 % (path, offsets[row], error))
        invalid = health_lib.invalid_rows(self.keys.mode_array()[key_ids], values, nvals)
        if invalid.any():
            self._warn_rows(path, offsets[invalid], health_lib.INVALID_VECTOR)
            values[invalid] = np.nan
            nvals[invalid] = 0
        self.cols.extend(
            offset=offsets,
            wall_time=wall,
            key=key_ids.astype(np.int32),
            values=values,
            nvals=nvals,
            step=parts.step,
        )

    def _warn_rows(self, path, offsets, what, shown=5):
        """One warning per bad record (the first ``shown``), then one with the count."""
        offsets = np.asarray(offsets).tolist()
        for offset in offsets[:shown]:
            self.warnings.append("%s: record at offset %d %s" % (path, offset, what))
        if len(offsets) > shown:
            self.warnings.append("%s: %d more records (first at offset %d) %s"
                                 % (path, len(offsets) - shown, offsets[shown], what))

    def _report_unknown_modes(self, path, offsets, key_ids):
        for kid, mode in self.keys.unknown_modes:
            first = np.flatnonzero(key_ids == kid)
            where = "record at offset %d" % offsets[first[0]] if len(first) else "a record"
            self.warnings.append("%s: %s has unknown tensor_debug_mode %d; read as "
                                 "UNSPECIFIED (no health)" % (path, where, mode))
        self.keys.unknown_modes = []

    def _fix_wall_times(self, path, offsets, wall):
        """Non-finite wall times take the previous record's (ordering stays sane, JSON valid)."""
        bad = ~np.isfinite(wall)
        if not bad.any():
            return wall
        self._warn_rows(path, offsets[bad], "has a non-finite wall_time; the previous "
                        "record's is used")
        last = float(self.cols["wall_time"][-1]) if len(self.cols) else 0.0
        good = np.where(bad, -1, np.arange(len(wall)))
        idx = np.maximum.accumulate(good)
        return np.where(idx >= 0, wall[np.maximum(idx, 0)], last)

    def _key_ids(self, buf, arr, parts):
        """Interns each trace's key (its bytes minus the tensor_proto field).

        Prefixes are grouped in bulk (:func:`wire.group_rows`), so Python looks
        up one prefix per distinct key and chunk; that each record's suffix
        (device name) is the one its prefix was first seen with is checked in
        bulk too. Records failing either check take the per-record path.
        """
        cut = np.where(parts.tp_tag >= 0, parts.tp_tag, parts.k_end)
        kid = np.full(len(cut), -1, np.int64)
        reps, inverse, grouped = wire.group_rows(arr, parts.t_start, cut - parts.t_start)
        get = self.keys.by_prefix.get
        rep_ids = np.array([get(buf[int(parts.t_start[r]) : int(cut[r])], -1) for r in reps],
                           np.int64)
        kid[grouped] = rep_ids[inverse[grouped]]
        known = np.flatnonzero(kid >= 0)
        if len(known):
            lengths, table = self.keys.suffix_table()
            want = lengths[kid[known]]
            same = (parts.k_end - parts.tp_end)[known] == want
            if table.shape[1]:
                got, inside = wire.gather_rows(arr, parts.tp_end[known], table.shape[1])
                cols = np.arange(table.shape[1])
                same &= inside & ((got == table[kid[known]]) | (cols >= want[:, None])).all(1)
            kid[known[~same]] = -1
        add = self.keys.add
        for row in np.flatnonzero(kid < 0).tolist():
            kid[row] = add(buf[int(parts.t_start[row]) : int(cut[row])],
                           buf[int(parts.tp_end[row]) : int(parts.k_end[row])])
        return kid

    def _values(self, buf, arr, parts, key_ids):
        """Decodes the debug tensors: health vectors in bulk, FULL_TENSOR one by one."""
        n = len(key_ids)
        tp_len = parts.tp_end - parts.tp_start
        full_tensor = self.keys.mode_array()[key_ids] == _FULL_TENSOR
        todo = (tp_len > 0) & ~full_tensor
        # Records whose tensor_proto has the same length almost always have the
        # same header (dtype, shape) and differ only in the trailing values:
        # check that once per length, then read all the values with one gather.
        plans = []
        for length in np.unique(tp_len[todo]):
            group = np.flatnonzero(todo & (tp_len == length))
            plan = _plan(buf, int(parts.tp_start[group[0]]), int(length))
            if plan is not None and plan[1] <= health_lib.MAX_VALUES:
                plans.append((group, int(length)) + plan)
        width = max([p[3] for p in plans] + [_FULL_WIDTH if full_tensor.any() else 1])
        values = np.full((n, width), np.nan)
        nvals = np.zeros(n, np.int16)
        for group, length, header, count, np_dtype in plans:
            same = (wire.gather(arr, parts.tp_start[group], len(header))
                    == np.frombuffer(header, np.uint8)).all(axis=1)
            group = group[same]
            raw = np.ascontiguousarray(
                wire.gather(arr, parts.tp_start[group] + len(header), length - len(header)))
            values[group, :count] = raw.view(np_dtype)
            nvals[group] = count
            todo[group] = False
        broken = []
        for row in np.flatnonzero(todo | ((tp_len > 0) & full_tensor)).tolist():
            try:
                vec = self._slow_values(buf, int(parts.tp_start[row]), int(tp_len[row]),
                                        bool(full_tensor[row]))
            except Exception as e:  # DecodeError, ValueError: a malformed debug tensor
                if len(broken) < 5:
                    broken.append((row, e))
                continue
            if vec is None:
                continue
            if len(vec) > health_lib.MAX_VALUES:
                # Not a health vector: a FULL_HEALTH/INVALID check flags the row.
                vec = vec[:1]
            if len(vec) > values.shape[1]:
                values = np.hstack([values, np.full((n, len(vec) - values.shape[1]), np.nan)])
            values[row, : len(vec)] = vec
            nvals[row] = len(vec)
        return values, nvals, broken

    @classmethod
    def _slow_values(cls, buf, start, length, full_tensor):
        """One tensor_proto decoded with protobuf (other layouts, FULL_TENSOR).

        Returns:
          float64 vector, or None for a tensor with no numeric values (strings).

        Raises:
          DecodeError, ValueError: a malformed tensor_proto.
        """
        try:
            if full_tensor:
                return cls._derive(buf, start, length)
            arr = tensors.to_array(buf[start : start + length])
        except tensors.UnsupportedTensor:
            return None
        return arr.astype(np.float64).ravel() if arr.size else None

    @staticmethod
    def _derive(buf, start, length):
        """FULL_TENSOR: a FULL_HEALTH-layout vector derived from the whole tensor.

        Raises:
          UnsupportedTensor: strings, resources. DecodeError, ValueError: malformed.
        """
        proto = tensors.tensor_pb2.TensorProto.FromString(buf[start : start + length])
        return health_lib.counts_of_array(tensors.to_array(proto), proto.dtype)


def _select(parts, rows):
    """The TraceParts of ``rows`` only."""
    return layout.TraceParts(*(getattr(parts, f.name)[rows] for f in dataclasses.fields(parts)))


def _plan(buf, start, length):
    """How to read a health vector straight from a tensor_proto's bytes.

    Returns:
      (header bytes, number of values, numpy dtype) when the values are the
      trailing bytes of the proto (tensor_content or packed double/float
      values as its last field, float64 or float32), else None.
    """
    proto_bytes = buf[start : start + length]
    try:
        proto = tensors.tensor_pb2.TensorProto.FromString(proto_bytes)
        arr = tensors.to_array(proto)
    except Exception:  # not a TensorProto, or not numeric: the slow path reports it
        return None
    np_dtype = {1: "<f4", 2: "<f8"}.get(proto.dtype)
    if np_dtype is None or arr.size == 0:
        return None
    nbytes = arr.size * np.dtype(np_dtype).itemsize
    if nbytes >= length:
        return None
    tail = np.frombuffer(proto_bytes[length - nbytes :], np_dtype)
    if not np.array_equal(tail, arr.ravel(), equal_nan=True):
        return None
    return proto_bytes[: length - nbytes], int(arr.size), np_dtype
