"""Compiled regions under the capture: health computed inside the compiled graphs.

Without this, a ``torch.compile``d model runs eagerly under the capture (a
dispatch mode de-compiles what it sees). With it, the dispatch mode lets
Dynamo compile (``mode.CompiledCaptureMode``; the native hook sets no
``force_eager`` stance and records nothing while torch.compile compiles) and
inductor runs two passes:

- :class:`InstrumentPass` (``pre_grad_custom_pass``) on each forward graph
  Dynamo hands it, torch-level, before AOTAutograd: every call node that
  yields tensors becomes an op of the record, with its op type (``linear``,
  ``masked_fill``), its module path (``nn_module_stack``) and its source
  lines (``stack_trace``: the model library's own lines);
- :class:`BackwardPass` (``post_grad_custom_post_pass``) on each backward
  graph AOTAutograd made: every aten node that is not a view becomes an op,
  named by its forward node's module path and pointing at its forward line.

After each traced value the passes add :func:`health_row` (the capture's
health kernel, one pass over the value), and at the end of the graph one op
that hands all rows, once per compiled call, to
:meth:`capture.Session.on_compiled`: :func:`emit` (an ordered side effect,
which inductor keeps) in forward graphs, :func:`emit_backward` (declared as
writing its argument, for the same reason) in backward graphs. The session
records the graph's ops into the open execution as if they had run eagerly.
:func:`emit` also takes the values the graph returns, which the session tags
as their ops' outputs, and the inputs the graph's ops read, whose tags name
their producers: data flow crosses the compiled call as it crosses eager ops.

Ops that compiled code calls through the dispatcher (inductor's extern
kernels, fallbacks, the health rows and the emits) come from its generated
Python file and are not recorded one by one (:func:`called_from_compiled`).

Code compiled before the capture starts carries no health: the capture drops
Dynamo's caches when it starts and again when it stops
(``torch.compiler.reset``), so compiled regions are compiled again, with the
passes and then without them.
"""

import functools
import itertools
import operator
import os
import re
import sys
import threading
from typing import List

import torch
from torch.fx.node import map_arg

from tb_numerics_plugin.torch import health, kernels

# The raw rows a mode needs inside the graph (None: no values, only the call).
_LEVELS = {"CURT_HEALTH": health.LEVEL_COUNTS, "CONCISE_HEALTH": health.LEVEL_COUNTS,
           "FULL_HEALTH": health.LEVEL_COUNTS, "FULL_NUMERICS": health.LEVEL_MOMENTS}
# Modes a compiled region can serve: FULL_TENSOR would copy every value out
# of the graph, so under it compiled regions still run eagerly.
MODES = ("NO_TENSOR", "SHAPE") + tuple(_LEVELS)
_FRAME_LINE = re.compile(r'^\s*File "(.+)", line (\d+), in (.+)$')
_GETITEM = operator.getitem


# key -> CompiledGraph: every graph instrumented in this process (empty: none yet)
instrumented = {}


class _State:
    session = None  # the capture session compiled regions report to
    keys = itertools.count(1)
    graphs = instrumented
    installed = None  # the pass settings before install, while installed (_CONFIGS order)
    lock = threading.Lock()


def _hand_over(rows, key, values=(), inputs=()):
    session = _State.session
    if session is not None:
        session.on_compiled(_State.graphs.get(key), rows, values, inputs)


@torch.library.custom_op("tb_numerics::emit", mutates_args=())
def emit(rows: torch.Tensor, key: int, values: List[torch.Tensor],
         inputs: List[torch.Tensor]) -> None:
    """Hands the ``[n, 12]`` raw health rows of one compiled call to the capture (runs
    after the call's kernels), with the values the call returns (``CompiledGraph.returned``
    order: the capture tags them as their ops' outputs) and the inputs its ops read
    (``CompiledGraph.placeholders`` order: their tags name their producers)."""
    _hand_over(rows, key, values, inputs)


@emit.register_fake
def _emit_fake(rows, key, values, inputs):
    return None


emit.register_effect(torch._library.effects.EffectType.ORDERED)


@torch.library.custom_op("tb_numerics::emit_backward", mutates_args=("rows",))
def emit_backward(rows: torch.Tensor, key: int, values: List[torch.Tensor]) -> None:
    """Hands the rows of one compiled backward call to the capture, with the gradients
    it returns (tagged as their ops' outputs). Declared as writing ``rows`` so that
    inductor keeps it: nothing reads what it returns."""
    _hand_over(rows, key, values)


