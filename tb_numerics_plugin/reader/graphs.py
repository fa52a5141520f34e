"""Graphs, ops, devices, stack frames and source files of one file set.

These records are few (hundreds to thousands), so each is parsed with
protobuf once and kept; source file lines, which can be megabytes, are
re-read by offset when asked for.
"""

import collections

# Most outputs an op may claim: op_info lists consumers per output slot, so a
# hostile num_outputs of 2**31 - 1 must not size anything.
MAX_OUTPUTS = 1 << 16


def split_input_name(name):
    """``"op:slot"`` → ``(op, slot)``; a name without a slot is slot 0; ``^op`` is a control input."""
    op, sep, slot = name.rpartition(":")
    if sep and slot.isdigit():
        return op, int(slot)
    return name, 0


class GraphIndex:
    """What the graphs, stack_frames and source_files files of one file set say."""

    def __init__(self):
        self.graphs = {}  # graph_id -> {"name", "outer", "inner": [ids]}
        self.graph_order = []
        self.ops = {}  # (graph_id, op_name) -> GraphOpCreation
        self.ops_by_graph = collections.defaultdict(list)
        self.devices = {}  # device_id -> device_name
        self.stack_frames = {}  # id -> FileLineCol
        self.source_files = []  # [(offset, file_path, host_name, num_lines)]
        self._consumers = {}  # graph_id -> {(op, slot): [(consumer, input_slot)]}
        self.warnings = []

    def add_graph_record(self, event, offset, path):
        """Indexes one record of the .graphs file."""
        kind = event.WhichOneof("what")
        if kind == "debugged_graph":
            g = event.debugged_graph
            if g.outer_context_id == g.graph_id:
                self.warnings.append("%s: record at offset %d: graph %r is its own outer "
                                     "graph; read as a top-level graph" % (path, offset,
                                                                           g.graph_id))
                g.outer_context_id = ""
            if g.graph_id not in self.graphs:
                self.graph_order.append(g.graph_id)
            self.graphs[g.graph_id] = {
                "name": g.graph_name,
                "outer": g.outer_context_id or None,
                "inner": self.graphs.get(g.graph_id, {}).get("inner", []),
            }
            if g.outer_context_id:
                outer = self.graphs.setdefault(
                    g.outer_context_id, {"name": "", "outer": None, "inner": []}
                )
                outer["inner"].append(g.graph_id)
        elif kind == "graph_op_creation":
            op = event.graph_op_creation
            if not 0 <= op.num_outputs <= MAX_OUTPUTS:
                sane = min(len(op.output_tensor_ids), MAX_OUTPUTS)
                self.warnings.append(
                    "%s: record at offset %d: op %r claims %d outputs; read as %d"
                    % (path, offset, op.op_name, op.num_outputs, sane))
                op.num_outputs = sane
            key = (op.graph_id, op.op_name)
            if key not in self.ops:
                self.ops_by_graph[op.graph_id].append(op.op_name)
            self.ops[key] = op
            self._consumers.pop(op.graph_id, None)
        elif kind == "debugged_device":
            self.devices[event.debugged_device.device_id] = event.debugged_device.device_name
        else:
            self.warnings.append(
                "%s: record at offset %d holds %s, not a graph record; skipped"
                % (path, offset, kind)
            )

    def add_stack_frame_record(self, event, offset, path):
        """Indexes one record of the .stack_frames file."""
        if event.WhichOneof("what") != "stack_frame_with_id":
            self.warnings.append(
                "%s: record at offset %d is not a stack frame; skipped" % (path, offset)
            )
            return
        frame = event.stack_frame_with_id
        flc = frame.file_line_col
        if flc.line < 0 or flc.file_index < 0:
            self.warnings.append("%s: record at offset %d: stack frame %r has line %d, file "
                                 "index %d; read as line 0 of no known file"
                                 % (path, offset, frame.id, flc.line, flc.file_index))
            flc.line = max(flc.line, 0)  # a negative file index already names no file
        self.stack_frames[frame.id] = flc

    def add_source_file_record(self, event, offset, path):
        """Indexes one record of the .source_files file (its lines stay on disk)."""
        if event.WhichOneof("what") != "source_file":
            self.warnings.append(
                "%s: record at offset %d is not a source file; skipped" % (path, offset)
            )
            return
        sf = event.source_file
        self.source_files.append((offset, sf.file_path, sf.host_name, len(sf.lines)))

    def op(self, graph_id, op_name):
        """The ``GraphOpCreation`` of an op, or None when the graphs file has no such op."""
        return self.ops.get((graph_id, op_name))

    def graph_name(self, graph_id):
        """A graph's name, or None (unknown id, or eager: id "")."""
        return self.graphs.get(graph_id, {}).get("name")

    def graph_ids_outward(self, graph_id):
        """``[outermost, ..., graph_id]`` following outer_context_id."""
        chain, seen = [], set()
        while graph_id and graph_id not in seen:
            seen.add(graph_id)
            chain.append(graph_id)
            graph_id = self.graphs.get(graph_id, {}).get("outer")
        return chain[::-1]

    def consumers(self, graph_id):
        """``{(producer, slot): [(consumer op name, input slot)]}`` of one graph (data edges)."""
        table = self._consumers.get(graph_id)
        if table is None:
            table = collections.defaultdict(list)
            for name in self.ops_by_graph.get(graph_id, ()):
                op = self.ops[(graph_id, name)]
                for input_slot, input_name in enumerate(op.input_names):
                    if input_name.startswith("^"):
                        continue
                    table[split_input_name(input_name)].append((name, input_slot))
            self._consumers[graph_id] = table
        return table
