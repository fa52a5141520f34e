"""PyTorch capture: TensorFlow's ``enable_dump_debug_info`` API for torch programs.

    from tb_numerics_plugin import torch as tbn
    with tbn.enable_dump_debug_info("/tmp/dump", tensor_debug_mode="FULL_HEALTH"):
        train()

writes a tfdbg2 dump (readable by ``tb-numerics report``, the TensorBoard
plugin and TensorFlow's own ``DebugDataReader``). How torch maps onto tfdbg2
concepts is in ``docs/format.md`` ("PyTorch capture mapping").
"""

import atexit
import logging
import os
import threading
import uuid

import torch

from tb_numerics_plugin import series
from tb_numerics_plugin.torch import capture, health, kernels, native, signals, steps
from tb_numerics_plugin.torch.stop import NonFiniteError
from tb_numerics_plugin.writer import FileSetWriter

__all__ = ["enable_dump_debug_info", "disable_dump_debug_info", "DumpHandle", "NonFiniteError"]

TENSOR_DEBUG_MODES = health.MODES
_log = logging.getLogger("tb_numerics_plugin.torch")
_WARNED_NO_C_KERNEL = []  # the no-C-kernel warning is said once per process


class DumpHandle:
    """An active capture. Also a context manager that disables it on exit.

    Attributes:
      dump_root, tensor_debug_mode, circular_buffer_size, trace_steps,
      stop_on_nonfinite, trends: as passed.
      capture_path: ``"native"`` (the C++ per-op hook) or ``"python"`` (the
        dispatch mode): see ``native.py`` and ``TB_NUMERICS_CAPTURE``.
    """

    def __init__(self, session, dump_root, tensor_debug_mode, circular_buffer_size, key):
        self._session = session
        self.dump_root = dump_root
        self.tensor_debug_mode = tensor_debug_mode
        self.circular_buffer_size = circular_buffer_size
        self._key = key
        self._signals = signals.SignalFlusher(self.flush)
        self.closed = False
        self.trace_steps = None
        self.stop_on_nonfinite = False
        self.trends = False
        self.capture_path = "python"

    @property
    def current_step(self):
        """The step of the last :meth:`step` mark (int), or None before the first."""
        return self._session.step

    def step(self, step=None):
        """Marks the start of a training step; every record from now on carries it.

        Call it at the top of each step, in the thread that enabled the capture.
        It finishes the open execution, opens or closes a ``trace_steps``
        window, and raises a pending ``stop_on_nonfinite`` stop.

        Args:
          step: the step number (a non-negative int); None: the last one plus
            one (0 at the first mark).

        Returns:
          int: the step now current.

        Raises:
          ValueError: ``step`` is not a non-negative int or None.
          NonFiniteError: ``stop_on_nonfinite`` found a propagating inf/NaN in
            the previous step.
        """
        if step is None:
            current = self._session.step
            step = 0 if current is None else current + 1
        else:
            step = steps.check_step(step)
        if not self.closed:
            self._session.mark_step(step)
        return step

    @property
    def errors(self):
        """Internal capture errors swallowed so far (each kind is logged once)."""
        return self._session.errors

    @property
    def file_prefix(self):
        """Path prefix of this process's file set."""
        return self._session.writer.prefix

    def flush(self):
        """Writes everything recorded so far to disk."""
        if not self.closed:
            self._session.flush()

    def close(self):
        """Stops capturing and closes the dump. Later calls do nothing."""
        if self.closed:
            return
        self.closed = True
        with _ACTIVE.lock:
            if _ACTIVE.handle is self:
                _ACTIVE.handle = None
        atexit.unregister(self.close)
        self._signals.restore()
        self._session.stop()
        with _ACTIVE.lock:  # kept for a later enable of this dump root (one file set)
            _ACTIVE.dormant[self._key[0]] = (os.getpid(), self._key[1], self.circular_buffer_size,
                                             self._session)
        status = self._session.writer.status()
        lost = sum(status["lost"].values())
        _log.info("tb-numerics: dump %s closed: %d executions and %d graph execution traces "
                  "recorded%s", self.file_prefix, status["written"]["execution"],
                  status["written"]["graph_execution_traces"],
                  ", %d records lost (%s)" % (lost, status["first_error"]) if lost else "")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if _ACTIVE.handle is self:
            disable_dump_debug_info()
        else:
            self.close()