@emit_backward.register_fake
def _emit_backward_fake(rows, key, values):
    return None


@torch.library.custom_op("tb_numerics::health_row", mutates_args=())
def health_row(x: torch.Tensor, level: int) -> torch.Tensor:
    """The raw health row (``health.py``) of ``x`` as a float64 ``[12]`` tensor on its
    device: one pass of the C kernel on CPU, the Triton kernel on CUDA (no sync), else
    torch ops. Compiled graphs call it after each traced value (an extern call:
    inductor's own fused reductions measured several times slower than the C pass)."""
    if x.device.type == "cpu" and kernels.c_kernel_available():
        row = torch.empty(health.RAW_WIDTH, dtype=torch.float64)
        kernels.c_raw_stats(x, level, out=row.numpy())
        return row
    if x.device.type == "cuda" and kernels.triton_available():
        from tb_numerics_plugin.torch import _triton_health

        row = torch.empty(health.RAW_WIDTH, dtype=torch.float64, device=x.device)
        _triton_health.raw_stats_into(x, level, row)
        return row
    return health.torch_raw_stats(x, level)


@health_row.register_fake
def _health_row_fake(x, level):
    return x.new_empty(health.RAW_WIDTH, dtype=torch.float64)


def _traced_row(x, level):
    """:func:`health_row` of a value of Dynamo's graph (detached: no gradient flows to it)."""
    return torch.ops.tb_numerics.health_row(x.detach(), level)


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
      stack_ids: per (session id, call site ids), the frame ids of each op (filled on first record).
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


def _op_type(node):
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


def _placeholder_name(node):
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


class _OpTable:
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
        self.level = _LEVELS.get(session.encoder.mode)
        self._index = {}  # node -> (op index, slot) of ops and items, (None, name) of inputs
        self.ops = []
        self.placeholders = {}
        self.input_nodes = {}  # placeholder name -> its node (the first of that name)
        self.traced = []

    def value(self, node):
        """The node's example value (a fake tensor, a tuple of them, or anything else)."""
        return node.meta.get(self._val)

    def ref(self, node):
        """``(op index, slot)`` of the value ``node`` yields, ``(None, name)`` of an input, or None."""
        return self._index.get(node)

    def placeholder(self, node, name):
        """Notes a graph input (when it is a tensor) as the input ``name``."""
        if isinstance(self.value(node), torch.Tensor):
            self._index[node] = (None, name)
            self.input_nodes.setdefault(name, node)

    def item(self, node):
        """Whether ``node`` picks an item of an op's tuple output (then it reads as that output)."""
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
        traced = session.compiled_traced(op_type) or (
            short != op_type and session.compiled_traced(short))
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
            if ref is not None and ref[0] is not None and isinstance(self.value(arg), torch.Tensor):
                found.append((arg, ref))

        map_arg(output.args, note)
        return found

    def read_inputs(self):
        """The nodes of the graph inputs its ops read, in :attr:`placeholders` order."""
        return [self.input_nodes[name] for name in self.placeholders]

    def register(self, key, returned=(), backward=False):
        """Keeps the graph's :class:`CompiledGraph` under ``key``; returns it."""
        compiled = CompiledGraph(key, self.ops, self.placeholders, list(returned), backward)
        _State.graphs[key] = compiled
        return compiled


def instrument(graph, session):
    """Adds the health rows and the :func:`emit` call to ``graph``; returns its CompiledGraph.

    Args:
      graph: Dynamo's torch-level ``torch.fx.Graph`` (changed in place).
      session: the capture session (its mode, ``op_regex`` and dtype filter).
    """
    table = _OpTable(session, "example_value")
    output = None
    for node in list(graph.nodes):
        if node.op == "placeholder":
            table.placeholder(node, _placeholder_name(node))
        elif node.op == "output":
            output = node
        elif node.op in ("call_function", "call_method", "call_module") and not table.item(node):
            op_type = _op_type(node)
            table.add(node, op_type, op_type, module_path(node))
    if output is None:
        return None
    returned = table.returned(output)
    level = table.level
    rows = table.add_rows(graph, lambda v: graph.call_function(_traced_row, (v, level)),
                          lambda node, slot: graph.call_function(_GETITEM, (node, slot)))
    key = next(_State.keys)
    with graph.inserting_before(output):
        if rows:
            rows_node = graph.call_function(torch.stack, (rows,))
        else:
            rows_node = graph.call_function(torch.zeros, ((0, health.RAW_WIDTH),),
                                            {"dtype": torch.float64})
        graph.call_function(torch.ops.tb_numerics.emit.default,
                            (rows_node, key, [value for value, _ in returned], table.read_inputs()))
    return table.register(key, [ref for _, ref in returned])


