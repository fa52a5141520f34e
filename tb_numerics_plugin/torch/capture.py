"""The capture session: a per-op hook plus module and optimizer hooks.

Every aten op reaches the native hook (``native.py``: a C++ dispatcher
callback) or, without it, :meth:`mode.CaptureMode.__torch_dispatch__`; either
lets the op run exactly once, hands the untouched result back, and only then
records it (:meth:`Session.on_op`, or its twin in C, ``_record.c``, for all but
the ops that open an execution: :func:`choose_recorder`). Global module
forward hooks give module paths and the boundaries of root forward calls;
global optimizer step hooks mark optimizer steps (both kept by
``hooks.Scopes``); ops run while autograd evaluates a node
form the backward execution. Ops are recorded into the open
``segments.Segment``; what a traced value keeps and how it is encoded is the
``encoder.Encoder``'s. A ``torch.compile``d region stays compiled: its
graphs compute their health rows themselves and hand them over once per
compiled call (:meth:`Session.on_compiled`, ``compiled.py``). Any failure
inside the recording is logged once, counted and swallowed: the user's step
never breaks.

The writer's flush thread also reaches in, to write an execution a stalled
program left open (``gate.py``).
"""

import collections
import gc
import logging
import os
import random
import re
import sys
import threading
import time
import types

import torch
from torch._C._dynamo.eval_frame import set_eval_frame as _set_eval_frame

from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.torch import compiled, gate, health, hooks, stacks, steps, stop, tags
from tb_numerics_plugin.torch.encoder import Encoder
from tb_numerics_plugin.torch.ops import OpInfo, analyze_op, outputs_of, tensors_in
from tb_numerics_plugin.torch.registry import GraphRegistry
from tb_numerics_plugin.torch.segments import Segment
from tb_numerics_plugin.torch.tags import (INPUT_NAME, SERIAL, TAG, TENSOR_ID, inherit_tag, mark,
                                           producer_tag)
from tb_numerics_plugin.torch.trends import Trends

# Looked up once: module attribute lookups add up at ~1000 ops per step.
Tensor = torch.Tensor
_current_autograd_node = torch._C._current_autograd_node
_is_grad_enabled = torch.is_grad_enabled
_DTYPE_ENUM = health.DTYPE_ENUM

_log = logging.getLogger("tb_numerics_plugin.torch")
BACKWARD = "autograd.backward"
EAGER_BATCH = 256  # eager ops encoded (and health fetched) together
_SEQ_MAP_MAX = 200000  # forward autograd nodes remembered for backward attribution

# What the session knows of an op, cached per op: its ``ops.OpInfo`` fields, whether
# ``op_regex`` passes it (traced) and the op itself (keeping its id, the cache key, alive).
OpFacts = collections.namedtuple("OpFacts", OpInfo._fields + ("traced", "func"))

# The per-op hot path in C (``_record.c``): an op inside a module call, an
# optimizer step or a backward pass, or an eager op, recorded as on_op records
# it. ``TB_NUMERICS_RECORD=python``, or a build without a compiler, records
# every op in Python.
RECORD_ENV = "TB_NUMERICS_RECORD"
_C_RECORD_FAILURE = None  # why the built _record could not be set up
try:
    from tb_numerics_plugin.torch import _record as _c_record
except ImportError:
    _c_record = None
else:
    try:
        _c_record.configure(Tensor, _is_grad_enabled, torch._C._autograd._get_sequence_nr,
                            _current_autograd_node, time.time, _DTYPE_ENUM,
                            BACKWARD, _SEQ_MAP_MAX, EAGER_BATCH, OpFacts._fields, vars(tags),
                            _set_eval_frame)
    except Exception as exc:  # a stale build (other fields): record in Python
        _c_record, _C_RECORD_FAILURE = None, "%s: %s" % (type(exc).__name__, exc)


