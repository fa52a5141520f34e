"""The execution index of one file set (eager ops and function calls).

Executions are far fewer than graph traces, so each record is parsed with
protobuf once; what the digests need is kept in numpy columns (strings
interned, output tensor ids in one flat array) and the record itself is
re-read by offset when its full data is asked for.
"""

import math
import struct

import numpy as np

from tb_numerics_plugin.reader import health as health_lib
from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.reader import tensors
from tb_numerics_plugin.reader.columns import Columns, Interner
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


class ExecutionTable:
    """Digest columns of the executions of one file set.

    Columns: ``offset``, ``wall_time``, ``op_type`` and ``graph_id`` (interned
    ids; graph -1 = eager), ``mode``, ``values``/``nvals`` (see
    :func:`representative`), ``out_begin``/``out_end`` into ``outputs["id"]`` and
    ``in_begin``/``in_end`` into ``inputs["id"]`` (the tensor ids, see
    :meth:`output_ids` and :meth:`input_ids`), ``step`` (the training step,
    :data:`~tb_numerics_plugin.reader.steps.NO_STEP` if unmarked).
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
                "values": (np.float64, 1),
                "nvals": (np.int16, 0),
                "out_begin": (np.int64, 0),
                "out_end": (np.int64, 0),
                "in_begin": (np.int64, 0),
                "in_end": (np.int64, 0),
                "step": (np.int64, 0),
            }
        )
        self.outputs = Columns({"id": (np.int64, 0)})
        self.inputs = Columns({"id": (np.int64, 0)})
        self.warnings = []

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

    def add_records(self, records, path):
        """Indexes ``[(offset, payload)]`` of the execution file.

        Records that do not parse are skipped; unknown modes, non-finite wall
        times and debug tensors that do not fit their mode are neutralised;
        each with a warning naming file and offset.
        """
        batch = {k: [] for k in ("offset", "wall_time", "op_type", "graph_id", "mode", "nvals",
                                 "out_begin", "out_end", "in_begin", "in_end", "step")}
        vectors, outputs, inputs = [], [], []
        problems = []  # (offset, what)
        next_out, next_in = len(self.outputs), len(self.inputs)
        last_wall = float(self.cols["wall_time"][-1]) if len(self.cols) else 0.0
        for offset, payload in records:
            try:
                event = debug_event_pb2.DebugEvent.FromString(payload)
            except Exception:  # protobuf's DecodeError type differs by backend
                event = None
            if event is None or event.WhichOneof("what") != "execution":
                problems.append((offset, "is not an execution; skipped"))
                continue
            ex = event.execution
            mode = int(ex.tensor_debug_mode)
            if not health_lib.known_mode(mode):
                problems.append((offset, "has unknown tensor_debug_mode %d; read as "
                                         "UNSPECIFIED (no health)" % mode))
                mode = 0
            try:
                vec = representative(mode, output_values(ex, strict=True)) if mode else None
            except ValueError as e:
                problems.append((offset, "holds a debug tensor that does not decode (%s); its "
                                         "health is dropped" % e))
                vec = None
            if vec is not None and len(vec) > health_lib.MAX_VALUES:
                vec = vec[:1]  # not a health vector: the layout check below drops it
            wall = event.wall_time
            if not math.isfinite(wall):
                problems.append((offset, "has a non-finite wall_time; the previous record's "
                                         "is used"))
                wall = last_wall
            last_wall = wall
            batch["offset"].append(offset)
            batch["wall_time"].append(wall)
            batch["op_type"].append(self.strings.id(ex.op_type))
            batch["graph_id"].append(self.strings.id(ex.graph_id) if ex.graph_id else -1)
            batch["mode"].append(mode)
            batch["step"].append(ex.step if ex.HasField("step") else NO_STEP)
            batch["nvals"].append(0 if vec is None else len(vec))
            batch["out_begin"].append(next_out)
            next_out += len(ex.output_tensor_ids)
            batch["out_end"].append(next_out)
            outputs.extend(ex.output_tensor_ids)
            batch["in_begin"].append(next_in)
            next_in += len(ex.input_tensor_ids)
            batch["in_end"].append(next_in)
            inputs.extend(ex.input_tensor_ids)
            vectors.append(vec)
        width = max([len(v) for v in vectors if v is not None] + [1])
        values = np.full((len(vectors), width), np.nan)
        for i, vec in enumerate(vectors):
            if vec is not None:
                values[i, : len(vec)] = vec
        nvals = np.asarray(batch["nvals"], np.int64)
        invalid = health_lib.invalid_rows(np.asarray(batch["mode"], np.int64), values, nvals)
        for i in np.flatnonzero(invalid).tolist():
            problems.append((batch["offset"][i], health_lib.INVALID_VECTOR))
            values[i] = np.nan
            batch["nvals"][i] = 0
        self._warn(path, sorted(problems))
        self.cols.extend(values=values, **batch)
        self.outputs.extend(id=outputs)
        self.inputs.extend(id=inputs)

    def _warn(self, path, problems, shown=5):
        """One warning per problem record (the first ``shown``), then one with the count."""
        for offset, what in problems[:shown]:
            self.warnings.append("%s: record at offset %d %s" % (path, offset, what))
        if len(problems) > shown:
            self.warnings.append("%s: %d more damaged or hostile records (first at offset %d) "
                                 "skipped or neutralised" % (path, len(problems) - shown,
                                                             problems[shown][0]))
