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

from tb_numerics_plugin.torch import capture, health, kernels, signals
from tb_numerics_plugin.writer import FileSetWriter

__all__ = ["enable_dump_debug_info", "disable_dump_debug_info", "DumpHandle"]

TENSOR_DEBUG_MODES = health.MODES
_log = logging.getLogger("tb_numerics_plugin.torch")
_WARNED_NO_C_KERNEL = []  # the no-C-kernel warning is said once per process


class DumpHandle:
    """An active capture. Also a context manager that disables it on exit.

    Attributes:
      dump_root, tensor_debug_mode, circular_buffer_size: as passed.
    """

    def __init__(self, session, dump_root, tensor_debug_mode, circular_buffer_size, key):
        self._session = session
        self.dump_root = dump_root
        self.tensor_debug_mode = tensor_debug_mode
        self.circular_buffer_size = circular_buffer_size
        self._key = key
        self._signals = signals.SignalFlusher(self.flush)
        self.closed = False

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
                           health_backend="auto", flush_interval_s=2.0):
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

    Returns:
      DumpHandle, also usable as a ``with`` block. Enabling again with the same
      dump_root and mode returns the active handle.

    Raises:
      ValueError: a bad argument, or a capture with a different dump_root or
        mode is already active.
    """
    mode = tensor_debug_mode
    health.mode_enum(mode)  # validates
    kernels.check_backend(health_backend)
    regex = capture.compile_op_regex(op_regex)
    dtype_filter = _dtype_filter(tensor_dtypes)
    key = (os.path.abspath(dump_root), mode)
    with _ACTIVE.lock:
        active = _ACTIVE.handle
        if active is not None:
            if active._key == key:
                return active
            raise ValueError("a dump to %s in mode %s is already active; disable it first"
                             % active._key)
        rank = _rank()
        writer = FileSetWriter(dump_root, tfdbg_run_id=_run_id(rank),
                               circular_buffer_size=circular_buffer_size,
                               part=None if rank is None else "rank%d" % rank,
                               tensorflow_version="torch " + torch.__version__,
                               flush_interval_s=flush_interval_s)
        session = capture.Session(writer, mode, regex, dtype_filter, rank or 0,
                                  include_framework_frames, health_backend)
        session.start()
        handle = DumpHandle(session, dump_root, mode, circular_buffer_size, key)
        # Registered after the writer's own atexit hook, so it runs first
        # (LIFO) and the open execution reaches the writer before it closes.
        atexit.register(handle.close)
        _ACTIVE.handle = handle
    _log_enabled(writer, mode, circular_buffer_size, health_backend)
    return handle


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