class _ActiveSlot:
    """The one active capture of this process, behind a lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.handle = None
        # dump root -> (pid, mode, circular_buffer_size, stopped Session): what a later
        # enable of the same dump root reuses to append to the same file set
        self.dormant = {}


_ACTIVE = _ActiveSlot()


def _dtype_filter(tensor_dtypes):
    """Turns ``tensor_dtypes`` (dtypes, their names, or a callable) into a predicate."""
    if tensor_dtypes is None:
        return None
    if callable(tensor_dtypes) and not isinstance(tensor_dtypes, torch.dtype):
        return tensor_dtypes
    if isinstance(tensor_dtypes, (torch.dtype, str)):
        tensor_dtypes = [tensor_dtypes]
    wanted = set()
    for d in tensor_dtypes:
        if isinstance(d, str):
            name = d[len("torch."):] if d.startswith("torch.") else d
            resolved = getattr(torch, name, None)
            if not isinstance(resolved, torch.dtype):
                raise ValueError("unknown dtype name in tensor_dtypes: %r" % (d,))
            d = resolved
        if not isinstance(d, torch.dtype):
            raise ValueError("tensor_dtypes items must be torch dtypes or names, not %r" % (d,))
        wanted.add(d)
    return wanted.__contains__


def _rank():
    """This process's torch.distributed rank, else $RANK, else None."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    env = os.environ.get("RANK", "")
    return int(env) if env.isdigit() else None


