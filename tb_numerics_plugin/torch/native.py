"""The native per-op path: a C++ dispatcher hook in place of the dispatch mode.

The Python path (``mode.CaptureMode``) boxes every argument of every op to
Python and back through a ``TorchDispatchMode``, about 4-7 µs per op before
any recording happens. The native path (``_native.cpp``) is a boxed fallback
on a mode dispatch key that the capture adds to the thread's keys, so that
every op reaches it before autograd and the kernels (``RecordFunction``
callbacks until 2026-12-05): views and other ops the capture skips never leave
C++, and only the
ops it records cross into Python, once, after they ran, to the recording the
dispatch mode calls (``_record.native_entry``, the C twin of
``Session.record``, when ops are recorded in C). The records are the same; the op
sequence can differ where torch's composite ops branch on the presence of a
dispatch mode (``Linear`` adds its bias with ``add_`` natively, ``add``
under a mode) and in the ``detach`` calls a mode sees autograd make.

The extension is compiled against the installed torch on first use, about a
minute on two cores, and imported from a cache afterwards (``native_build``;
``tb-numerics build-native`` does it ahead of time). ``TB_NUMERICS_CAPTURE``
chooses the path: ``native`` (the default; the dispatch mode again, with a
warning saying why, when the hook cannot be built) or ``python``. The choice
is logged.

The default since 2026-12-05: per op in a tight loop the native capture
costs about a third of the dispatch mode's host time, and whole steps less
(docs/benchmarks.md, "The native hook as the default path").

``torch.compile``d code stays compiled under the hook, as under the dispatch
mode (``compiled/``): the ops its generated code calls (extern kernels,
health rows, emits) are passed over (``compiled.frames.called_from_compiled``), and
nothing is recorded while torch.compile compiles (Dynamo's compile start and
end callbacks), since a compiler runs ops on real tensors too. Under
FULL_TENSOR, which no compiled graph serves, compiled code runs eagerly
(Dynamo's ``force_eager`` stance), every op seen.
"""

import logging
import os
import threading

import torch
from torch._C._dynamo.eval_frame import set_eval_frame as _set_eval_frame

from tb_numerics_plugin.torch import native_build, ops, recorder, tags
from tb_numerics_plugin.torch.compiled import custom_ops, frames

_log = logging.getLogger("tb_numerics_plugin.torch")
ENV = "TB_NUMERICS_CAPTURE"
PATHS = ("python", "native")
DEFAULT_PATH = "native"

# verdicts of _native.cpp
TRANSPARENT, SILENT, RECORD, ALIAS = 0, 1, 2, 3


class _State:
    lock = threading.Lock()
    module = None
    failure = None  # why the extension could not be built or loaded
    logged = set()


def requested_path():
    """The path ``TB_NUMERICS_CAPTURE`` asks for.

    Raises:
      ValueError: a value outside ``PATHS``.
    """
    value = os.environ.get(ENV, "").strip().lower() or DEFAULT_PATH
    if value not in PATHS:
        raise ValueError("%s must be one of %s, not %r" % (ENV, ", ".join(PATHS),
                                                           os.environ.get(ENV)))
    return value


def load(retry=False):
    """The native extension, built on first use; None when it cannot be (see :func:`failure`).

    Args:
      retry: build again where an earlier build failed (``tb-numerics build-native``); else
        that failure is reported without building (``native_build.build``).
    """
    with _State.lock:
        if _State.module is None and _State.failure is None:
            try:
                module = native_build.build(retry)
                module.register_hook()  # raises where another library holds its key
                _pass_higher_order_ops_over(module.HOOK_KEY)
                _State.module = module
            except Exception as exc:  # no compiler, no ninja, a torch without headers...
                _State.failure = "%s: %s" % (type(exc).__name__, str(exc).strip()[:2000])
            else:  # the C recorder reads tensors' layouts through the hook from now on
                recorder.use_native_facts(_State.module.TENSOR_FACTS, _State.module.stand_in_tag)
        return _State.module


def _pass_higher_order_ops_over(key_number):
    """Higher-order operators (``with_effects``, ``cond``...) dispatch in Python, by the
    thread's dispatch keys, and have no kernel for the hook's key: each one, now and
    later made, falls through it as through ``PythonTLSSnapshot``."""
    from torch import _ops

    key = torch._C.DispatchKey(key_number)
    if key not in _ops._HIGHER_ORDER_OP_DEFAULT_FALLTHROUGH_DISPATCH_KEYS:
        _ops._HIGHER_ORDER_OP_DEFAULT_FALLTHROUGH_DISPATCH_KEYS.append(key)
    for op in list(_ops._higher_order_ops.values()):
        op.fallthrough(key)


def failure():
    """Why :func:`load` found no extension (None when it did or was not tried)."""
    return _State.failure


def choose():
    """The per-op path an enable gets now: ``"native"`` or ``"python"``; logs the choice.

    Raises:
      ValueError: a bad ``TB_NUMERICS_CAPTURE``.
    """
    wanted = requested_path()
    if wanted == "python":
        path, why = "python", "the dispatch mode"
    elif load() is not None:
        path, why = "native", "C++ dispatch-key hook"
    else:
        path, why = "python", "the native hook is unavailable (%s)" % failure()
    if (path, why) not in _State.logged:
        _State.logged.add((path, why))
        level = logging.WARNING if path != wanted else logging.INFO
        _log.log(level, "tb-numerics: per-op capture path: %s (%s)", path, why)
    return path