class Session(gate.RecordingGate, steps.StepControl, stop.NonFiniteWatch):
    """Everything one ``enable_dump_debug_info`` call owns.

    Args:
      writer: an open ``FileSetWriter``.
      mode: tensor debug mode name.
      op_regex: compiled regex or None; matched against op types and short names.
      dtype_filter: callable(torch.dtype) -> bool, or None.
      device_task: task number in device names (the distributed rank, else 0).
      include_framework: keep framework frames in stacks.
      health_backend: ``kernels.BACKENDS`` item.
      windows: ``steps.StepWindows`` (trace only those steps) or None (every step).
      stop_on_nonfinite: watch for a propagating inf/NaN (``stop.py``).
      trends: summarize module outputs and gradients every Nth step (``trends.py``); 0: off.
      part: the writer's part (``rank3``) or None; names the series tags.

    Attributes:
      scopes: the ``hooks.Scopes`` (module calls in progress, their hooks).
      encoder: the ``encoder.Encoder`` (the per-mode work on traced values).
      registry: the ``registry.GraphRegistry`` (graph ids, each graph written once).
      stacks: the ``stacks.StackTracker`` (call sites).
      trends: the session's ``trends.Trends``.
    """

    def __init__(self, writer, mode, op_regex=None, dtype_filter=None, device_task=0,
                 include_framework=False, health_backend="auto", windows=None,
                 stop_on_nonfinite=False, trends=0, part=None):
        self.writer = writer
        self.host_name = writer.host_name
        self.encoder = Encoder(mode)
        self._task = device_task
        self.stacks = stacks.StackTracker(writer, include_framework)
        self.registry = GraphRegistry(writer, self.host_name)
        self.scopes = hooks.Scopes(self)
        self._init_gate()
        self._init_steps(windows)
        self._init_watch(stop_on_nonfinite)
        self.trends = Trends(self, part)
        self.configure(op_regex, dtype_filter, include_framework, health_backend, windows,
                       stop_on_nonfinite, trends)
        self.errors = 0
        self._logged = set()
        self._devices = {}  # torch.device -> (device name, device id)
        self._segment = None
        # Tags on tensors outlive the session (they travel with deepcopy and
        # torch.save): a random start keeps another session's serials from
        # ever matching this one's, so such tensors read as outside inputs.
        self._serial = random.getrandbits(48) << 16
        self._next_tensor_id = 0
        self._seq_ops = collections.OrderedDict()  # forward node seq nr -> (op_name, stack ids)
        self.record_op = self.record  # what the dispatch mode calls: this or _record.record
        self.native_entry = None  # _record.native_entry bound to the session, or None
        self._handles = []
        self._mode = None  # mode.CaptureMode or native.NativeHook while active
        self.capture_path = "python"  # or "native": set by each enable (native.choose)
        self.compiled_capture = False  # compiled regions stay compiled (set by start)
        self._compiled_site = ("compiled", ())  # (root scope, call site) of the last compiled call
        self._froze = False  # this session froze the cyclic collector's objects (start)
        self._storage_tags = None  # tags.StorageTags of compiled calls' returned values
        # The dispatch mode only sees the enabling thread; the global hooks
        # ignore other threads so their modules cannot skew this thread's scopes.
        self._thread = threading.get_ident()

    # ---- lifecycle -------------------------------------------------------
    def configure(self, op_regex=None, dtype_filter=None, include_framework=False,
                  health_backend="auto", windows=None, stop_on_nonfinite=False, trends=0):
        """Sets the options of one enable (the constructor's, of the same meaning).

        A stopped session is configured again by a later enable of its dump
        root; graph ids, stack frames, devices and tensor ids carry on.
        """
        self._op_regex = op_regex
        self.stacks.set_include_framework(include_framework)
        self.encoder.configure(dtype_filter, health_backend)
        self._facts = {}  # id(op overload) -> OpFacts
        self._windows = windows
        self.watch_nonfinite = stop_on_nonfinite
        self.trends.configure(trends, health_backend)

    def start(self):
        """Registers the hooks and enters the dispatch mode (in this thread), or, with
        trace windows, waits paused for the first step mark inside one.

        A stopped session starts again (a later enable of the same dump root):
        its writer must have been reopened first.
        """
        self._thread = threading.get_ident()
        recorder = choose_recorder()  # the _record extension, or None
        self.encoder.c_record = recorder
        # Session.record and the native hook's entry in C, with the C recorder
        self.record_op = types.MethodType(recorder.record, self) if recorder else self.record
        self.native_entry = types.MethodType(recorder.native_entry, self) if recorder else None
        # compiled regions keep compiled, with health in their graphs (compiled.py)
        self.compiled_capture = self.encoder.mode in compiled.MODES
        if self.compiled_capture:
            try:
                compiled.install(self)
            except Exception as exc:  # compiled regions then run eagerly
                self.fail("installing the compiled-graph pass", exc)
                self.compiled_capture = False
        self._freeze_collector()
        self.scopes.reset()
        self.writer.on_timer = self.on_timer
        self.trends.start()
        if self._windows is None or self.step in self._windows:
            self._paused = False
            self.gate[0] = True
            self._activate()
        else:
            self._paused = True
            self.gate.clear()

    def stop(self):
        """Leaves the mode, removes every hook, writes the last records and closes the writer.

        The session keeps what a later :meth:`start` into the same file set
        needs (graph ids, stack frames, devices, tensor ids).
        """
        try:
            self.trends.stop()  # first: the capture must not record its last fetch
        except Exception as exc:
            self.fail("trends.step stop", exc)
        if self._mode is not None:
            mode, self._mode = self._mode, None
            try:
                mode.__exit__(None, None, None)
            except Exception as exc:  # e.g. modes exited out of order: still close the dump
                self.fail("leaving the dispatch mode", exc)
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.writer.on_timer = None
        if self.acquire():  # and never given back: nothing records after stop
            try:
                self._switch(None, open_new=False)
            except Exception as exc:
                self.fail("finishing the last execution", exc)
        if self._froze:  # the objects of before the start are collected again
            self._froze = False
            gc.unfreeze()
        if self._storage_tags is not None:
            if tags.stand_in_tag is self._storage_tags:
                tags.stand_in_tag = None
            self._storage_tags = None
        if self.compiled_capture:
            try:
                compiled.uninstall(self)
            except Exception as exc:
                self.fail("removing the compiled-graph pass", exc)
        self._seq_ops.clear()
        self.forget_nonfinite()
        self._stop_reason = None
        try:
            self.writer.close()  # counts write errors itself; anything else is a bug to log
        except Exception as exc:
            self.fail("closing the dump", exc)

    def _freeze_collector(self):
        """Moves the objects that exist now out of the cyclic collector's reach until stop.

        The recording keeps many small containers alive per execution; they
        start CPython's full collections, each of which walks every object of
        the process (hundreds of thousands with torch and a model loaded):
        ~20% of the captured encoder step in docs/benchmarks.md. Frozen, the
        objects of before the start are not walked (nor collected) until stop.
        Left alone when the program froze objects itself or runs without the
        collector.
        """
        if self._froze or not gc.isenabled() or gc.get_freeze_count():
            return
        gc.freeze()
        self._froze = True
        _log.info("tb-numerics: froze %d objects for the cyclic collector while capturing",
                  gc.get_freeze_count())

    def _register_hooks(self):
        """Registers the global hooks of :attr:`scopes`; returns their handles."""
        return self.scopes.register()

    def flush(self):
        """Writes what is recorded so far to disk.

        The open execution is finished first unless a signal interrupted the
        recording of an op: then only the executions already finished are written.
        """
        if self.writer.closed:
            return
        if self.acquire():
            try:
                self._switch(None, open_new=False)
            except Exception as exc:
                self.fail("flush", exc)
            finally:
                self.release()
        self.writer.flush()

    def fail(self, where, exc):
        """Counts an internal error and logs each kind once."""
        self.errors += 1
        key = (where.split(" ")[0], type(exc).__name__)
        if key not in self._logged:
            self._logged.add(key)
            _log.warning("tb-numerics capture error in %s (recording continues, the step "
                         "is unaffected): %r", where, exc, exc_info=exc)

    # ---- segments --------------------------------------------------------
    def _switch(self, name, stack_ids=(), open_new=True):
        segment = self._segment
        self._segment = None
        if segment is not None:
            segment.finish(self.encoder.fetch_rows())
        if open_new:
            self._serial += 1
            self._segment = Segment(self, self._serial, name, stack_ids)
        return self._segment

    def _segment_for_op(self, node):
        seg = self._segment
        scopes = self.scopes
        if scopes.depth > 0 or scopes.in_optimizer:
            return seg if seg is not None else self._switch("eager.module")
        if node is not None:
            if seg is None or seg.name != BACKWARD:
                seg = self._switch(BACKWARD)
                if self.watch_nonfinite:
                    self.check_loss(node)
            return seg
        if seg is None or seg.is_graph or len(seg.eager) >= EAGER_BATCH:
            seg = self._switch(None)
        return seg

    def open_for_op(self):
        """Opens the segment the op being recorded belongs to, as :meth:`on_op` does
        first (the C recorder found none open for it: ``_record_scope.c``)."""
        scopes = self.scopes
        in_module = scopes.depth > 0 or scopes.in_optimizer
        self._segment_for_op(None if in_module else _current_autograd_node())

    # ---- ops -------------------------------------------------------------
    def record(self, func, args, kwargs, out):
        """Records one op that ran, in Python, as the per-op hook (``mode.CaptureMode``
        or ``native.NativeHook``) hands it over: under the recording token, and an
        ``Exception`` of the recording is counted, never raised. With the C recorder
        the hooks call its twins instead: ``_record.record`` (``record_op``) and
        ``_record.native_entry``."""
        gate = self.gate
        # the token (acquire, inlined for the common case)
        if gate.pop(0, None) is not None or self.acquire():
            try:
                self.on_op(func, args, kwargs, out)
            except Exception as exc:  # never break the user's step
                self.fail("op %s" % func, exc)
            finally:
                gate[0] = True

    def on_op(self, func, args, kwargs, out):
        """Records one op (called by the mode after the op ran)."""
        # keyed by id: OpOverload.__hash__ is Python code; the value keeps func (and its id) alive
        facts = self._facts.get(id(func))
        if facts is None:
            facts = self._analyze(func)
        if facts.skip:
            if facts.alias:
                inherit_tag(args, out)
            return
        scopes = self.scopes
        in_module = scopes.depth > 0 or scopes.in_optimizer
        # The node autograd is evaluating, if any: the op belongs to backward.
        node = None if in_module else _current_autograd_node()
        seg = self._segment
        if seg is None or not in_module:
            seg = self._segment_for_op(node)
        if isinstance(out, Tensor):
            outputs = (out,)
        else:
            outputs = outputs_of(facts.writes, args, out)
        if seg.name == BACKWARD:
            fwd = self._seq_ops.get(node._sequence_nr()) if node is not None else None
            scope = "backward/" + fwd[0] if fwd else "backward"
            stack_ids = fwd[1] if fwd else ()
            op_name = seg.op_name(scope, facts.short)
        else:
            scope = scopes.stack[-1] if scopes.depth > 0 else (
                seg.name if scopes.in_optimizer else "eager")
            stack_ids = self.stacks.call_site(1)  # the capture's own frames are not the user's
            op_name = seg.op_name(scope, facts.short)
            if _is_grad_enabled():
                self._remember_forward(op_name, stack_ids, self._next_tensor_id)
        if seg.is_graph:
            self._record_graph_op(seg, facts.op_type, op_name, args, kwargs, outputs, stack_ids,
                                  facts.traced)
        else:
            self._record_eager_op(seg, facts.op_type, op_name, args, kwargs, outputs, stack_ids,
                                  facts.traced)

    def _analyze(self, func):
        """Caches and returns the op's ``OpFacts``."""
        info = analyze_op(func)
        rx = self._op_regex
        traced = rx is None or bool(rx.match(info.op_type) or rx.match(info.short))
        facts = self._facts[id(func)] = OpFacts(*info, traced, func)
        return facts

    def _record_graph_op(self, seg, op_type, op_name, args, kwargs, outputs, stack_ids, traced):
        serial = seg.serial
        names = []
        for t in tensors_in(args, kwargs):
            tag = getattr(t, TAG, None)
            # fast path: a tensor made earlier in this segment, read directly (not through a view)
            if tag is not None and tag[SERIAL] == serial and not t._is_view():
                names.append(tag[INPUT_NAME])
            else:
                names.append(seg.input_name(t))
        if not outputs:
            seg.ops.append((op_type, op_name, tuple(names), 0, stack_ids, "", ()))
            return
        device = outputs[0].device
        device_name = self.device(device)[0]
        dtypes = tuple([_DTYPE_ENUM.get(t.dtype, 0) for t in outputs])
        seg.ops.append((op_type, op_name, tuple(names), len(outputs), stack_ids, device_name,
                        dtypes))
        wall = time.time()
        enc = self.encoder
        for slot, t in enumerate(outputs):
            tensor_id = self._next_tensor_id
            self._next_tensor_id = tensor_id + 1
            # tags.mark, inlined (the per-output hot path)
            tag = (serial, op_name, slot, t._version, tensor_id, f"{op_name}:{slot}")
            setattr(t, TAG, tag)
            if t._is_view():  # an op that wrote through a view wrote its base too
                setattr(t._base, TAG, tag)
            if not traced:
                continue
            dtype = t.dtype
            ok = enc.dtype_ok.get(dtype)
            if (ok if ok is not None else enc.dtype_traced(dtype)):
                if slot:  # outputs of one op share a device but for rare ops (to/copy across devices)
                    device = t.device
                    device_name = self.device(device)[0]
                payload, meta = enc.payload(t, device) if enc.graph_values else (None, None)
                seg.traces.append((op_name, slot, tensor_id, payload, meta, device_name, wall))

    def _record_eager_op(self, seg, op_type, op_name, args, kwargs, outputs, stack_ids, traced):
        in_ids = []
        for t in tensors_in(args, kwargs):
            tag = producer_tag(t)
            in_ids.append(tag[TENSOR_ID] if tag is not None else -1)
        out_ids, outs, dtypes = [], [], []
        serial, enc = seg.serial, self.encoder
        for slot, t in enumerate(outputs):
            tensor_id = self._next_tensor_id
            self._next_tensor_id += 1
            mark(t, serial, op_name, slot, tensor_id)
            out_ids.append(tensor_id)
            dtypes.append(_DTYPE_ENUM.get(t.dtype, 0))
            if traced and enc.dtype_traced(t.dtype):
                payload, meta = enc.payload(t, t.device)
                outs.append((payload, meta, self.device(t.device)[1], tensor_id))
        if traced:
            seg.eager.append((op_type, in_ids, out_ids, outs, stack_ids, time.time(), dtypes))

    # ---- compiled regions (compiled.py) ------------------------------------------
    def compiled_traced(self, op_type):
        """Whether ``op_regex`` passes a compiled graph's op (asked when it compiles)."""
        rx = self._op_regex
        return rx is None or bool(rx.match(op_type))

    def on_compiled(self, graph, rows, values=(), inputs=()):
        """Records the ops of one compiled call (``compiled.emit``, after its kernels ran)
        under the recording token; an ``Exception`` is counted, never raised.

        Args:
          graph: the call's ``compiled.CompiledGraph`` (None: not one of this process's).
          rows: its raw health rows, ``[n, 12]`` on the graph's device.
          values: the tensors the call returns (a backward's gradients), in
            ``graph.returned`` order; they are tagged as their ops' outputs.
          inputs: the tensors a forward call's ops read, in ``graph.placeholders`` order;
            their tags give the execution's input tensor ids.
        """
        if graph is None or threading.get_ident() != self._thread:
            return
        gate = self.gate
        if gate.pop(0, None) is not None or self.acquire():
            try:
                self._record_compiled(graph, rows, values, inputs)
            except Exception as exc:  # never break the user's step
                self.fail("compiled graph", exc)
            finally:
                gate[0] = True
            self.raise_pending_stop()  # (stop_on_nonfinite: a compiled call's own output)

    def _record_compiled(self, graph, rows, values, read):
        scopes = self.scopes
        seg = self._segment
        prefix, base, own = "", None, False  # ops are named prefix + base.path, or the root's name
        optimizer = None  # the optimizer of a compiled step
        if graph.backward:  # named after the forward's module paths, at the forward's call site
            root, outer = self._compiled_site
            if seg is None or seg.name != BACKWARD:
                seg = self._switch(BACKWARD)
            prefix = "backward/"
        else:
            outer = self._compiled_call_site(graph)
            if scopes.depth > 0 and seg is not None and seg.is_graph and seg.name != BACKWARD:
                base = scopes.stack[-1] if scopes.depth > 1 else None
                root = scopes.stack[0]
            elif scopes.in_optimizer and seg is not None and seg.is_graph:
                root = seg.name  # a compiled part of an eager optimizer step
            else:  # compiled in place (model.compile()), an optimizer step or a function:
                name, root, optimizer = self._compiled_execution(sys._getframe(2))
                seg = self._switch(name, outer)
                own = True
            self._compiled_site = (root, outer)
        wall = time.time()
        enc = self.encoder
        block = enc.batch.add_rows(rows) if enc.kernel_mode and rows.shape[0] else None
        device_name = self.device(rows.device)[0]
        stack_ids = graph.stack_ids.get((id(self), outer))
        if stack_ids is None:
            frame_ids = self.stacks.frame_ids
            stack_ids = graph.stack_ids[(id(self), outer)] = [
                outer + frame_ids(op.frames) for op in graph.ops]
        producers = {}  # placeholder name -> tensor id of the input's producer
        for name, t in zip(graph.placeholders, read):
            tag = producer_tag(t)
            if tag is not None:
                producers[name] = tag[TENSOR_ID]
        names, ids = [], []
        for i, op in enumerate(graph.ops):
            path = op.path
            scope = prefix + ((base + "." + path if path else base) if base else (path or root))
            op_name = seg.op_name(scope, op.short)
            names.append(op_name)
            inputs = tuple(
                "%s:%d" % (names[j], slot or 0) if j is not None
                else seg.named_input(slot, graph.placeholders.get(slot, 0),
                                     producers.get(slot, -1))
                for j, slot in op.inputs)
            seg.ops.append((op.op_type, op_name, inputs, len(op.metas), stack_ids[i],
                            device_name, op.dtypes))
            op_ids = []
            for slot, row in enumerate(op.rows):
                if row is None:
                    op_ids.append(None)
                    continue
                tensor_id = self._next_tensor_id
                self._next_tensor_id = tensor_id + 1
                op_ids.append(tensor_id)
                payload = (block, row) if block is not None else None
                seg.traces.append((op_name, slot, tensor_id, payload, op.metas[slot],
                                   device_name, wall))
            ids.append(op_ids)
        for k, (j, slot) in enumerate(graph.returned):  # what the call returned
            tensor_id = ids[j][slot or 0]
            if tensor_id is not None:
                if not graph.backward:  # model outputs (a backward's gradients are not)
                    seg.output_ids.append(tensor_id)
                if k < len(values):  # tagged: later ops name it as its producer's output
                    self._mark_returned(values[k], seg.serial, names[j], slot or 0, tensor_id)
        if own:  # no root module call to end it: the compiled call was the whole execution
            self._switch(None, open_new=False)
            if self.watch_nonfinite:
                self.check_root_outputs(seg)
                if optimizer is not None:  # its pre-hook did not run: the step has run
                    self.check_optimizer(optimizer, grads=True)

    @staticmethod
    def _compiled_execution(frame):
        """``(execution name, root scope of its ops, optimizer or None)`` of a compiled call
        that no open execution holds: ``<Class>.forward`` for a model compiled in place,
        ``<Optimizer>.step`` for a compiled optimizer step (its hooks do not run: Dynamo
        traced them), else ``compiled.call``."""
        module = compiled.calling_module(frame)
        if module is not None:
            root = hooks.root_name(module)
            return root + ".forward", root, None
        optimizer = compiled.calling_optimizer(frame)
        if optimizer is not None:
            name = type(optimizer).__name__ + ".step"
            return name, name, optimizer
        return "compiled.call", "compiled", None

    def _mark_returned(self, t, serial, op_name, slot, tensor_id):
        """Tags a value a compiled call returned, and remembers the tag for its memory."""
        tag = mark(t, serial, op_name, slot, tensor_id)
        remember = getattr(self._mode, "remember", None)
        if remember is not None:  # the native hook's lookup by memory
            remember(t)
            return
        by_memory = self._storage_tags
        if by_memory is None:  # the first one: untagged tensors are looked up from now on
            by_memory = self._storage_tags = tags.StorageTags()
            tags.stand_in_tag = by_memory
        by_memory.remember(t, tag)

    def _compiled_call_site(self, graph):
        """The frame ids of the user frames around a compiled call, outermost first;
        the compiled frame itself is left out when the graph's own lines begin with it."""
        stacks = self.stacks
        frame = stacks.user_frame(4)
        first = next((op.frames[0] for op in graph.ops if op.frames), None)
        if frame is not None and first is not None and frame.f_code.co_name == first[2] and (
                os.path.realpath(frame.f_code.co_filename) == os.path.realpath(first[0])):
            frame = frame.f_back
            while frame is not None and not stacks._user_code(frame.f_code):
                frame = frame.f_back
        return stacks.frame_site(frame)

    # ---- backward attribution ------------------------------------------------
    def _remember_forward(self, op_name, stack_ids, first_tensor_id):
        # Inside __torch_dispatch__ the op's autograd node already exists and
        # the thread's sequence counter has moved one past it. The op's first
        # output will get the next tensor id (the loss check of stop.py).
        seq = torch._C._autograd._get_sequence_nr() - 1
        seq_ops = self._seq_ops
        if seq not in seq_ops:
            seq_ops[seq] = (op_name, stack_ids, first_tensor_id)
            if len(seq_ops) > _SEQ_MAP_MAX:
                seq_ops.popitem(last=False)

    # ---- devices, names --------------------------------------------------------
    def device(self, device):
        """Returns ``(device name, DebuggedDevice id)``, writing the device record once."""
        known = self._devices.get(device)
        if known is None:
            kind = "CPU" if device.type == "cpu" else "GPU" if device.type == "cuda" else device.type.upper()
            name = "/job:localhost/replica:0/task:%d/device:%s:%d" % (self._task, kind, device.index or 0)
            known = self._devices[device] = (name, len(self._devices))
            event = debug_event_pb2.DebugEvent()
            event.debugged_device.device_name = name
            event.debugged_device.device_id = known[1]
            self.writer.write_event(event)
        return known