def _run_id(rank):
    # Ranks of one job must share a run id without talking to each other:
    # derive it from what the launcher gives every rank.
    if rank is None:
        return uuid.uuid4().hex[:16]
    seed = "%s:%s:%s" % (os.environ.get("TORCHELASTIC_RUN_ID", ""),
                         os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", ""))
    return uuid.uuid5(uuid.NAMESPACE_URL, seed).hex[:16]


def enable_dump_debug_info(dump_root, tensor_debug_mode="NO_TENSOR", circular_buffer_size=1000,
                           op_regex=None, tensor_dtypes=None, include_framework_frames=False,
                           health_backend="auto", flush_interval_s=2.0, trace_steps=None,
                           stop_on_nonfinite=False, trends=False):
    """Starts dumping every aten op of this thread's torch program into ``dump_root``.

    Args:
      dump_root: directory for the dump (created if missing).
      tensor_debug_mode: one of NO_TENSOR, CURT_HEALTH, CONCISE_HEALTH,
        FULL_HEALTH, SHAPE, FULL_NUMERICS, FULL_TENSOR.
      circular_buffer_size: keep only the last N executions and graph
        execution traces (written at exit, on SIGTERM/SIGINT and on disable);
        0 or -1 streams everything.
      op_regex: trace only ops whose type (``aten.log.default``) or short
        name (``log``) the regex matches (``re.match``); graphs still hold every op.
      tensor_dtypes: trace only tensors of these dtypes (torch dtypes, names
        such as ``"float16"``, or a predicate on a dtype).
      include_framework_frames: also snapshot torch's own source files and frames.
      health_backend: "auto", "c", "triton" or "torch" (see ``kernels.py``).
      flush_interval_s: a background thread writes what was recorded at least
        this often, also while the program stalls (see ``docs/torch.md``).
      trace_steps: None traces every step; else only the steps selected (marked
        with ``DumpHandle.step()``): ints, ``range``s, or a string such as
        ``"2,5,10-20"`` or ``"every:100"`` (steps divisible by 100). Outside
        them the capture is paused and costs nothing per op.
      stop_on_nonfinite: raise ``NonFiniteError`` from the training step when
        an inf/NaN that propagates (docs/lineage.md) reaches the root model's
        output, the loss or an optimizer step, after printing the first bad
        tensor's story to stderr. Needs a health mode (CURT_HEALTH,
        CONCISE_HEALTH, FULL_HEALTH, FULL_NUMERICS or FULL_TENSOR).
      trends: also keep numerics over time (``docs/torch.md``): per step and
        module, abs max, min, max, mean, std, non-finite count and headroom of
        each module's primary floating output and of its gradient, written as
        TensorBoard scalars beside the file set (``<prefix>.numerics.tfevents``),
        in and between ``trace_steps`` windows, whatever the mode. True: every
        step; an int N: steps divisible by N; False: off.

    Returns:
      DumpHandle, also usable as a ``with`` block. Enabling again with the same
      dump_root and mode returns the active handle. Enabling again after a
      disable, with the same dump_root, mode and circular_buffer_size, appends
      to the same file set (one run, one host label).

    Raises:
      ValueError: a bad argument, or a capture with a different dump_root or
        mode is already active.
    """
    mode = tensor_debug_mode
    health.mode_enum(mode)  # validates
    kernels.check_backend(health_backend)
    regex = capture.compile_op_regex(op_regex)
    dtype_filter = _dtype_filter(tensor_dtypes)
    windows = steps.parse_trace_steps(trace_steps)
    every = series.check_trends(trends)
    if stop_on_nonfinite not in (True, False):
        raise ValueError("stop_on_nonfinite must be True or False, not %r" % (stop_on_nonfinite,))
    if stop_on_nonfinite and mode not in health.KERNEL_MODES and mode != "FULL_TENSOR":
        raise ValueError("stop_on_nonfinite needs a tensor_debug_mode that records inf/NaN "
                         "(CURT_HEALTH, CONCISE_HEALTH, FULL_HEALTH, FULL_NUMERICS, "
                         "FULL_TENSOR), not %s" % mode)
    path = native.choose()  # TB_NUMERICS_CAPTURE
    key = (os.path.abspath(dump_root), mode)
    with _ACTIVE.lock:
        active = _ACTIVE.handle
        if active is not None:
            if active._key == key:
                return active
            raise ValueError("a dump to %s in mode %s is already active; disable it first"
                             % active._key)
        session = _reopen(key, circular_buffer_size)
        if session is None:
            rank = _rank()
            part = None if rank is None else "rank%d" % rank
            writer = FileSetWriter(dump_root, tfdbg_run_id=_run_id(rank),
                                   circular_buffer_size=circular_buffer_size, part=part,
                                   tensorflow_version="torch " + torch.__version__,
                                   flush_interval_s=flush_interval_s)
            session = capture.Session(writer, mode, device_task=rank or 0, part=part)
        writer = session.writer
        session.capture_path = path
        session.configure(regex, dtype_filter, include_framework_frames, health_backend,
                          windows, stop_on_nonfinite, every)
        session.start()
        handle = DumpHandle(session, dump_root, mode, circular_buffer_size, key)
        handle.trace_steps = trace_steps
        handle.stop_on_nonfinite = stop_on_nonfinite
        handle.trends = trends
        handle.capture_path = session.capture_path
        # Registered after the writer's own atexit hook, so it runs first
        # (LIFO) and the open execution reaches the writer before it closes.
        atexit.register(handle.close)
        _ACTIVE.handle = handle
    _log_enabled(writer, mode, circular_buffer_size, health_backend)
    return handle


def _reopen(key, circular_buffer_size):
    """The stopped session of an earlier enable of this dump root with the same mode and
    ring size, its writer reopened for appending; None when there is none to reuse.

    Called with ``_ACTIVE.lock`` held.
    """
    dormant = _ACTIVE.dormant.pop(key[0], None)
    if dormant is None:
        return None
    pid, mode, ring, session = dormant
    if pid != os.getpid() or (mode, ring) != (key[1], circular_buffer_size):
        return None
    try:
        return session if session.writer.reopen() else None
    except OSError as exc:  # e.g. the dump root was deleted in between: start a new set
        _log.info("tb-numerics: cannot append to %s (%s); starting a new file set",
                  session.writer.prefix, exc)
        return None


def _log_enabled(writer, mode, circular_buffer_size, health_backend):
    """Says at INFO what was enabled (as TF's enable_dump_debug_info does); warns once per
    process when a health mode runs without the C kernel."""
    keeps = ("the last %d executions and traces" % circular_buffer_size
             if circular_buffer_size and circular_buffer_size > 0 else "everything (streaming)")
    summary, warning = kernels.describe_backend(health_backend)
    uses_kernel = mode in health.KERNEL_MODES
    _log.info("tb-numerics: dumping to %s, tensor_debug_mode %s, keeping %s%s", writer.prefix,
              mode, keeps, "; health: " + summary if uses_kernel else "")
    if uses_kernel and warning and not _WARNED_NO_C_KERNEL:
        _WARNED_NO_C_KERNEL.append(True)
        _log.warning("tb-numerics: %s", warning)


def disable_dump_debug_info():
    """Stops the active capture and closes its dump. Does nothing when none is active."""
    with _ACTIVE.lock:
        handle, _ACTIVE.handle = _ACTIVE.handle, None
    if handle is not None:
        handle.close()

