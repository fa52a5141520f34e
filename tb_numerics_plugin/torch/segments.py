"""One captured execution: the ops recorded between two boundaries, and their encoding.

A :class:`Segment` is what the capture records between two execution
boundaries: either one graph execution (a root module's forward, an autograd
backward, an optimizer step) or a run of eager ops. During the segment only
plain tuples are appended (the hot path); :meth:`Segment.finish` takes the
health rows fetched once, finds or writes the ``DebuggedGraph`` for the op
sequence (``registry.py``) and encodes the ``Execution`` and
``GraphExecutionTrace`` records (``encoder.py``). Inputs are named after
their producers by the tensors' data-flow tags (``tags.py``).

A segment's fields, its ``finish`` and the session's ``switch`` (finish the
open segment, open the next) are C (``_record_segment.c``, the bases
``_record.SegmentState`` and ``_record.SessionState``); :class:`SessionSwitch`
and ``_SegmentFields`` are their stand-ins where the extension is missing.
"""

import time

from tb_numerics_plugin.torch import wire
from tb_numerics_plugin.torch.health import DTYPE_ENUM
from tb_numerics_plugin.torch.ops import nested_tensors
from tb_numerics_plugin.torch.state import c_base
from tb_numerics_plugin.torch.tags import OP_NAME, SERIAL, SLOT, TENSOR_ID, producer_tag

BACKWARD = "autograd.backward"  # the name of a backward pass's execution


def producer_ids(value, serial=None):
    """The tensor ids in the producer tags of the tensors nested in ``value``
    (``ops.nested_tensors``), of those made in segment ``serial`` only when given;
    tensors from outside any capture are left out. ``_record.producer_ids`` is its
    twin in C (``Session.producer_ids``)."""
    found = []
    nested_tensors(value, found)
    ids = []
    for t in found:
        tag = producer_tag(t)
        if tag is not None and (serial is None or tag[SERIAL] == serial):
            ids.append(tag[TENSOR_ID])
    return ids


class SessionSwitch:
    """``_record.SessionState``'s stand-in where the extension is missing, a base of
    ``capture.Session``: ``switch`` in Python (its ``_segment``, ``_serial``, ``encoder``
    and ``segment_class``)."""

    def switch(self, name, stack_ids=(), open_new=True):
        segment = self._segment
        self._segment = None
        if segment is not None:
            segment.finish(self.encoder.fetch_rows())
        if open_new:
            self._serial += 1
            self._segment = self.segment_class(self, self._serial, name, stack_ids)
        return self._segment


class _SegmentFields:
    """``_record.SegmentState``'s stand-in where the extension is missing: the same fields,
    made in Python, and :meth:`Segment.finish_in_python` as the finish."""

    def __init__(self, session, serial, name, stack_ids=()):
        self.session = session
        self.serial = serial
        self.name = name
        self.is_graph = name is not None
        self.stack_ids = stack_ids
        self.step = session.step  # the training step marked when the segment opened
        self.wall_time = time.time()
        self.ops = []
        self.prior_ops = session.registry.last_ops(name) if name is not None else ()
        self.traces = []
        self.eager = []
        self.input_ids = []
        self.output_ids = []
        self.arg_ids = []
        self._counters = {}
        self._placeholders = {}
        self._placeholder_names = set()

    def finish(self, rows):
        self.finish_in_python(rows)