def _pass_base():
    from torch._inductor.custom_graph_pass import CustomGraphPass

    return CustomGraphPass


# seq_nr -> module path of forward nodes, from the post-grad forward graphs: backward
# nodes carry their forward node's seq_nr and stack_trace, not its module stack.
_FORWARD_PATHS = {}


def _fake_call(graph, fake_mode, target, args, kwargs=None):
    """Adds ``target(*args)`` to a post-grad graph with the ``val`` inductor lowers it by."""
    node = graph.call_function(target, args, kwargs or {})
    vals = map_arg((args, kwargs or {}), lambda n: n.meta["val"])
    with fake_mode:
        node.meta["val"] = target(*vals[0], **vals[1])
    return node


def _unlowered():
    """The aten ops a backward graph gets from :func:`instrument_backward` that this
    inductor cannot lower (a post-grad graph is lowered op by op, undecomposed)."""
    from torch._inductor.lowering import lowerings

    a = torch.ops.aten
    used = (a.unsqueeze.default, a.cat.default, a.full.default)
    return [str(op) for op in used if op not in lowerings]


def instrument_backward(graph, session):
    """Adds health rows and :func:`emit_backward` to a post-grad backward graph; returns its
    CompiledGraph (None for a forward graph, whose module paths it remembers)."""
    from torch._guards import detect_fake_mode

    from tb_numerics_plugin.torch.ops import analyze_op

    nodes = list(graph.nodes)
    if not any(n.op == "placeholder" and n.name.startswith("tangents") for n in nodes):
        for node in nodes:
            seq, stack = node.meta.get("seq_nr"), node.meta.get("nn_module_stack")
            if seq is not None and stack:
                _FORWARD_PATHS[seq] = source_path(list(stack.values())[-1][0])
        return None
    missing = _unlowered()
    if missing:  # inductor would fail on the graph: the user's backward must still compile
        raise RuntimeError("inductor has no lowering for %s" % ", ".join(missing))
    table = _OpTable(session, "val")
    output = None
    for node in nodes:
        if node.op == "placeholder":
            table.placeholder(node, node.name)
        elif node.op == "output":
            output = node
        elif node.op == "call_function" and not table.item(node) and isinstance(
                node.target, torch._ops.OpOverload):
            info = analyze_op(node.target)
            if info.skip:
                table.alias(node)
            else:
                table.add(node, info.op_type, info.short,
                          _FORWARD_PATHS.get(node.meta.get("seq_nr"), ""))
    if output is None:
        return None
    returned = table.returned(output)  # (before the rows are added: gradients only)
    vals = [n.meta["val"] for n in nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    call = functools.partial(_fake_call, graph, detect_fake_mode(vals))
    aten, level = torch.ops.aten, table.level
    # (unsqueeze and cat, not stack: stack is a decomposition, gone after post-grad)
    rows = table.add_rows(
        graph, lambda v: call(aten.unsqueeze.default,
                              (call(torch.ops.tb_numerics.health_row.default, (v, level)), 0)),
        lambda node, slot: call(_GETITEM, (node, slot)))
    key = next(_State.keys)
    with graph.inserting_before(output):
        if rows:
            rows_node = call(aten.cat.default, (rows,))
        else:
            device = vals[0].device if vals else torch.device("cpu")
            rows_node = call(aten.full.default, ([0, health.RAW_WIDTH], 0.0),
                             {"dtype": torch.float64, "device": device})
        graph.call_function(torch.ops.tb_numerics.emit_backward.default,
                            (rows_node, key, [node for node, _ in returned])).meta["val"] = None
    return table.register(key, [ref for _, ref in returned], backward=True)


class InstrumentPass(_pass_base()):
    """Inductor's ``pre_grad_custom_pass`` while a capture is on: :func:`instrument`."""

    def __init__(self, session):
        self._session = session

    def __deepcopy__(self, memo):
        # torch.compile copies inductor's config (deepcopy) when it is called: a call made
        # while the capture is on shares this pass instead of copying the session
        return self

    def __call__(self, graph):
        session = _State.session
        if session is None:
            return
        try:
            instrument(graph, session)
        except Exception as exc:  # the model still compiles, without health
            session.fail("instrumenting a compiled graph", exc)

    def uuid(self):
        # Graphs cached by inductor name keys of this process's registry.
        return "tb_numerics:%d:%d:%s" % (os.getpid(), id(self._session),
                                         self._session.encoder.mode)


class BackwardPass(InstrumentPass):
    """Inductor's ``post_grad_custom_post_pass`` while a capture is on: :func:`instrument_backward`."""

    def __call__(self, graph):
        session = _State.session
        if session is None:
            return
        try:
            instrument_backward(graph, session)
        except Exception as exc:  # the backward still compiles, untraced
            session.fail("instrumenting a compiled backward graph", exc)

    def uuid(self):
        return "backward:" + super().uuid()


_CONFIGS = (("pre_grad_custom_pass", InstrumentPass), ("post_grad_custom_post_pass", BackwardPass))


def install(session):
    """Makes compiled regions compile with :class:`InstrumentPass` and
    :class:`BackwardPass` for ``session`` (after any passes already configured)."""
    from torch._inductor import config

    with _State.lock:
        if _State.installed is None:
            _State.installed = [getattr(config, name) for name, _ in _CONFIGS]
            for name, kind in _CONFIGS:
                prior, ours = getattr(config, name), kind(session)
                if prior is None:
                    setattr(config, name, ours)
                elif isinstance(prior, (list, tuple)):
                    setattr(config, name, tuple(prior) + (ours,))
                else:
                    setattr(config, name, (prior, ours))
        _State.session = session
    _reset_dynamo()


def uninstall(session):
    """Undoes :func:`install`; code compiled meanwhile is dropped (compiled again, plain)."""
    from torch._inductor import config

    with _State.lock:
        if _State.session is not session:
            return
        _State.session = None
        if _State.installed is not None:
            for (name, _), prior in zip(_CONFIGS, _State.installed):
                setattr(config, name, prior)
            _State.installed = None
    _reset_dynamo()


def _reset_dynamo():
    if "torch._dynamo" in sys.modules:
        torch.compiler.reset()


def calling_optimizer(frame):
    """The optimizer whose method runs ``frame`` or an outer frame (a compiled optimizer
    step: Dynamo compiles ``Optimizer.step``, or its ``_use_grad`` wrapper, as a frame of
    its own), or None."""
    return _calling_self(frame, torch.optim.Optimizer, lambda code: "self" in code.co_varnames)


def calling_module(frame):
    """The module whose call runs ``frame`` or an outer frame (a model compiled in place
    by ``model.compile()``: its ``_call_impl`` frame), or None."""
    return _calling_self(frame, torch.nn.Module, lambda code: code.co_name in _MODULE_CALLS)


_MODULE_CALLS = ("_call_impl", "_wrapped_call_impl", "forward")


def _calling_self(frame, kind, accepts, depth=64):
    """The ``self`` of type ``kind`` of the first frame, ``frame`` outwards, whose code
    ``accepts``, or None (looked for in ``depth`` frames)."""
    while frame is not None and depth > 0:
        if accepts(frame.f_code):
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, kind):
                return candidate
        frame = frame.f_back
        depth -= 1
    return None


