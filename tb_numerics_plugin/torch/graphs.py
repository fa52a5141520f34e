"""Op naming, data flow and the encoding of one captured execution.

A :class:`Segment` is what the capture records between two execution
boundaries: either one graph execution (a root module's forward, an autograd
backward, an optimizer step) or a run of eager ops. During the segment only
plain tuples are appended (the hot path); :meth:`Segment.finish` fetches the
health rows once, finds or writes the ``DebuggedGraph`` for the op sequence
and encodes the ``Execution`` and ``GraphExecutionTrace`` records.

Data flow: every output tensor gets an attribute tag ``(segment serial,
op_name, slot, version, tensor_id, "op_name:slot")`` stored on the tensor itself, never in an
``id()``-keyed map (ids are reused as soon as tensors die). In-place ops
re-tag the tensor (and the base of a view), and a view is resolved through
its base with the shared version counter, so the producer named in
``input_names`` is the op that last wrote the values.
"""

import collections
import time
import weakref

import torch

from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.torch import wire
from tb_numerics_plugin.torch.health import DTYPE_ENUM

TAG = "_tbn_tag"
# Ops whose outputs carry no values of their own: uninitialized memory (which
# can hold NaN bit patterns), storage plumbing, or scalars read back.
_NO_VALUE_OPS = frozenset((
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
    "resize_", "set_", "_local_scalar_dense", "lift_fresh", "_to_copy_meta",
))

# Ops whose output shares its input's storage without being a view to
# autograd (no ``_base``): skipped like views, their output inherits the
# input's tag so data flow still reaches the real producer (``detach`` is how
# autograd stores a gradient into ``.grad``).
_ALIAS_OPS = frozenset(("_unsafe_view", "_reshape_alias", "alias", "detach"))

OpInfo = collections.namedtuple("OpInfo", "op_type short skip writes alias")


def analyze_op(func):
    """Classifies an ``OpOverload`` once: name, skipped (view/metadata) or not, written args.

    Returns:
      OpInfo(op_type, short, skip, writes, alias) where ``writes`` are the
      indexes of arguments the op mutates (in-place and ``out=`` ops) and
      ``alias`` marks ops in ``_ALIAS_OPS``.
    """
    schema = func._schema
    short = func.overloadpacket.__name__
    writes = tuple(i for i, a in enumerate(schema.arguments)
                   if a.alias_info is not None and a.alias_info.is_write)
    is_view = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    # Ops returning no tensor (profiler records, scalars) and writing none carry no values.
    no_tensor_out = not writes and not any("Tensor" in str(r.type) for r in schema.returns)
    alias = short in _ALIAS_OPS
    skip = is_view or alias or no_tensor_out or short in _NO_VALUE_OPS
    return OpInfo("%s.%s.%s" % (func.namespace, short, func._overloadname), short, skip, writes,
                  alias)


def inherit_tag(args, out):
    """Gives an alias op's output its input's tag (see ``_ALIAS_OPS``)."""
    if isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor):
        tag = producer_tag(args[0])
        if tag is not None:
            setattr(out, TAG, tag)


def _collect_tensors(items, found):
    """Appends the tensors among ``items``, and in lists/tuples of them, to ``found``."""
    for a in items:
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif type(a) in (list, tuple):
            found.extend(x for x in a if isinstance(x, torch.Tensor))
    return found


def tensors_in(args, kwargs):
    """Returns the tensors among positional/keyword args and lists of them, in order."""
    found = _collect_tensors(args, [])
    return _collect_tensors(kwargs.values(), found) if kwargs else found


def outputs_of(writes, args, out):
    """Returns the tensors an op produced: its returns, or the args it wrote when it returns none.

    Args:
      writes: ``OpInfo.writes`` of the op.
    """
    if isinstance(out, torch.Tensor):
        return [out]
    if type(out) in (list, tuple) and out:
        return _collect_tensors(out, [])
    if writes:
        return tensors_in([args[i] for i in writes if i < len(args)], None)
    return []


def _nested_tensors(value, found, depth):
    """Appends the tensors in ``value`` and its nested containers (tuples, lists, dicts,
    dataclasses; 4 levels) to ``found``."""
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif depth < 4:
        if isinstance(value, dict):
            value = value.values()
        elif hasattr(value, "__dataclass_fields__"):
            value = [getattr(value, f, None) for f in value.__dataclass_fields__]
        elif not isinstance(value, (list, tuple)):
            return
        for item in value:
            _nested_tensors(item, found, depth + 1)


