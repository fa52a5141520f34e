"""Vectorized decoding of execution records: the bulk path of the execution index.

An execution record (``DebugEvent{wall_time=1, execution=9}``; TF's layout
``09 <8 bytes> 4a <length> <Execution>`` is checked for all records at once)
has its Execution walked field by field for all records of a chunk together
(:func:`protowire.fields`: one numpy step per field *position*, not per
record). What the digest needs is read from the flat field table: op type
and graph id (byte strings grouped in bulk, decoded once per distinct value),
mode, step, input/output tensor ids (packed or not) and each tensor_proto's
health vector, gathered per tensor_proto *header* (the bytes before
``tensor_content``: dtype, shape, content length; parsed with protobuf once
and remembered). Code locations are checked with protobuf once per distinct
value (a dict lookup per record).

The fast path only accepts what it reads exactly as protobuf does: every
field of the schema with its declared wire type, each scalar at most once,
well-formed varints, valid UTF-8 strings, a ``code_location`` and tensor
headers that protobuf itself accepted. Anything else (unknown fields, odd
encodings, FULL_TENSOR, unknown modes, other dtypes) is marked in
``Decoded.slow`` for the per-record protobuf path, which owns every warning.
"""

import dataclasses

import numpy as np

from tb_numerics_plugin.proto import debug_event_pb2, tensor_pb2
from tb_numerics_plugin.reader import health as health_lib
from tb_numerics_plugin.reader import protowire, wire
from tb_numerics_plugin.reader.steps import NO_STEP

_V, _L = 1 << protowire.VARINT, 1 << protowire.LEN
# Allowed wire types per field number (repeated ints: packed or not).
_TOP_TABLE = protowire.schema_table({1: 1 << protowire.FIXED64, 9: _L})
_EXEC_TABLE = protowire.schema_table({1: _L, 2: _V, 3: _L, 4: _V | _L, 5: _V | _L, 6: _V,
                                      7: _L, 8: _L, 9: _V | _L, 100: _V | _L, 101: _V})
_SINGULAR = (1, 2, 3, 6, 8, 101)  # last-one-wins or merged fields: twice = per-record path
_PACKED_INTS = (4, 5, 9, 100)
_CONTENT = 4  # TensorProto.tensor_content
_NP_DTYPE = {1: "<f4", 2: "<f8"}
_FULL_TENSOR = health_lib.MODE_CODES["FULL_TENSOR"]
_BAD_SLOTS = {health_lib.MODE_CODES[name]: cols for name, cols in health_lib.BAD_SLOTS.items()}
_THREE_SLOTS = health_lib.MODE_CODES["REDUCE_INF_NAN_THREE_SLOTS"]
_MAX_STRING = 256  # longer op types / graph ids: per-record path
_MAX_CACHED = 4096
_MAX_HEADERS = 8  # distinct tensor headers tried per length and chunk; the rest: per record


@dataclasses.dataclass
class Decoded:
    """The digest fields of the records the fast path read (``~slow``).

    Per record (arrays of the chunk's length; meaningful where ``~slow``):
    ``wall``, ``op`` and ``graph`` (indexes into ``names``; graph -1 = none),
    ``mode``, ``step``, ``values`` (NaN-padded) and ``nvals``. Ids: flat
    ``out_ids``/``out_rows`` and ``in_ids``/``in_rows`` (the record of each
    id, in order).
    """

    slow: np.ndarray
    wall: np.ndarray
    op: np.ndarray
    graph: np.ndarray
    names: list
    mode: np.ndarray
    step: np.ndarray
    values: np.ndarray
    nvals: np.ndarray
    out_ids: np.ndarray
    out_rows: np.ndarray
    in_ids: np.ndarray
    in_rows: np.ndarray