# ---- ops that compiled code calls ---------------------------------------------------
_CACHE_DIR = [None]


def generated_dir():
    """The directory of the Python files inductor generates (normalized, ending in a separator)."""
    root = _CACHE_DIR[0]
    if root is None:
        try:
            from torch._inductor.runtime.cache_dir_utils import cache_dir

            root = os.path.normcase(os.path.realpath(cache_dir())) + os.sep
        except Exception:  # an inductor without it: nothing is generated code
            root = "\0"
        _CACHE_DIR[0] = root
    return root


_TORCH_DIR = os.path.normcase(os.path.realpath(os.path.dirname(torch.__file__))) + os.sep
_generated = {}  # id(code object) -> 0 (other code), 1 (generated code) or 2 (torch's own)
_codes = {}  # keeps every key's code object alive
_MAX_HOPS = 16


def called_from_compiled(frame):
    """Whether the op whose dispatch ``frame`` called comes from inductor's generated code
    (the Python file of a compiled graph): the first frame outside torch's own
    files, walking out from ``frame``, is generated code."""
    for _ in range(_MAX_HOPS):
        if frame is None:
            return False
        code = frame.f_code
        kind = _generated.get(id(code))
        if kind is None:
            kind = _classify(code)
        if kind != 2:
            return kind == 1
        frame = frame.f_back
    return False


def _classify(code):
    path = os.path.normcase(os.path.realpath(code.co_filename))
    if path.startswith(generated_dir()):
        kind = 1
    else:
        kind = 2 if path.startswith(_TORCH_DIR) else 0
    _codes[id(code)] = code
    _generated[id(code)] = kind
    return kind