def producer_tag(t):
    tag = getattr(t, TAG, None)
    if t._is_view():
        base_tag = getattr(t._base, TAG, None)
        if base_tag is not None:
            version = t._version
            if tag is None or (tag[3] != version and (base_tag[3] == version or base_tag[4] > tag[4])):
                return base_tag
    return tag


class Segment:
    """The ops of one execution (graph segment) or of a run of eager ops.

    Args:
      session: the capture session (writer, health batch, graph registry, config).
      serial: a number unique per segment of the session.
      name: the execution's op_type (e.g. ``"MLP.forward"``); None for eager runs.
      stack_ids: frame ids of the call that started the execution.
    """

    def __init__(self, session, serial, name, stack_ids=()):
        self.session = session
        self.serial = serial
        self.name = name
        self.is_graph = name is not None
        self.stack_ids = stack_ids
        self.step = session.step  # the training step marked when the segment opened
        self.wall_time = time.time()
        # (op_type, op_name, input_names, num_outputs, stack_ids, device_name, output dtypes)
        self.ops = []
        self.traces = []  # (op_name, slot, tensor_id, payload, meta, device_name, wall_time)
        # (op_type, input ids, output ids, [(payload, meta, device id, tensor id)], stack ids,
        #  wall time, output dtypes)
        self.eager = []
        # Tensor ids of the values that entered from outside (one per Placeholder, in
        # order; -1 when the producer is unknown) and of the values the call returned.
        self.input_ids = []
        self.output_ids = []
        self.arg_ids = []  # tensor ids of the call's positional arguments (root forward)
        self._counters = {}
        self._placeholders = {}
        self._placeholder_names = set()  # the values of _placeholders, for O(1) clash checks

    def op_name(self, scope, short):
        """Returns a name unique in this segment: ``scope/short_k``."""
        key = (scope, short)
        k = self._counters.get(key, 0)
        self._counters[key] = k + 1
        return f"{scope}/{short}_{k}"  # f-strings format ints faster than %

    def input_name(self, t):
        """Returns ``producer:slot`` for a tensor, adding a Placeholder op for outside values."""
        tag = producer_tag(t)
        if tag is not None and tag[0] == self.serial:
            return "%s:%d" % (tag[1], tag[2])
        key = (tag[0], tag[4]) if tag is not None else None
        name = self._placeholders.get(key) if key is not None else None
        if name is None:
            name = self.session.param_name(t)
            if name is None and t._is_view():  # e.g. a Linear's transposed weight
                name = self.session.param_name(t._base)
            name = name or "input_%d" % len(self._placeholders)
            if name in self._placeholder_names:
                name = "%s_%d" % (name, len(self._placeholders))
            self._placeholders[key or ("untagged", len(self._placeholders))] = name
            self._placeholder_names.add(name)
            self.input_ids.append(tag[4] if tag is not None else -1)
            self.ops.append(("Placeholder", name, (), 1, (), "", (DTYPE_ENUM.get(t.dtype, 0),)))
        return name + ":0"

    def set_arguments(self, args):
        """Records the tensor ids of a call's arguments (read or not by the call)."""
        found = []
        _nested_tensors(args, found, 0)
        for t in found:
            tag = producer_tag(t)
            if tag is not None:
                self.arg_ids.append(tag[4])

    def set_outputs(self, value):
        """Records the tensors of a call's return value (nested in tuples, lists, dicts
        and ``ModelOutput``-like mappings) that this segment produced."""
        found = []
        _nested_tensors(value, found, 0)
        for t in found:
            tag = producer_tag(t)
            if tag is not None and tag[0] == self.serial:
                self.output_ids.append(tag[4])

    def tag(self, t, op_name, slot, tensor_id):
        """Marks ``t`` (and, when written through a view, its base) as produced here."""
        tag = (self.serial, op_name, slot, t._version, tensor_id, f"{op_name}:{slot}")
        setattr(t, TAG, tag)
        if t._is_view():
            setattr(t._base, TAG, tag)

    def finish(self, rows):
        """Encodes and writes everything recorded, given the fetched health rows.

        Args:
          rows: the blocks of ``HealthBatch.fetch()`` covering this segment's tokens,
            as nested lists (``block.tolist()``).
        """
        s = self.session
        step = self.step
        if s.watch_nonfinite:
            s.note_nonfinite(self, rows)
        if self.is_graph:
            graph_id = s.graphs.graph_id(self.name, self.ops)
            write = s.writer.write_serialized
            step_bytes = wire.step_field(step)
            for op_name, slot, tensor_id, payload, meta, device, wall in self.traces:
                prefix = s.trace_prefix(graph_id, op_name, slot, device)
                values = s.value_bytes(tensor_id, payload, meta, rows)
                write("graph_execution_traces", wire.trace_event(wall, prefix, values, step_bytes))
            event = debug_event_pb2.DebugEvent(wall_time=self.wall_time)
            ex = event.execution
            ex.op_type = self.name
            ex.graph_id = graph_id
            ex.input_tensor_ids.extend(self.input_ids)
            # then the arguments the call never read (e.g. a mask it ignored)
            read = set(self.input_ids)
            ex.input_tensor_ids.extend(i for i in dict.fromkeys(self.arg_ids) if i not in read)
            ex.output_tensor_ids.extend(self.output_ids)
            ex.num_outputs = len(self.output_ids)
            ex.tensor_debug_mode = s.mode_enum
            ex.code_location.host_name = s.host_name
            ex.code_location.stack_frame_ids.extend(self.stack_ids)
            if step is not None:
                ex.step = step
            s.writer.write_serialized("execution", event.SerializeToString())
        for op_type, in_ids, out_ids, outs, stack_ids, wall, dtypes in self.eager:
            event = debug_event_pb2.DebugEvent(wall_time=wall)
            ex = event.execution
            ex.op_type = op_type
            ex.num_outputs = len(out_ids)
            ex.input_tensor_ids.extend(in_ids)
            ex.output_tensor_ids.extend(out_ids)
            ex.output_dtypes.extend(dtypes)
            ex.tensor_debug_mode = s.mode_enum
            ex.code_location.host_name = s.host_name
            ex.code_location.stack_frame_ids.extend(stack_ids)
            for payload, meta, device_id, _ in outs:
                ex.output_tensor_device_ids.append(device_id)
                proto = s.value_proto(-1, payload, meta, rows)
                if proto is not None:
                    ex.tensor_protos.append(proto)
            if step is not None:
                ex.step = step
            s.writer.write_serialized("execution", event.SerializeToString())


