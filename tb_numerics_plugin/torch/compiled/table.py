"""What the passes learn of a compiled graph: its ops as the record names them.

:class:`OpTable` reads a graph's nodes (both passes: Dynamo's torch-level
forward graph, AOTAutograd's post-grad backward graph) into :class:`Op` objects,
with each op's module path, source lines, inputs and traced outputs; its
:class:`CompiledGraph` is what the capture records at each compiled call.
"""

import operator
import re

import torch
from torch.fx.node import map_arg

from tb_numerics_plugin.torch import health
from tb_numerics_plugin.torch.compiled.custom_ops import State

# The raw rows a mode needs inside the graph (None: no values, only the call).
LEVELS = {"CURT_HEALTH": health.LEVEL_COUNTS, "CONCISE_HEALTH": health.LEVEL_COUNTS,
          "FULL_HEALTH": health.LEVEL_COUNTS, "FULL_NUMERICS": health.LEVEL_MOMENTS}
_FRAME_LINE = re.compile(r'^\s*File "(.+)", line (\d+), in (.+)$')
_GETITEM = operator.getitem


class Op:
    """One op of a compiled graph as the record names it.

    Attributes:
      op_type: the torch-level op (``linear``, ``log``, ``masked_fill``); in a backward
        graph the aten op (``aten.mul.Tensor``).
      short: the op's name in op names (``linear``, ``mul``).
      path: its module path relative to the compiled frame's module (``""``: that module).
      inputs: per input, ``(op index, slot)`` or ``(None, placeholder name)``.
      dtypes: the ``DataType`` numbers of its tensor outputs.
      frames: ``(file, line, function)`` of its source, outermost first.
      rows: per output, its row in the emitted rows, or None when not traced.
      metas: per output, ``health.tensor_meta``-like ``(dtype enum, shape, device id)``.
    """

    __slots__ = ("op_type", "short", "path", "inputs", "dtypes", "frames", "rows", "metas")

    def __init__(self, op_type, path, inputs, dtypes, frames, rows, metas, short=None):
        self.op_type = op_type
        self.short = short or op_type
        self.path = path
        self.inputs = inputs
        self.dtypes = dtypes
        self.frames = frames
        self.rows = rows
        self.metas = metas


class CompiledGraph:
    """What the pass learned of one graph: its ops, in graph order, and the rows it emits.

    Attributes:
      key: the number :func:`emit` is called with.
      ops: list of :class:`Op`.
      placeholders: placeholder name -> ``DataType`` number of the graph inputs read.
      returned: ``(op index, slot)`` of each value the graph returns.
      backward: a compiled backward graph (aten ops).
      stack_ids: per (session id, call site ids), the frame ids of each op (filled on
        first record).
    """

    def __init__(self, key, ops, placeholders, returned, backward=False):
        self.key = key
        self.backward = backward
        self.ops = ops
        self.placeholders = placeholders
        self.returned = returned
        self.stack_ids = {}


def _value_tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)) and value and all(
            isinstance(v, torch.Tensor) for v in value):
        return list(value)
    return None


def node_op_type(node):
    target = node.target
    if node.op == "call_method":
        return target
    if node.op == "call_module":
        return target.rsplit(".", 1)[-1]
    name = getattr(target, "__name__", None) or str(target)
    return name.rsplit(".", 1)[-1]


_SOURCE_PART = re.compile(r"\['([^']*)'\]|\[(\d+)\]|\.(\w+)")


def module_path(node):
    """The node's module path relative to the compiled frame (``encoder.layers.0``), or ``""``."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    source = list(stack.values())[-1][0]
    return source_path(source)


_SOURCE_HEAD = re.compile(r"^L\['(?:args|kwargs)'\]\[(?:'([^']*)'|(\d+))\]|^L\['([^']*)'\]")


def source_path(source, local=False):
    """A Dynamo source name (``L['self'].encoder.layers.0``, ``L['self']._modules['fc']``)
    as a dotted path below the frame's local (``encoder.layers.0``, ``fc``); with
    ``local``, a bare local (``L['x']``, ``L['kwargs']['input_ids']``) is named by
    itself (``x``, ``input_ids``). A frame's ``args[0]`` counts as its local."""
    text = str(source)
    head = _SOURCE_HEAD.match(text)
    rest = text[head.end():] if head else text
    if local and head and not rest:
        return next(g for g in head.groups() if g is not None)
    parts = []
    for m in _SOURCE_PART.finditer(rest):
        part = next(g for g in m.groups() if g is not None)
        if part in ("_modules", "_parameters", "_buffers", "_orig_mod"):
            continue
        parts.append(part)
    return ".".join(parts)


def placeholder_name(node):
    arg = node.meta.get("grapharg")
    source = getattr(arg, "source", None)
    if source is not None:
        try:
            path = source_path(source.name, local=True)
        except Exception:
            path = ""
        if path:
            return path
    return node.name


def _frames(node):
    text = node.meta.get("stack_trace") or ""
    out = []
    for line in text.splitlines():
        m = _FRAME_LINE.match(line)
        if m:
            out.append((m.group(1), int(m.group(2)), m.group(3).strip()))
    return tuple(out)