def judge(qualified, overload):
    """The native hook's verdict on an op, asked once per op: ``(verdict, OpOverload)``.

    Decompositions (``CompositeImplicitAutograd`` kernels) are transparent: the
    ops they call are the ones a dispatch mode sees. Ops the capture skips
    without reading them (views, metadata, ``analyze_op``) stay in C++, and so
    do alias ops (``detach``, ``_unsafe_view``), whose outputs the hook gives
    their inputs' tags (``tags.producer_tag`` asks ``stand_in_tag``).
    """
    try:
        namespace, _, name = qualified.partition("::")
        func = getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
        full = qualified + ("." + overload if overload else "")
        if torch._C._dispatch_has_kernel_for_dispatch_key(full, "CompositeImplicitAutograd"):
            return TRANSPARENT, func
        info = ops.analyze_op(func)
    except Exception:  # an op Python cannot name: not one the capture can record
        return TRANSPARENT, None
    if info.alias:
        return ALIAS, func
    return (SILENT if info.skip else RECORD), func


def _carrier_of(exc):
    """A class that raises ``exc`` again when raised without arguments: ``exc`` is a
    KeyboardInterrupt or SystemExit a signal handler raised while an op was being
    recorded, which the hook raises again as the interpreter's asynchronous
    exception (that takes a class); a ``SystemExit`` keeps its code."""
    cls = type(exc)
    if getattr(cls, "_tbn_carrier", False):
        return cls
    args = exc.args
    return type(cls.__name__, (cls,), {
        "__init__": lambda self: cls.__init__(self, *args), "__module__": cls.__module__,
        "_tbn_carrier": True})


def _entry_for(session):
    """The hook's entry: the session's ``native_entry`` (``_record.c``) with the C
    recorder, else the Python function below."""
    if session.native_entry is not None:
        return session.native_entry
    record = session.record

    def native_entry(func, args, out):
        # Dynamo must not trace the recording (as in mode.CaptureMode.__torch_dispatch__).
        # A KeyboardInterrupt from a signal handler leaves here; the hook raises it later.
        prior = _set_eval_frame(None)
        try:
            record(func, args, None, out)
        finally:
            _set_eval_frame(prior)

    return native_entry


def installed():
    """True while a native hook is installed (in this process)."""
    module = _State.module
    return module is not None and module.installed()


class NativeHook:
    """The native hook of one session, used like ``mode.CaptureMode`` (enter, exit).

    Args:
      session: the ``capture.Session`` whose ``on_op`` records the ops.
    """

    def __init__(self, session):
        self._session = session
        self._module = load()
        if self._module is None:
            raise RuntimeError("the native capture hook is unavailable: %s" % failure())
        self._handle = None
        self._stance = None
        self._watch = None  # torch.compile's (start, end) callbacks while registered

    def __enter__(self):
        from torch._dynamo import decorators, eval_frame

        session = self._session
        entry = _entry_for(session)
        if entry is not session.native_entry:  # a C function needs no skipping
            decorators.skip(entry)
        if session.compiled_capture:  # compiled regions keep compiled (compiled/)
            try:
                self._watch = _watch_compiles(self._module)
            except Exception as exc:  # then they run eagerly
                session.fail("watching torch.compile's compilations", exc)
        if self._watch is not None:
            from_compiled, graphs = frames.called_from_compiled, custom_ops.instrumented
        else:  # compiled regions run eagerly, every op seen
            from_compiled = graphs = None
            try:
                self._stance = eval_frame._set_stance(eval_frame.DynamoStance("force_eager"))
            except Exception as exc:
                session.fail("setting Dynamo's force_eager stance", exc)
        tags.stand_in_tag = self._module.stand_in_tag
        self._handle = self._module.install(entry, judge, _carrier_of, from_compiled, graphs)
        return self

    def remember(self, t):
        """Notes the tag of ``t`` (a value a compiled call returned) for the memory it
        covers, where :func:`tags.stand_in_tag` looks for untagged tensors."""
        self._module.remember(t)

    def __exit__(self, *exc_info):
        if self._watch is not None:
            watch, self._watch = self._watch, None
            _unwatch_compiles(watch)
        if self._handle is not None:
            handle, self._handle = self._handle, None
            self._module.uninstall(handle)
            tags.stand_in_tag = None
        if self._stance is not None:
            from torch._dynamo import eval_frame

            stance, self._stance = self._stance, None
            eval_frame._set_stance(stance)
        return False


def _forget_in_child():
    # A forked child (a DataLoader worker) inherits the hook's key on the forking
    # thread but not the capture's writer, and its copy of the recording token stays
    # taken (gate.py): the hook is taken off there, so that the child's ops go below
    # its key untouched instead of each crossing into Python to find the token gone.
    module = _State.module
    if module is not None and module.installed():
        module.uninstall(False)
        tags.stand_in_tag = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _watch_compiles(module):
    """Registers torch.compile's start and end callbacks (Dynamo's frames and the lazy
    backward compile), during which the hook records nothing; returns them."""
    from torch._dynamo import callback_handler

    def started(_):
        module.compile_started()

    def ended(_):
        module.compile_ended()

    callback_handler.register_start_callback(started)
    callback_handler.register_end_callback(ended)
    return started, ended


def _unwatch_compiles(watch):
    from torch._dynamo import callback_handler

    for remove, callback in zip((callback_handler.remove_start_callback,
                                 callback_handler.remove_end_callback), watch):
        try:
            remove(callback)
        except ValueError:  # torch._dynamo.reset() cleared it already
            pass
