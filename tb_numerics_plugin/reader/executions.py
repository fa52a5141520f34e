"""The execution index of one file set (eager ops and function calls).

A TF program writes about one execution per two graph traces, so chunks of
execution records are decoded in bulk like traces (:mod:`exec_layout`);
records the bulk decoder does not read exactly are parsed with protobuf one
by one (:func:`_parse`, the same code :meth:`ExecutionTable.add_records`
runs). What the digests need is kept in numpy columns (strings interned,
tensor ids in flat arrays) and the record itself is re-read by offset when
its full data is asked for.
"""

import struct

import numpy as np

from tb_numerics_plugin import records
from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.reader import exec_layout, tensors
from tb_numerics_plugin.reader import health as health_lib
from tb_numerics_plugin.reader.columns import FLOAT32_IF_EXACT, INT32_IF_FITS, Columns, Interner
from tb_numerics_plugin.reader.steps import NO_STEP

_FULL_TENSOR = health_lib.MODE_CODES["FULL_TENSOR"]
# TF DataType -> (struct code, item size) for debug values decoded without numpy.
_STRUCT_CODE = {1: ("f", 4), 2: ("d", 8)}


def _vector(proto, full_tensor, strict=False):
    """One output's debug values as a tuple of floats, or None.

    Raises:
      ValueError: with ``strict``, a numeric debug tensor that does not decode
        (its values do not fit its shape, a refused shape).
    """
    content = proto.tensor_content
    if not full_tensor and content and proto.dtype in _STRUCT_CODE:
        code, size = _STRUCT_CODE[proto.dtype]
        if len(content) % size == 0:  # the common case, without numpy per record
            return struct.unpack("<%d%s" % (len(content) // size, code), content)
    try:
        arr = tensors.to_array(proto)
    except tensors.UnsupportedTensor:
        return None  # strings, resources: no numeric health
    except ValueError:
        if strict:
            raise
        return None
    if full_tensor:
        return tuple(health_lib.counts_of_array(arr, proto.dtype).tolist())
    return tuple(arr.astype(np.float64).ravel().tolist()) if arr.size else None


def output_values(execution, strict=False):
    """Debug values of each output of an Execution message.

    Returns:
      list (one per tensor_proto) of float tuples: the health vector, or for
      FULL_TENSOR the derived FULL_HEALTH-layout vector; None where nothing
      numeric was recorded.

    Raises:
      ValueError: with ``strict``, a debug tensor that does not decode.
    """
    full_tensor = execution.tensor_debug_mode == _FULL_TENSOR
    return [_vector(p, full_tensor, strict) for p in execution.tensor_protos]


def representative(mode, vectors):
    """The vector an execution digest shows: the first output holding inf/nan, else the first."""
    present = [v for v in vectors if v is not None]
    if not present:
        return None
    for v in present:
        if health_lib.is_bad(mode, v):
            return v
    return present[0]


def _parse(payload):
    """One execution record parsed with protobuf: the per-record path.

    Returns:
      ``(fields, problems)``: fields ``(wall_time, op_type, graph_id, mode,
      step, representative vector or None, output ids, input ids)``, None for
      a record that is not an execution (skipped); problems: what the record's
      warnings say (the wall time is checked later, against the previous record).
    """
    try:
        event = debug_event_pb2.DebugEvent.FromString(payload)
    except Exception:  # protobuf's DecodeError type differs by backend
        event = None
    if event is None or event.WhichOneof("what") != "execution":
        return None, ["is not an execution; skipped"]
    problems = []
    ex = event.execution
    mode = int(ex.tensor_debug_mode)
    if not health_lib.known_mode(mode):
        problems.append("has unknown tensor_debug_mode %d; read as UNSPECIFIED (no health)"
                        % mode)
        mode = 0
    try:
        vec = representative(mode, output_values(ex, strict=True)) if mode else None
    except ValueError as e:
        problems.append("holds a debug tensor that does not decode (%s); its health is "
                        "dropped" % e)
        vec = None
    if vec is not None and len(vec) > health_lib.MAX_VALUES:
        vec = vec[:1]  # not a health vector: the layout check drops it
    step = ex.step if ex.HasField("step") else NO_STEP
    return (event.wall_time, ex.op_type, ex.graph_id, mode, step, vec,
            list(ex.output_tensor_ids), list(ex.input_tensor_ids)), problems


def _name_index(name, names, index):
    """Index of ``name`` in the chunk's list of distinct strings, appending it if new."""
    got = index.get(name)
    if got is None:
        got = index[name] = len(names)
        names.append(name)
    return got


def _merge_per_record(frames, offsets, dec):
    """Parses the records the bulk decoder left (``dec.slow``) with :func:`_parse`,
    writing their fields into ``dec``'s arrays (and names).

    Returns:
      (kept: bool mask of records indexed, values: ``dec.values``, widened if
      needed, ``{"out"|"in": (ids, record of each)}`` of those records,
      problems ``[(offset, what)]``).
    """
    kept = ~dec.slow
    names, values, n = dec.names, dec.values, len(dec.slow)
    index = {name: i for i, name in enumerate(names)}
    extra_ids = {"out": ([], []), "in": ([], [])}
    problems = []
    for row in np.flatnonzero(dec.slow).tolist():
        start = int(frames.starts[row])
        parsed, said = _parse(frames.buf[start : start + int(frames.lengths[row])])
        problems.extend((int(offsets[row]), what) for what in said)
        if parsed is None:
            continue
        wall, op_type, graph_id, mode, step, vec, outs, ins = parsed
        kept[row] = True
        dec.wall[row], dec.mode[row], dec.step[row] = wall, mode, step
        dec.op[row] = _name_index(op_type, names, index)
        dec.graph[row] = _name_index(graph_id, names, index) if graph_id else -1
        values[row] = np.nan
        if vec is not None and len(vec) > values.shape[1]:
            values = np.hstack([values, np.full((n, len(vec) - values.shape[1]), np.nan)])
        if vec is not None:
            values[row, : len(vec)] = vec
        dec.nvals[row] = 0 if vec is None else len(vec)
        for key, ids in (("out", outs), ("in", ins)):
            extra_ids[key][0].extend(ids)
            extra_ids[key][1].extend([row] * len(ids))
    return kept, values, extra_ids, problems


class ExecutionTable:
    """Digest columns of the executions of one file set.

    Columns: ``offset``, ``wall_time``, ``op_type`` and ``graph_id`` (interned
    ids; graph -1 = eager), ``mode``, ``values``/``nvals`` (see
    :func:`representative`), ``out_begin``/``out_end`` into ``outputs["id"]`` and
    ``in_begin``/``in_end`` into ``inputs["id"]`` (the tensor ids, see
    :meth:`output_ids` and :meth:`input_ids`; these and ``values`` stay
    int32/float32 while every value fits exactly, see ``columns.Narrow``), ``step``
    (the training step, :data:`~tb_numerics_plugin.reader.steps.NO_STEP` if unmarked).
    """

    def __init__(self):
        self.strings = Interner()
        self.cols = Columns(
            {
                "offset": (np.int64, 0),
                "wall_time": (np.float64, 0),
                "op_type": (np.int32, 0),
                "graph_id": (np.int32, 0),
                "mode": (np.int16, 0),
                "values": (FLOAT32_IF_EXACT, 1),
                "nvals": (np.int16, 0),
                "out_begin": (INT32_IF_FITS, 0),
                "out_end": (INT32_IF_FITS, 0),
                "in_begin": (INT32_IF_FITS, 0),
                "in_end": (INT32_IF_FITS, 0),
                "step": (np.int64, 0),
            }
        )
        self.outputs = Columns({"id": (INT32_IF_FITS, 0)})
        self.inputs = Columns({"id": (INT32_IF_FITS, 0)})
        self.warnings = []
        self._decoder = exec_layout.Decoder()

    def __len__(self):
        return len(self.cols)

    def wall_times(self):
        """Wall time of each execution, in index order (the column itself: read only)."""
        return self.cols["wall_time"]

    def steps(self):
        """Step of each execution (NO_STEP where unmarked; the column itself: read only)."""
        return self.cols["step"]

    def health_rows(self):
        """``(modes, values)``: each execution's mode code and representative health vector."""
        return self.cols["mode"], self.cols["values"]

    def output_ids(self, index):
        """Output tensor ids of execution ``index``."""
        b, e = self.cols["out_begin"][index], self.cols["out_end"][index]
        return self.outputs["id"][b:e].tolist()

    def input_ids(self, index):
        """Input tensor ids of execution ``index``."""
        b, e = self.cols["in_begin"][index], self.cols["in_end"][index]
        return self.inputs["id"][b:e].tolist()

    def add_frames(self, frames, base_offset, path):
        """Indexes every record of one framed chunk of the execution file (bulk path).

        Records the vectorized decoder reads exactly (:mod:`exec_layout`) are
        taken from it; the others are parsed one by one with protobuf, as
        :meth:`add_records` does, so results and warnings are the same.
        """
        if not len(frames.starts):
            return
        dec = self._decoder.decode(frames.buf, frames.starts, frames.starts + frames.lengths)
        offsets = base_offset + frames.starts - records.HEADER_SIZE
        kept, values, extra_ids, problems = _merge_per_record(frames, offsets, dec)
        rows = np.flatnonzero(kept)
        rank = np.cumsum(kept) - 1
        flat = {}
        for key, ids, owners in (("out", dec.out_ids, dec.out_rows),
                                 ("in", dec.in_ids, dec.in_rows)):
            fast = ~dec.slow[owners]
            ids = np.concatenate([ids[fast], np.asarray(extra_ids[key][0], np.int64)])
            owners = np.concatenate([owners[fast], np.asarray(extra_ids[key][1], np.int64)])
            if len(extra_ids[key][0]):  # per-record ids go among the bulk ones, by record
                order = np.argsort(owners, kind="stable")
                ids, owners = ids[order], owners[order]
            flat[key] = (ids, rank[owners])
        self._append(path, problems, dec.names, offset=offsets[rows], wall=dec.wall[rows],
                     op=dec.op[rows], graph=dec.graph[rows], mode=dec.mode[rows],
                     step=dec.step[rows], values=values[rows], nvals=dec.nvals[rows],
                     outputs=flat["out"], inputs=flat["in"])

    def add_records(self, records, path):
        """Indexes ``[(offset, payload)]`` of the execution file, parsing each with protobuf.

        Records that do not parse are skipped; unknown modes, non-finite wall
        times and debug tensors that do not fit their mode are neutralised;
        each with a warning naming file and offset. (The per-record path:
        :meth:`add_frames` gives the same results faster.)
        """
        problems, names, index = [], [], {}
        cols = {k: [] for k in ("offset", "wall", "op", "graph", "mode", "step", "nvals")}
        vectors, ids = [], {"out": ([], []), "in": ([], [])}
        for offset, payload in records:
            parsed, said = _parse(payload)
            problems.extend((offset, what) for what in said)
            if parsed is None:
                continue
            wall, op_type, graph_id, mode, step, vec, outs, ins = parsed
            row = len(vectors)
            for key, value in (("offset", offset), ("wall", wall), ("mode", mode),
                               ("step", step), ("nvals", 0 if vec is None else len(vec)),
                               ("op", _name_index(op_type, names, index)),
                               ("graph", _name_index(graph_id, names, index) if graph_id
                                else -1)):
                cols[key].append(value)
            vectors.append(vec)
            for key, got in (("out", outs), ("in", ins)):
                ids[key][0].extend(got)
                ids[key][1].extend([row] * len(got))
        width = max([len(v) for v in vectors if v is not None] + [1])
        values = np.full((len(vectors), width), np.nan)
        for i, vec in enumerate(vectors):
            if vec is not None:
                values[i, : len(vec)] = vec
        cols = {k: np.asarray(v, np.float64 if k == "wall" else np.int64)
                for k, v in cols.items()}
        self._append(path, problems, names, values=values,
                     outputs=tuple(np.asarray(x, np.int64) for x in ids["out"]),
                     inputs=tuple(np.asarray(x, np.int64) for x in ids["in"]), **cols)

    def _append(self, path, problems, names, offset, wall, op, graph, mode, step, values,
                nvals, outputs, inputs):
        """Appends one batch of parsed records (both paths end here).

        ``op``/``graph`` index ``names`` (graph -1: none); ``outputs`` and
        ``inputs`` are ``(ids, batch row of each id)`` in order.
        """
        problems = list(problems)
        k = len(offset)
        wall = self._fix_wall_times(offset, wall, problems)
        # Intern in order of first use (op type, then graph id, record by record),
        # so ids do not depend on which path read a record.
        first = np.full(len(names), np.iinfo(np.int64).max, np.int64)
        used, at = np.unique(op, return_index=True)
        first[used] = 2 * at
        has_graph = np.flatnonzero(graph >= 0)
        used, at = np.unique(graph[has_graph], return_index=True)
        first[used] = np.minimum(first[used], 2 * has_graph[at] + 1)
        ids = np.full(len(names) + 1, -1, np.int32)
        for i in np.argsort(first, kind="stable").tolist():
            if first[i] < np.iinfo(np.int64).max:
                ids[i] = self.strings.id(names[i])
        nvals = np.asarray(nvals, np.int64).copy()
        width = max(int(nvals.max(initial=0)), 1)
        values = np.array(values[:, :width], np.float64)
        if values.shape[1] < width:
            values = np.hstack([values, np.full((k, width - values.shape[1]), np.nan)])
        invalid = health_lib.invalid_rows(mode, values, nvals)
        for i in np.flatnonzero(invalid).tolist():
            problems.append((int(offset[i]), health_lib.INVALID_VECTOR))
        values[invalid] = np.nan
        nvals[invalid] = 0
        self._warn(path, sorted(problems))
        counts = {}
        for key, (_, owners) in (("out", outputs), ("in", inputs)):
            counts[key] = np.cumsum(np.bincount(owners, minlength=k)[:k])
        out_end = len(self.outputs) + counts["out"]
        in_end = len(self.inputs) + counts["in"]
        self.cols.extend(
            offset=offset, wall_time=wall, op_type=ids[op], graph_id=ids[graph],
            mode=mode, values=values, nvals=nvals, step=step,
            out_begin=out_end - np.diff(np.r_[0, counts["out"]]), out_end=out_end,
            in_begin=in_end - np.diff(np.r_[0, counts["in"]]), in_end=in_end)
        self.outputs.extend(id=outputs[0])
        self.inputs.extend(id=inputs[0])

    def _fix_wall_times(self, offset, wall, problems):
        """Non-finite wall times take the previous record's (ordering stays sane, JSON valid)."""
        wall = np.asarray(wall, np.float64)
        bad = ~np.isfinite(wall)
        if not bad.any():
            return wall
        for i in np.flatnonzero(bad).tolist():
            problems.append((int(offset[i]), "has a non-finite wall_time; the previous "
                                             "record's is used"))
        last = float(self.cols["wall_time"][-1]) if len(self.cols) else 0.0
        good = np.where(bad, -1, np.arange(len(wall)))
        idx = np.maximum.accumulate(good)
        return np.where(idx >= 0, wall[np.maximum(idx, 0)], last)

    def _warn(self, path, problems, shown=5):
        """One warning per problem record (the first ``shown``), then one with the count."""
        for offset, what in problems[:shown]:
            self.warnings.append("%s: record at offset %d %s" % (path, offset, what))
        if len(problems) > shown:
            self.warnings.append("%s: %d more damaged or hostile records (first at offset %d) "
                                 "skipped or neutralised" % (path, len(problems) - shown,
                                                             problems[shown][0]))
