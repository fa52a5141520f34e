"""The graphs of a capture: each distinct op sequence written once, as a ``DebuggedGraph``.

A graph execution's ops (``segments.Segment.ops``) are looked up by their
name and whole op sequence; the first sight writes the ``DebuggedGraph`` and
one ``GraphOpCreation`` per op, later executions of the same structure
reuse its id.
"""

from tb_numerics_plugin.proto import debug_event_pb2


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
        # name -> (ops tuple, graph id) of its last execution: a training loop runs the
        # same structure again, whose ops compare equal item by item, where hashing the
        # key walked every op's strings and tuples (about 600 instructions per op in a
        # tight loop); by identity, as the C recorder hands the last execution's records
        # out again (``last_ops``, ``Segment.prior_ops``)
        self._last = {}

    def last_ops(self, name):
        """The op records of the last execution named ``name`` (a tuple, empty when none)."""
        last = self._last.get(name)
        return last[0] if last is not None else ()

    def graph_id(self, name, ops):
        """Returns the id of the graph with this op sequence, writing it on first sight.

        Args:
          name: the graph's name (the execution's op type, ``MLP.forward``).
          ops: ``Segment.ops`` tuples (op_type, op_name, input_names, num_outputs,
            stack_ids, device_name, output dtypes).
        """
        ops = tuple(ops)
        last = self._last.get(name)
        if last is not None and last[0] == ops:
            self._last[name] = (ops, last[1])  # its latest records: handed out again (C)
            return last[1]
        key = (name, ops)
        graph_id = self._ids.get(key)
        if graph_id is None:
            graph_id = self._ids[key] = "g%d" % len(self._ids)
            self._write(graph_id, name, ops)
        self._last[name] = (ops, graph_id)
        return graph_id

    def _write(self, graph_id, name, ops):
        """Writes the ``DebuggedGraph`` and one ``GraphOpCreation`` per op."""
        event = debug_event_pb2.DebugEvent()
        event.debugged_graph.graph_id = graph_id
        event.debugged_graph.graph_name = name
        event.debugged_graph.instrumented_ops.extend(op_name for _, op_name, *_ in ops)
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
