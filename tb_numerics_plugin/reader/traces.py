"""The graph-execution-trace index of one file set: numpy columns, no per-trace objects.

A trace record differs from the previous trace of the same op only in its
wall time and its debug tensor. So each record is split, with a vectorized
wire walk, into

- the wall time (8 bytes at a known place),
- the tensor_proto field (decoded in bulk: health vectors are a few
  little-endian doubles),
- everything else (context id, op name, slot, mode, device): the *key*,
  whose bytes are interned; a new key is parsed once with protobuf.

Per record that leaves one bytes concatenation and one dict lookup in Python.
"""

import numpy as np

from tb_numerics_plugin.reader import health as health_lib
from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.reader import tensors, wire
from tb_numerics_plugin.reader.columns import Columns, Interner

_WALL_TIME = 1
_TRACE = 10
_TENSOR_PROTO = 5
_T_DTYPE, _T_CONTENT, _T_FLOAT, _T_DOUBLE = 1, 4, 5, 6
_FULL_TENSOR = health_lib.MODE_CODES["FULL_TENSOR"]


class TraceKeys:
    """Distinct (context, op name, slot, mode, device) combinations of traces."""

    def __init__(self):
        self._bytes = Interner()
        self.context = []  # interned graph id per key
        self.op_name = []
        self.output_slot = []
        self.mode = []
        self.device_name = []
        self._arrays = None

    def __len__(self):
        return len(self.context)

    def add(self, key):
        """Returns the id of serialized key bytes, parsing them if new."""
        kid = self._bytes.find(key)
        if kid >= 0:
            return kid
        trace = debug_event_pb2.GraphExecutionTrace.FromString(key)
        kid = self._bytes.id(key)
        self.context.append(trace.tfdbg_context_id)
        self.op_name.append(trace.op_name)
        self.output_slot.append(int(trace.output_slot))
        self.mode.append(int(trace.tensor_debug_mode))
        self.device_name.append(trace.device_name)
        self._arrays = None
        return kid

    def mode_array(self):
        """Per-key mode codes as an int array (cached until a key is added)."""
        if self._arrays is None or len(self._arrays) != len(self.mode):
            self._arrays = np.asarray(self.mode, np.int64)
        return self._arrays


