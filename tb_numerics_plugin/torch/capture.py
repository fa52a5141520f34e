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
compiled call (``compiled.record.CompiledCalls``, the session's part). Any failure
inside the recording is logged once, counted and swallowed: the user's step
never breaks.

The writer's flush thread also reaches in, to write an execution a stalled
program left open (``gate.py``).
"""

import gc
import logging
import random
import re
import threading
import types

import torch

from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.torch import compiled, gate, hooks, stacks, steps, stop
from tb_numerics_plugin.torch.compiled.record import CompiledCalls
from tb_numerics_plugin.torch.encoder import Encoder
from tb_numerics_plugin.torch.ops import analyze_op, outputs_of
from tb_numerics_plugin.torch.recorder import (EAGER_BATCH, OpFacts, choose_recorder,
                                               forward_ops, record_eager_op, record_graph_op)
from tb_numerics_plugin.torch.registry import GraphRegistry
from tb_numerics_plugin.torch.segments import BACKWARD, Segment, SessionSwitch, producer_ids
from tb_numerics_plugin.torch.state import c_base
from tb_numerics_plugin.torch.tags import Ids, inherit_tag
from tb_numerics_plugin.torch.trends import Trends

# Looked up once: module attribute lookups add up at ~1000 ops per step.
Tensor = torch.Tensor
_current_autograd_node = torch._C._current_autograd_node
_is_grad_enabled = torch.is_grad_enabled
_log = logging.getLogger("tb_numerics_plugin.torch")


# (_segment: a field of the C base, which the C recording reads)
class Session(gate.RecordingGate, steps.StepControl, stop.NonFiniteWatch,
              c_base("SessionState", SessionSwitch)):
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
      call_site, producer_ids: the hooks' ``stacks.call_site`` and ``segments.producer_ids``,
        or with the C recorder their twins ``_record.call_site`` and ``producer_ids``.
      trends: the session's ``trends.Trends``.
      compiled_calls: the ``compiled.record.CompiledCalls`` (compiled calls recorded).
      op_regex: the enable's ``op_regex`` (compiled), or None.
      segment_class: what :meth:`switch` makes (``segments.Segment``).

    ``switch(name, stack_ids=(), open_new=True)`` (the C base's, ``_record_segment.c``)
    finishes the open segment and, with ``open_new``, opens the next of that name
    (None: a run of eager ops); it returns the open segment.
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
        self.segment_class = Segment  # what switch makes
        # Tags on tensors outlive the session (they travel with deepcopy and
        # torch.save): a random start keeps another session's serials from
        # ever matching this one's, so such tensors read as outside inputs.
        self._serial = random.getrandbits(48) << 16
        self.tensor_ids = Ids()  # read and counted on by the C recording too
        # forward node seq nr -> (op_name, stack ids, first tensor id); the C recording's too
        self._seq_ops = forward_ops()
        self.record_op = self.record  # what the dispatch mode calls: this or _record.record
        self.native_entry = None  # _record.native_entry bound to the session, or None
        self.call_site, self.producer_ids = self.stacks.call_site, producer_ids  # (start)
        self._handles = []
        self._mode = None  # mode.CaptureMode or native.NativeHook while active
        self.capture_path = "python"  # or "native": set by each enable (native.choose)
        self.compiled_capture = False  # compiled regions stay compiled (set by start)
        self.compiled_calls = CompiledCalls(self)  # records compiled calls (compiled/record.py)
        self._froze = False  # this session froze the cyclic collector's objects (start)
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
        self.op_regex = op_regex
        self.stacks.set_include_framework(include_framework)
        self.encoder.configure(dtype_filter, health_backend)
        self._facts = {}  # id(op overload) -> OpFacts
        self._windows = windows
        self.watch_nonfinite = bool(stop_on_nonfinite)
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
        self.call_site = (types.MethodType(recorder.call_site, self) if recorder
                          else self.stacks.call_site)
        self.producer_ids = recorder.producer_ids if recorder else producer_ids
        # compiled regions keep compiled, with health in their graphs (compiled/)
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
            self.gate.give()
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
                self.switch(None, open_new=False)
            except Exception as exc:
                self.fail("finishing the last execution", exc)
        if self._froze:  # the objects of before the start are collected again
            self._froze = False
            gc.unfreeze()
        self.compiled_calls.stop()
        if self.compiled_capture:
            try:
                compiled.uninstall(self)
            except Exception as exc:
                self.fail("removing the compiled-graph pass", exc)
        self._seq_ops.clear()
        if self.encoder.c_record is not None:  # its attributes read once, and itself
            self.encoder.c_record.unbind(self)
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
                self.switch(None, open_new=False)
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
    def _segment_for_op(self, node):
        seg = self._segment
        scopes = self.scopes
        if scopes.depth > 0 or scopes.in_optimizer:
            return seg if seg is not None else self.switch("eager.module")
        if node is not None:
            if seg is None or seg.name != BACKWARD:
                seg = self.switch(BACKWARD)
                if self.watch_nonfinite:
                    self.check_loss(node)
            return seg
        if seg is None or seg.is_graph or len(seg.eager) >= EAGER_BATCH:
            seg = self.switch(None)
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
        if gate.take() or self.acquire():
            try:
                self.on_op(func, args, kwargs, out)
            except Exception as exc:  # never break the user's step
                self.fail("op %s" % func, exc)
            finally:
                gate.give()

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
                self._remember_forward(op_name, stack_ids, self.tensor_ids.peek())
        if seg.is_graph:
            record_graph_op(self, seg, facts.op_type, op_name, args, kwargs, outputs, stack_ids,
                            facts.traced)
        else:
            record_eager_op(self, seg, facts.op_type, op_name, args, kwargs, outputs, stack_ids,
                            facts.traced)

    def _analyze(self, func):
        """Caches and returns the op's ``OpFacts``."""
        info = analyze_op(func)
        rx = self.op_regex
        traced = rx is None or bool(rx.match(info.op_type) or rx.match(info.short))
        facts = self._facts[id(func)] = OpFacts(*info, traced, func)
        return facts

    # ---- backward attribution ------------------------------------------------
    def _remember_forward(self, op_name, stack_ids, first_tensor_id):
        # Inside __torch_dispatch__ the op's autograd node already exists and
        # the thread's sequence counter has moved one past it. The op's first
        # output will get the next tensor id (the loss check of stop.py).
        seq = torch._C._autograd._get_sequence_nr() - 1
        self._seq_ops.remember(seq, op_name, stack_ids, first_tensor_id)

    # ---- devices, names --------------------------------------------------------
    def device(self, device):
        """Returns ``(device name, DebuggedDevice id)``, writing the device record once."""
        known = self._devices.get(device)
        if known is None:
            kind = {"cpu": "CPU", "cuda": "GPU"}.get(device.type) or device.type.upper()
            name = "/job:localhost/replica:0/task:%d/device:%s:%d" % (
                self._task, kind, device.index or 0)
            known = self._devices[device] = (name, len(self._devices))
            event = debug_event_pb2.DebugEvent()
            event.debugged_device.device_name = name
            event.debugged_device.device_id = known[1]
            self.writer.write_event(event)
        return known


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