class WeakIdMap:
    """Values for objects (tensors, modules) found by identity without keeping the objects alive.

    An ``id()``-keyed dict whose entries hold a weak reference checked on
    lookup: cheaper than ``WeakIdKeyDictionary``, which builds a reference
    object per query (hundreds per step). A dead object's entry is dropped by
    its reference's callback, so a reused id never finds a stale value.
    """

    def __init__(self):
        self._items = {}  # id(obj) -> (weak reference, value)

    def set(self, obj, value):
        """Maps ``obj`` to ``value`` (replacing an earlier value)."""
        key, items = id(obj), self._items

        def drop(ref):
            if items.get(key, (None,))[0] is ref:
                del items[key]

        items[key] = (weakref.ref(obj, drop), value)

    def get(self, obj):
        """The value of ``obj``, or None."""
        known = self._items.get(id(obj))
        return known[1] if known is not None and known[0]() is obj else None


class GraphRegistry:
    """Writes each distinct graph structure once and hands out its id.

    Args:
      writer: the ``FileSetWriter``.
      host_name: host recorded in code locations.
    """

    def __init__(self, writer, host_name):
        self._writer = writer
        self._host_name = host_name
        self._ids = {}  # (name, ops tuple) -> graph id

    def graph_id(self, name, ops):
        """Returns the id of the graph with this op sequence, writing it on first sight."""
        key = (name, tuple(ops))
        graph_id = self._ids.get(key)
        if graph_id is not None:
            return graph_id
        graph_id = self._ids[key] = "g%d" % len(self._ids)
        event = debug_event_pb2.DebugEvent()
        event.debugged_graph.graph_id = graph_id
        event.debugged_graph.graph_name = name
        event.debugged_graph.instrumented_ops.extend(op[1] for op in ops)
        self._writer.write_event(event)
        for op_type, op_name, inputs, num_outputs, stack_ids, device, dtypes in ops:
            event = debug_event_pb2.DebugEvent()
            op = event.graph_op_creation
            op.op_type = op_type
            op.op_name = op_name
            op.graph_name = name
            op.graph_id = graph_id
            op.device_name = device
            op.input_names.extend(inputs)
            op.num_outputs = num_outputs
            op.output_dtypes.extend(dtypes)
            op.code_location.host_name = self._host_name
            op.code_location.stack_frame_ids.extend(stack_ids)
            self._writer.write_event(event)
        return graph_id