class Decoder:
    """Decodes chunks of execution records; keeps what it learnt (tensor headers,
    code locations that protobuf accepted) for the next chunks."""

    def __init__(self):
        self._plans = {}  # tensor header bytes -> (numpy dtype, count) or None
        self._locations = {}  # code_location bytes -> parses

    def decode(self, buf, starts, ends):
        """Decodes the records ``buf[starts[i] : ends[i]]``.

        Returns:
          Decoded.
        """
        arr = np.frombuffer(buf, np.uint8)
        n = len(starts)
        wall_at, ex_start, ex_end, slow = _top_level(arr, starts, ends)
        wall = np.zeros(n)
        has = wall_at >= 0
        if has.any():
            wall[has] = np.ascontiguousarray(wire.gather(arr, wall_at[has], 8)).view("<f8").ravel()
        ex, bad = protowire.fields(arr, ex_start, ex_end)
        slow |= bad
        slow |= protowire.allowed_only(ex, _EXEC_TABLE, n)
        for number in _SINGULAR:
            slow |= protowire.counts(ex, number, n) > 1
        ex = ex.select(~slow[ex.row]).by_number()
        none = ex.get(0, protowire.Flat(*[np.zeros(0, np.int64)] * 6, np.zeros(0, np.uint64)))
        mode = np.zeros(n, np.int64)
        m = ex.get(6, none)
        mode[m.row] = np.where(m.value <= 8, m.value, 255).astype(np.int64)
        slow |= (mode == _FULL_TENSOR) | ~np.isin(mode, list(health_lib.MODE_NAMES))
        step = np.full(n, NO_STEP, np.int64)
        s = ex.get(101, none)
        step[s.row] = s.value.view(np.int64)
        names, op, graph = self._strings(buf, arr, ex.get(1, none), ex.get(3, none), n, slow)
        self._check_locations(buf, ex.get(8, none), slow)
        ids = {}
        for number in _PACKED_INTS:
            ids[number] = self._ids(arr, ex.get(number, none), n, slow)
        values, nvals = self._values(buf, arr, ex.get(7, none), mode, n, slow)
        return Decoded(slow, wall, op, graph, names, mode, step, values, nvals,
                       *ids[5], *ids[4])

    @staticmethod
    def _strings(buf, arr, op_type, graph_id, n, slow):
        """op_type and graph_id of each record as indexes into a list of distinct strings."""
        names, index = [], {}
        out = []
        for number, f in ((1, op_type), (3, graph_id)):
            start = np.zeros(n, np.int64)
            length = np.zeros(n, np.int64)
            start[f.row], length[f.row] = f.data, f.length
            slow |= length > _MAX_STRING
            rows = np.flatnonzero(~slow & ((length > 0) | (number == 1)))
            col = np.full(n, -1, np.int64)
            reps, inverse, certain = wire.group_rows(arr, start[rows], length[rows])
            slow[rows[~certain]] = True
            ids = np.empty(len(reps), np.int64)
            for j, r in enumerate(rows[reps].tolist()):
                raw = buf[int(start[r]) : int(start[r] + length[r])]
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:  # protobuf refuses it: the per-record path says so
                    ids[j] = -1
                    continue
                ids[j] = index.get(text, -1)
                if ids[j] < 0:
                    ids[j] = index[text] = len(names)
                    names.append(text)
            if len(reps):
                col[rows[certain]] = ids[inverse[certain]]
            slow[rows[col[rows] < 0]] = True
            out.append(col)
        return names, out[0], out[1]

    def _check_locations(self, buf, f, slow):
        """Marks slow the records whose code_location protobuf does not accept.

        A program's executions come from few call sites, so the distinct code
        locations are few: each is parsed once with protobuf and remembered.
        (One dict lookup per record: cheaper than grouping these ~600-byte
        strings with numpy, which needs a gather and a hash per length.)
        """
        f = f.select(~slow[f.row])
        known = self._locations
        for row, a, b in zip(f.row.tolist(), f.data.tolist(), (f.data + f.length).tolist()):
            if not known.get(buf[a:b]) and not self._location_ok(buf[a:b]):
                slow[row] = True

    @staticmethod
    def _ids(arr, f, n, slow):
        """Repeated int64 fields (packed or not): (ids in order, record of each)."""
        one = f.select(f.wtype == protowire.VARINT)
        pk = f.select(f.wtype == protowire.LEN)
        values, owner, ok = protowire.packed(arr, pk.data, pk.length)
        slow[pk.row[~ok]] = True
        pos = np.concatenate([one.tag, pk.tag[owner]])
        ids = np.concatenate([one.value, values]).view(np.int64)
        rows = np.concatenate([one.row, pk.row[owner]])
        order = np.argsort(pos, kind="stable")
        return ids[order], rows[order]

    def _values(self, buf, arr, tp, mode, n, slow):
        """The representative health vector of each record (see executions.representative)."""
        values = np.full((n, 1), np.nan)
        nvals = np.zeros(n, np.int64)
        tp = tp.select(~slow[tp.row])
        if not len(tp.row):
            return values, nvals
        ok = np.zeros(len(tp.row), bool)
        dtype_of = np.full(len(tp.row), -1, np.int64)  # index into plans below
        count = np.zeros(len(tp.row), np.int64)
        content = np.zeros(len(tp.row), np.int64)
        plans = []
        # Tensor protos of one length almost always share their header (dtype,
        # shape, content length): each header is checked once, then matched in bulk.
        for length in np.unique(tp.length[tp.length > 0]).tolist():
            todo = np.flatnonzero(tp.length == length)
            for _ in range(_MAX_HEADERS):
                if not len(todo):
                    break
                r = int(todo[0])
                plan = self._plan(buf, int(tp.data[r]), length)
                if plan is None:
                    todo = todo[1:]
                    continue
                head = np.frombuffer(plan[0], np.uint8)
                same = (wire.gather(arr, tp.data[todo], len(head)) == head).all(axis=1)
                sel = todo[same]
                if plan[1:] not in plans:
                    plans.append(plan[1:])
                ok[sel] = True
                dtype_of[sel] = plans.index(plan[1:])
                count[sel] = plan[2]
                content[sel] = tp.data[sel] + len(head)
                todo = todo[~same]
        # An empty tensor_proto (TF's for an output of a non-float dtype) holds no value.
        none = tp.length == 0
        ok |= none
        slow[tp.row[~ok]] = True
        keep = ok & ~none & ~slow[tp.row]
        width = max([p[1] for p in plans] + [1])
        vec = np.full((len(tp.row), width), np.nan)
        for k, (np_dtype, cnt) in enumerate(plans):
            sel = np.flatnonzero(keep & (dtype_of == k))
            raw = np.ascontiguousarray(
                wire.gather(arr, content[sel], cnt * np.dtype(np_dtype).itemsize))
            vec[sel, :cnt] = raw.view(np_dtype).astype(np.float64)
        pick = np.flatnonzero(keep & (mode[tp.row] != 0))
        chosen = _representatives(tp.row[pick], mode[tp.row[pick]], vec[pick], count[pick])
        values = np.full((n, width), np.nan)
        values[tp.row[pick[chosen]]] = vec[pick[chosen]]
        nvals[tp.row[pick[chosen]]] = count[pick[chosen]]
        return values, nvals

    def _location_ok(self, raw):
        """Whether protobuf accepts ``raw`` as a CodeLocation (remembered)."""
        ok = self._locations.get(raw)
        if ok is None:
            try:
                debug_event_pb2.CodeLocation.FromString(raw)
                ok = True
            except Exception:  # DecodeError: a string that is not UTF-8, bad framing
                ok = False
            if len(self._locations) < _MAX_CACHED:
                self._locations[raw] = ok
        return ok

    def _plan(self, buf, start, length):
        """How to read the values of the tensor_proto ``buf[start : start + length]``.

        Returns:
          (header bytes, numpy dtype, count), or None. The values are the
          tensor_content, the proto's last field, after ``header``; every
          tensor_proto with the same header decodes the same way (the content
          is opaque bytes). None unless protobuf accepts the proto and the
          per-record path would read it as float32/float64 values (no longer
          than a health vector).
        """
        raw = buf[start : start + length]
        cut = protowire.last_field_start(raw, _CONTENT)
        if cut is None:
            return None
        head = raw[:cut]
        if head in self._plans:
            return self._plans[head]
        plan = None
        try:
            proto = tensor_pb2.TensorProto.FromString(raw)
        except Exception:  # DecodeError: the per-record path reports it
            proto = None
        if proto is not None and proto.dtype in _NP_DTYPE:
            size = np.dtype(_NP_DTYPE[proto.dtype]).itemsize
            got = len(proto.tensor_content)
            if got == length - cut and got and got % size == 0 \
                    and got // size <= health_lib.MAX_VALUES:
                plan = (head, _NP_DTYPE[proto.dtype], got // size)
        if len(self._plans) < _MAX_CACHED:
            self._plans[head] = plan
        return plan


def _top_level(arr, starts, ends):
    """Where each record's wall time (-1: none) and Execution are, and which records
    are not one wall time plus one Execution (``slow``).

    TF's and our writer's layout, ``09 <8 bytes> 4a <length> <Execution>``, is
    checked for all records at once; the others take the generic walk.
    """
    n = len(starts)
    last = len(arr) - 1
    canonical = (ends - starts >= 11) & (arr[np.minimum(starts, last)] == 0x09) \
        & (arr[np.minimum(starts + 9, last)] == 0x4A)
    length, ex_start, ok = protowire.varint(arr, starts + 10, ends)
    ex_end = ex_start + np.minimum(length, np.uint64(1 << 62)).astype(np.int64)
    canonical &= ok & (ex_end == ends)
    wall_at = np.where(canonical, starts + 1, -1)
    ex_start = np.where(canonical, ex_start, 0)
    ex_end = np.where(canonical, ex_end, 0)
    slow = np.zeros(n, bool)
    rows = np.flatnonzero(~canonical)
    if len(rows):
        top, bad = protowire.fields(arr, starts[rows], ends[rows])
        bad |= protowire.allowed_only(top, _TOP_TABLE, len(rows))
        bad |= (protowire.counts(top, 1, len(rows)) > 1) | (protowire.counts(top, 9, len(rows)) != 1)
        slow[rows] = bad
        w = top.select(top.number == 1)
        wall_at[rows[w.row]] = w.data
        e = top.select((top.number == 9) & ~bad[top.row])
        ex_start[rows[e.row]], ex_end[rows[e.row]] = e.data, e.data + e.length
    return wall_at, ex_start, ex_end, slow


def _representatives(rows, modes, vec, count):
    """Index of each record's representative among its tensor_protos (sorted by record).

    The first whose vector shows inf/NaN (``health.is_bad``), else the first.
    """
    if not len(rows):
        return np.zeros(0, np.int64)
    bad = np.zeros(len(rows), bool)
    with np.errstate(invalid="ignore"):
        for code, cols in _BAD_SLOTS.items():
            sel = modes == code
            if not sel.any():
                continue
            for c in cols:
                if c >= vec.shape[1]:
                    continue
                x = vec[sel, c]
                hit = (x != 0) if code == _THREE_SLOTS else (x > 0)
                bad[sel] |= hit & (c < count[sel])
    first = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    b = np.flatnonzero(bad)
    _, first_bad = np.unique(rows[b], return_index=True)
    chosen = first.copy()
    group = np.searchsorted(rows[first], rows[b[first_bad]])
    chosen[group] = b[first_bad]
    return chosen