def choose_recorder():
    """The ``_record`` extension when ``TB_NUMERICS_RECORD`` allows it and it was built, else
    None (every op recorded in Python); logs the choice once.

    Raises:
      ValueError: a ``TB_NUMERICS_RECORD`` other than ``c`` or ``python``.
    """
    wanted = os.environ.get(RECORD_ENV, "").strip().lower() or "c"
    if wanted not in ("c", "python"):
        raise ValueError("%s must be c or python, not %r" % (RECORD_ENV, os.environ[RECORD_ENV]))
    if wanted == "python":
        choice, why = None, "%s=python" % RECORD_ENV
    elif _c_record is None:
        choice, why = None, _C_RECORD_FAILURE or "tb_numerics_plugin.torch._record was not built"
    else:
        choice, why = _c_record, "C (_record.c)"
    if why not in _RECORDERS_LOGGED:
        _RECORDERS_LOGGED.add(why)
        _log.info("tb-numerics: ops are recorded in %s",
                  "C" if choice is not None else "Python (%s)" % why)
    return choice


_RECORDERS_LOGGED = set()


def compile_op_regex(op_regex):
    """Compiles ``op_regex`` (None passes every op).

    Raises:
      ValueError: not a valid regular expression.
    """
    if op_regex is None:
        return None
    try:
        return re.compile(op_regex)
    except re.error as exc:
        raise ValueError("invalid op_regex %r: %s" % (op_regex, exc)) from exc