def _meta(t):
    shape = []
    for d in t.shape:
        try:
            shape.append(int(d))
        except Exception:  # a symbolic size: its hint, the size it was compiled for
            shape.append(int(getattr(getattr(d, "node", None), "hint", 0) or 0))
    index = t.device.index
    return (health.DTYPE_ENUM.get(t.dtype, 0), tuple(shape), -1 if index is None else index)


class OpTable:
    """The ops of a graph being instrumented, as both passes read them.

    Args:
      session: the capture session (its mode, ``op_regex`` and dtype filter).
      val: the node meta key of a node's example value (``example_value`` in
        Dynamo's graphs, ``val`` after AOTAutograd).

    Attributes:
      level: the ``health.LEVEL_*`` the mode needs, or None (no values).
      ops: list of :class:`Op`, in graph order.
      placeholders: placeholder name -> ``DataType`` number of the graph inputs read.
      traced: ``(node, slot)`` of each value that gets a health row, in row order.
    """

    def __init__(self, session, val):
        self._session = session
        self._val = val
        self.level = LEVELS.get(session.encoder.mode)
        self._index = {}  # node -> (op index, slot) of ops and items, (None, name) of inputs
        self.ops = []
        self.placeholders = {}
        self.input_nodes = {}  # placeholder name -> its node (the first of that name)
        self.traced = []

    def value(self, node):
        """The node's example value (a fake tensor, a tuple of them, or anything else)."""
        return node.meta.get(self._val)

    def ref(self, node):
        """``(op index, slot)`` of the value ``node`` yields, ``(None, name)`` of an input,
        or None."""
        return self._index.get(node)

    def placeholder(self, node, name):
        """Notes a graph input (when it is a tensor) as the input ``name``."""
        if isinstance(self.value(node), torch.Tensor):
            self._index[node] = (None, name)
            self.input_nodes.setdefault(name, node)

    def item(self, node):
        """Whether ``node`` picks an item of an op's tuple output (then it reads as that
        output)."""
        if node.target is not _GETITEM or not node.args or node.args[0] not in self._index:
            return False
        parent = self._index[node.args[0]]
        if parent[0] is not None and isinstance(node.args[1], int) and isinstance(
                self.value(node), torch.Tensor):
            self._index[node] = (parent[0], node.args[1])
        return True

    def alias(self, node):
        """Notes a view or alias: its readers read the value it views."""
        source = next((a for a in node.args if a in self._index), None)
        if source is not None and isinstance(self.value(node), torch.Tensor):
            self._index[node] = self._index[source]

    def add(self, node, op_type, short, path):
        """Adds ``node`` as an op when it yields tensors; its traced outputs get rows."""
        value = self.value(node)
        tensors = _value_tensors(value)
        if tensors is None:
            return
        inputs = []

        def note(arg):
            ref = self._index.get(arg)
            if ref is not None:
                if ref[0] is None and ref[1] not in self.placeholders:
                    self.placeholders[ref[1]] = health.DTYPE_ENUM.get(self.value(arg).dtype, 0)
                inputs.append(ref)
            return arg

        map_arg((node.args, node.kwargs), note)
        session = self._session
        traced = session.compiled_calls.traced(op_type) or (
            short != op_type and session.compiled_calls.traced(short))
        rows, metas = [], []
        for slot, t in enumerate(tensors):
            metas.append(_meta(t))
            if traced and session.encoder.dtype_traced(t.dtype):
                rows.append(len(self.traced) if self.level is not None else -1)
                if self.level is not None:
                    self.traced.append((node, slot))
            else:
                rows.append(None)
        self.ops.append(Op(op_type, path, tuple(inputs), tuple(m[0] for m in metas),
                           _frames(node), tuple(rows), tuple(metas), short=short))
        self._index[node] = (len(self.ops) - 1, 0 if isinstance(value, torch.Tensor) else None)

    def add_rows(self, graph, row_of, item_of):
        """Adds a health row right after each traced value (a later in-place write must not
        change it, and the value need not live to the end of the graph).

        Args:
          row_of: value node -> the row node (adds it where it is called).
          item_of: (tuple node, slot) -> the item node (likewise).

        Returns:
          the row nodes, in row order.
        """
        rows = []
        for node, slot in self.traced:
            with graph.inserting_after(node):
                value = node if isinstance(self.value(node), torch.Tensor) else item_of(node, slot)
                with graph.inserting_after(value):
                    rows.append(row_of(value))
        return rows

    def returned(self, output):
        """``(node, ref)`` of each tensor the graph's ``output`` node returns that one of
        its ops made (not an input passed through)."""
        found = []

        def note(arg):
            ref = self.ref(arg)
            if ref is not None and ref[0] is not None and isinstance(
                    self.value(arg), torch.Tensor):
                found.append((arg, ref))

        map_arg(output.args, note)
        return found

    def read_inputs(self):
        """The nodes of the graph inputs its ops read, in :attr:`placeholders` order."""
        return [self.input_nodes[name] for name in self.placeholders]

    def register(self, key, returned=(), backward=False):
        """Keeps the graph's :class:`CompiledGraph` under ``key``; returns it."""
        compiled = CompiledGraph(key, self.ops, self.placeholders, list(returned), backward)
        State.graphs[key] = compiled
        return compiled