class Segment(c_base("SegmentState", _SegmentFields)):
    """The ops of one execution (graph segment) or of a run of eager ops.

    Made as ``Segment(session, serial, name, stack_ids=())``, its fields those of its C
    base (``_record_segment.c``), or of the stand-in where the extension is missing.

    Args:
      session: the capture session: its ``step``, ``host_name``, ``writer``, ``producer_ids``,
        ``registry`` (``last_ops``, ``graph_id``), ``encoder``, ``scopes.param_name`` and the
        ``stop_on_nonfinite`` watch (``watch_nonfinite``, ``note_nonfinite``).
      serial: a number unique per segment of the session (the ``SERIAL`` of its tags).
      name: the execution's op_type (e.g. ``"MLP.forward"``); None for eager runs.
      stack_ids: frame ids of the call that started the execution.

    Attributes:
      is_graph: ``name`` is not None.
      step: the training step marked when the segment opened; wall_time: when it opened.
      ops: (op_type, op_name, input_names, num_outputs, stack_ids, device_name, output
        dtypes) per op of the graph.
      prior_ops: the last execution of this name's ops, whose records the C recorder hands
        out again where an op's are the same objects (``_record_op.c``, ``op_item``).
      traces: (op_name, slot, tensor_id, payload, meta, device_name, wall_time).
      eager: (op_type, input ids, output ids, [(payload, meta, device id, tensor id)],
        stack ids, wall time, output dtypes).
      input_ids: tensor ids of the values that entered from outside (one per Placeholder,
        in order; -1 when the producer is unknown); output_ids: of the values the call
        returned; arg_ids: of the call's positional arguments (root forward).
      _counters, _placeholders, _placeholder_names: the names handed out (op names by
        prefix, outside values' keys -> names, and those names).

    :meth:`finish` encodes and writes the records: in C (the base's), or
    :meth:`finish_in_python` where the encoding is Python's.
    """

    def op_name(self, scope, short):
        """Returns a name unique in this segment: ``scope/short_k``."""
        prefix = f"{scope}/{short}_"  # counted by prefix: unique even if a short has a "/"
        k = self._counters.get(prefix, 0)
        self._counters[prefix] = k + 1
        return f"{prefix}{k}"  # f-strings format ints faster than %

    def input_name(self, t):
        """Returns ``producer:slot`` for a tensor, adding a Placeholder op for outside values."""
        tag = producer_tag(t)
        if tag is not None and tag[SERIAL] == self.serial:
            return "%s:%d" % (tag[OP_NAME], tag[SLOT])
        key = (tag[SERIAL], tag[TENSOR_ID]) if tag is not None else None
        name = self._placeholders.get(key) if key is not None else None
        if name is None:
            param_name = self.session.scopes.param_name
            name = param_name(t)
            if name is None and t._is_view():  # e.g. a Linear's transposed weight
                name = param_name(t._base)
            name = self._add_placeholder(
                key or ("untagged", len(self._placeholders)),
                name or "input_%d" % len(self._placeholders),
                tag[TENSOR_ID] if tag is not None else -1, DTYPE_ENUM.get(t.dtype, 0))
        return name + ":0"

    def named_input(self, name, dtype_enum, tensor_id=-1):
        """Returns ``name:0`` for an input a compiled graph names (``compiled/``),
        adding its Placeholder op once (``tensor_id``: its producer's, or -1)."""
        key = ("compiled", name)
        known = self._placeholders.get(key)
        if known is None:
            known = self._add_placeholder(key, name, tensor_id, dtype_enum)
        return known + ":0"

    def _add_placeholder(self, key, name, tensor_id, dtype_enum):
        if name in self._placeholder_names:
            name = "%s_%d" % (name, len(self._placeholders))
        self._placeholders[key] = name
        self._placeholder_names.add(name)
        self.input_ids.append(tensor_id)
        self.ops.append(("Placeholder", name, (), 1, (), "", (dtype_enum,)))
        return name

    def set_arguments(self, args):
        """Records the tensor ids of a call's arguments (read or not by the call)."""
        self.arg_ids.extend(self.session.producer_ids(args))

    def set_outputs(self, value):
        """Records the tensors of a call's return value (nested in tuples, lists, dicts
        and ``ModelOutput``-like mappings) that this segment produced."""
        self.output_ids.extend(self.session.producer_ids(value, self.serial))

    def finish_in_python(self, rows):
        """Encodes and writes everything recorded, given the fetched health rows: the
        Python of ``finish``, which the C base's calls where a ``stop_on_nonfinite`` watch,
        FULL_TENSOR or the Python recorder makes it Python's.

        Args:
          rows: ``Encoder.fetch_rows()``: the health rows covering this segment's
            batch tokens.
        """
        s = self.session
        enc = s.encoder
        step = self.step
        if s.watch_nonfinite:
            s.note_nonfinite(self, rows)
        groups = []  # written under one lock of the writer
        if self.is_graph:
            graph_id = s.registry.graph_id(self.name, self.ops)
            groups.append(("graph_execution_traces", enc.trace_events(
                self.traces, graph_id, rows, wire.step_field(step))))
            groups.append(("execution", (enc.graph_execution_event(
                self.name, graph_id, self._call_input_ids(), self.output_ids, s.host_name,
                self.stack_ids, self.wall_time, step),)))
        if self.eager:
            groups.append(("execution", enc.execution_events(self.eager, rows, s.host_name, step)))
        if groups:
            s.writer.write_serialized_groups(groups)

    def _call_input_ids(self):
        """The ids the call read, then its arguments it never read (a mask it ignored)."""
        if not self.arg_ids:
            return self.input_ids
        read = set(self.input_ids)
        return self.input_ids + [i for i in dict.fromkeys(self.arg_ids) if i not in read]