class TraceTable:
    """Digest columns of the graph execution traces of one file set.

    Columns: ``offset`` (of the record in the trace file), ``wall_time``,
    ``key`` (into :attr:`keys`), ``values`` (health vectors, NaN-padded),
    ``nvals`` (how many values the record carried; 0 = none).
    """

    def __init__(self):
        self.keys = TraceKeys()
        self.cols = Columns(
            {
                "offset": (np.int64, 0),
                "wall_time": (np.float64, 0),
                "key": (np.int32, 0),
                "values": (np.float64, 1),
                "nvals": (np.int16, 0),
            }
        )
        self.warnings = []

    def __len__(self):
        return len(self.cols)

    def modes(self):
        """Mode code of each trace."""
        return self.keys.mode_array()[self.cols["key"]]

    def add_frames(self, frames, base_offset, path):
        """Indexes every record of one framed chunk of the trace file."""
        if not len(frames.starts):
            return
        arr = wire.padded(frames.buf)
        starts, ends = frames.starts, frames.starts + frames.lengths
        top, malformed = wire.walk(arr, starts, ends, (_WALL_TIME, _TRACE))
        usable = ~malformed & (top[_TRACE].tag >= 0)
        for i in np.flatnonzero(~usable)[:5]:
            self.warnings.append(
                "%s: record at offset %d is not a graph execution trace; skipped"
                % (path, base_offset + int(starts[i]) - 12)
            )
        rows = np.flatnonzero(usable)
        if not len(rows):
            return
        wall = np.zeros(len(rows))
        has_wall = top[_WALL_TIME].start[rows] >= 0
        if has_wall.any():
            raw = wire.gather(arr, top[_WALL_TIME].start[rows][has_wall], 8)
            wall[has_wall] = raw.view("<f8").ravel()
        t_start = top[_TRACE].start[rows]
        t_end = t_start + top[_TRACE].length[rows]
        inner, bad = wire.walk(arr, t_start, t_end, (_TENSOR_PROTO,))
        tp = inner[_TENSOR_PROTO]
        key_ids = self._key_ids(frames.buf, t_start, t_end, tp)
        values, nvals = self._values(frames.buf, arr, tp, key_ids)
        self.cols.extend(
            offset=base_offset + starts[rows] - 12,
            wall_time=wall,
            key=key_ids,
            values=values,
            nvals=nvals,
        )

    def _key_ids(self, buf, t_start, t_end, tp):
        """Interns each trace's bytes minus its tensor_proto field."""
        has_tp = tp.tag >= 0
        cut = np.where(has_tp, tp.tag, t_end).tolist()
        resume = np.where(has_tp, tp.start + tp.length, t_end).tolist()
        add = self.keys.add
        return np.fromiter(
            (
                add(buf[a:b] + buf[c:d])
                for a, b, c, d in zip(t_start.tolist(), cut, resume, t_end.tolist())
            ),
            np.int32,
            len(cut),
        )

    def _values(self, buf, arr, tp, key_ids):
        """Decodes the debug tensors: bulk for health vectors, one by one for FULL_TENSOR."""
        n = len(key_ids)
        has_tp = np.flatnonzero(tp.tag >= 0)
        fields, _ = wire.walk(arr, tp.start[has_tp], tp.start[has_tp] + tp.length[has_tp],
                              (_T_DTYPE, _T_CONTENT, _T_FLOAT, _T_DOUBLE))
        dtype = fields[_T_DTYPE].value.astype(np.int64)
        src_start = fields[_T_CONTENT].start.copy()
        src_len = fields[_T_CONTENT].length.copy()
        for num in (_T_DOUBLE, _T_FLOAT):
            empty = src_len == 0
            src_start[empty] = fields[num].start[empty]
            src_len[empty] = fields[num].length[empty]
        itemsize = np.where(dtype == 2, 8, np.where(dtype == 1, 4, 0))
        full_tensor = self.keys.mode_array()[key_ids[has_tp]] == _FULL_TENSOR
        count = np.where(itemsize > 0, src_len // np.maximum(itemsize, 1), 0)
        fast = ~full_tensor & (itemsize > 0) & (src_len > 0)
        width = max(int(count[fast].max()) if fast.any() else 0,
                    health_lib.FULL_HEALTH_WIDTH if full_tensor.any() else 0, 1)
        values = np.full((n, width), np.nan)
        nvals = np.zeros(n, np.int16)
        for size in (8, 4):
            for w in np.unique(count[fast & (itemsize == size)]):
                sel = np.flatnonzero(fast & (itemsize == size) & (count == w))
                raw = wire.gather(arr, src_start[sel], int(w) * size)
                vals = raw.view("<f8" if size == 8 else "<f4").astype(np.float64)
                values[has_tp[sel], : int(w)] = vals
                nvals[has_tp[sel]] = int(w)
        for j in np.flatnonzero(full_tensor):
            row = has_tp[j]
            counts = self._derive(buf, int(tp.start[row]), int(tp.length[row]))
            if counts is not None:
                values[row, : len(counts)] = counts
                nvals[row] = len(counts)
        return values, nvals

    @staticmethod
    def _derive(buf, start, length):
        """FULL_TENSOR: a FULL_HEALTH-layout vector derived from the whole tensor, or None."""
        proto = tensors.tensor_pb2.TensorProto.FromString(buf[start : start + length])
        try:
            arr = tensors.to_array(proto)
        except ValueError:
            return None  # strings, resources: no numeric health
        return health_lib.counts_of_array(arr, proto.dtype)
