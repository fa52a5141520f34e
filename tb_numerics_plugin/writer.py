"""A tfdbg2 file-set writer: the six DebugEvent files of one process, and its status sidecar.

File names follow TensorFlow's: ``tfdbg_events.<unix_seconds>.<host>.<suffix>``,
with an optional part before the suffix (``.rank3``) so that ranks writing
into one dump root never clobber each other. Every file is created exclusively,
the metadata file first; a name already taken (another process of this host
started in the same second) gets a ``p<pid>x<token>`` part instead, so no
writer ever appends to or truncates another's set. A closed writer can be
reopened (:meth:`FileSetWriter.reopen`): it appends to its own set again, so
one process capturing in several windows leaves one file set.

Records are kept in memory and written at flushes, definitions before the
records that point into them (source files, stack frames, graphs, then
executions and traces), so a reader never finds a trace whose op, frames or
source are not on disk. Executions and graph execution traces either stream
append-only (``circular_buffer_size=-1`` or 0) or are kept as the last N in
memory (``circular_buffer_size=N``) and written whole at each flush through a
temporary file renamed over the old one (a reader sees either window, never a
half-written one). A daemon thread flushes every ``flush_interval_s`` even when
the program stalls and writes nothing; flushes also happen at
:meth:`FileSetWriter.flush`, :meth:`FileSetWriter.close`, at interpreter exit
and, when streaming, whenever 1 MiB is pending.

Write errors (ENOSPC, EFBIG, EIO, ...) never reach the program: the records
that missed the disk are counted by errno name, the first error is logged once
per errno and recorded, and a file never keeps a half-written record. What
the writer accepted, dropped (ring evictions) and lost is in the sidecar
``<prefix>.writer_status.json``: JSON padded to exactly 4096 bytes, rewritten
in place so that it needs no new disk blocks on a full disk (docs/format.md,
"Writer status").
"""

import atexit
import collections
import os
import socket
import threading
import time
import uuid
import weakref

from tb_numerics_plugin import record_files
from tb_numerics_plugin.filenames import STATUS_SUFFIX, SUFFIXES, create_file_set
from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.record_buffers import BUFFERED, COUNTED, RecordBuffers
from tb_numerics_plugin.status_sidecar import STATUS_VERSION, StatusSidecar

FILE_VERSION = "debug.Event:1"
# Which file each kind of DebugEvent goes to (the oneof field name).
_SUFFIX_OF_KIND = {
    "debug_metadata": "metadata",
    "source_file": "source_files",
    "stack_frame_with_id": "stack_frames",
    "graph_op_creation": "graphs",
    "debugged_graph": "graphs",
    "debugged_device": "graphs",
    "execution": "execution",
    "graph_execution_trace": "graph_execution_traces",
}
_WRITABLE = frozenset(COUNTED)
_PENDING_LIMIT = 1 << 20  # streamed bytes held in memory before a flush
_LIVE = weakref.WeakSet()  # open writers, detached in forked children
_O_REOPEN = os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)


class FileSetWriter:
    """Writes one tfdbg2 file set. Thread-safe; ``flush``/``close`` are idempotent.

    Args:
      dump_root: directory to write into (created if missing).
      tfdbg_run_id: id shared by the file sets of one run; a fresh one if None.
      circular_buffer_size: keep only the last N executions and the last N
        graph execution traces (N > 0); -1 or 0 streams them all.
      host_name: host recorded in file names; this machine's name if None.
      part: extra file-name part before the suffix (e.g. ``"rank1"``).
      tensorflow_version: written into the metadata record.
      flush_interval_s: longest time between flushes (a daemon thread); 0 or
        less: no thread, streamed records are written at every write.

    Attributes:
      on_timer: optional callable run by the flush thread before each timed
        flush (the capture writes a stalled open execution with it).

    Raises:
      OSError: the directory or files cannot be created. Later write errors
        are never raised: they are counted in the status sidecar.
    """

    def __init__(self, dump_root, tfdbg_run_id=None, circular_buffer_size=1000, host_name=None,
                 part=None, tensorflow_version="", flush_interval_s=2.0):
        os.makedirs(dump_root, exist_ok=True)
        self.host_name = host_name or socket.gethostname()
        self.tfdbg_run_id = tfdbg_run_id or uuid.uuid4().hex[:16]
        self.prefix, fds = create_file_set(dump_root, self.host_name, part)
        ring = bool(circular_buffer_size and circular_buffer_size > 0)
        self.circular_buffer_size = circular_buffer_size
        self.on_timer = None
        self._lock = threading.RLock()
        self._closed = False
        self._source_index = {}
        if ring:
            for suffix in BUFFERED:  # rewritten whole at each flush; only created here
                os.close(fds.pop(suffix))
        self._sidecar = StatusSidecar(fds.pop(STATUS_SUFFIX), self.path(STATUS_SUFFIX))
        self._fds = fds
        self._sizes = {s: 0 for s in fds}  # bytes of whole records in each streamed file
        self._records = RecordBuffers([s for s in fds if s != "metadata"],
                                      circular_buffer_size if ring else None)
        self._every_write = flush_interval_s <= 0
        exc = self._sidecar.presize()
        if exc is not None:
            self._failed(exc, self._sidecar.path)
        metadata = debug_event_pb2.DebugEvent(wall_time=time.time())
        metadata.debug_metadata.tensorflow_version = tensorflow_version
        metadata.debug_metadata.file_version = FILE_VERSION
        metadata.debug_metadata.tfdbg_run_id = self.tfdbg_run_id
        with self._lock:
            self._write_records("metadata", [metadata.SerializeToString()])
            self._write_status()
        _LIVE.add(self)
        self._period = flush_interval_s / 2.0
        self._start_timer()
        atexit.register(_close_at_exit, weakref.ref(self))

    def path(self, suffix):
        """Returns the file path for one of :data:`SUFFIXES` (or ``STATUS_SUFFIX``)."""
        return "%s.%s" % (self.prefix, suffix)

    def paths(self):
        """Returns the six file paths, in :data:`SUFFIXES` order."""
        return [self.path(s) for s in SUFFIXES]

    # ---- accepting records ---------------------------------------------------
    def write_event(self, event):
        """Writes a DebugEvent to the file its kind belongs to.

        A missing ``wall_time`` is set to now.

        Raises:
          ValueError: the event has no recognised ``what`` field, or the writer is closed.
        """
        kind = event.WhichOneof("what")
        suffix = _SUFFIX_OF_KIND.get(kind)
        if suffix is None or suffix == "metadata":
            raise ValueError("cannot write a DebugEvent holding %r" % kind)
        if not event.wall_time:
            event.wall_time = time.time()
        self.write_serialized(suffix, event.SerializeToString())

    def write_serialized(self, suffix, payload):
        """Writes an already serialized DebugEvent to the file ``suffix``.

        Raises:
          ValueError: unknown suffix, or the writer is closed.
        """
        self.write_serialized_many(suffix, (payload,))

    def write_serialized_many(self, suffix, payloads):
        """Writes already serialized DebugEvents to the file ``suffix``, in order
        (as :meth:`write_serialized` each, under one lock).

        Raises:
          ValueError: unknown suffix, or the writer is closed.
        """
        self.write_serialized_groups(((suffix, payloads),))

    def write_serialized_groups(self, groups):
        """Writes ``(suffix, payloads)`` groups of serialized DebugEvents, each as
        :meth:`write_serialized_many`, under one lock (a captured execution's traces
        and its ``Execution``).

        Raises:
          ValueError: an unknown suffix (nothing written), or the writer is closed.
        """
        for suffix, _ in groups:
            if suffix not in _WRITABLE:
                raise ValueError("unknown or read-only file suffix %r" % suffix)
        with self._lock:
            if self._closed:
                if self._fds is None:  # a forked child's copy: its records are not ours to write
                    return
                raise ValueError("FileSetWriter for %s is closed" % self.prefix)
            for suffix, payloads in groups:
                if not self._records.extend_ring(suffix, payloads):
                    self._stream_locked(suffix, payloads)

    def _stream_locked(self, suffix, payloads):
        for payload in payloads:
            if self._records.add(suffix, payload) >= _PENDING_LIMIT:
                self._flush_locked(rewrite_ring=False)
            elif self._every_write:
                self._flush_locked(rewrite_ring=False, status=False)

    def add_source_file(self, file_path, lines, host_name=None):
        """Writes a source file snapshot once per (host, path).

        Returns:
          int: its ``file_index`` (the order of ``.source_files`` records).
        """
        host_name = host_name or self.host_name
        key = (host_name, file_path)
        with self._lock:
            index = self._source_index.get(key)
            if index is not None:
                return index
            index = len(self._source_index)
            self._source_index[key] = index
        event = debug_event_pb2.DebugEvent()
        event.source_file.file_path = file_path
        event.source_file.host_name = host_name
        event.source_file.lines.extend(lines)
        self.write_event(event)
        return index

    # ---- flushing ------------------------------------------------------------
    def flush(self):
        """Puts everything written so far on disk (never raises for write errors).
        Does nothing while closed.

        In circular-buffer mode the execution and trace files are rewritten to
        hold exactly the buffered (last N) records.
        """
        with self._lock:
            if not self._closed:
                self._flush_locked()

    def _tick(self):
        """One beat of the flush thread: the ``on_timer`` hook, then a flush."""
        hook = self.on_timer
        if hook is not None:
            try:
                hook()
            except Exception as exc:  # the thread must keep flushing
                self._sidecar.log_once("hook", "tb-numerics flush timer hook failed: %r", exc)
        with self._lock:
            if not self._closed:
                self._flush_locked()

    def _flush_locked(self, rewrite_ring=True, status=True):
        # The sidecar goes first: killed mid-flush, it claims at least what is on disk.
        if status:
            self._write_status()
        changed = self._records.flush(self._write_records, self._rewrite_ring, rewrite_ring)
        if status and changed:
            self._write_status()

    def _write_records(self, suffix, payloads):
        """Appends framed records; returns (records on disk, errno name or None).

        A write that fails part-way is cut back to the last whole record.
        """
        n, self._sizes[suffix], exc = record_files.append(
            self._fds[suffix], self._sizes[suffix], payloads)
        return n, None if exc is None else self._failed(exc, self.path(suffix))

    def _rewrite_ring(self, suffix, payloads):
        """Writes a ring's file whole; returns None, or the errno name (the old file stays)."""
        path = self.path(suffix)
        exc = record_files.replace(path, payloads)
        return None if exc is None else self._failed(exc, path + record_files.TMP_SUFFIX)

    # ---- status --------------------------------------------------------------
    def status(self):
        """Returns the sidecar's content (docs/format.md, "Writer status") as a dict."""
        with self._lock:
            lost = collections.Counter(self._records.lost)
            lost.update(self._records.held_back())
            return {
                "version": STATUS_VERSION,
                "pid": os.getpid(),
                "tfdbg_run_id": self.tfdbg_run_id,
                "circular_buffer_size": self.circular_buffer_size if self._records.ring else -1,
                "state": "closed" if self._closed else "open",
                "updated_wall_time": time.time(),
                "written": dict(self._records.accepted),
                "evicted": self._records.evicted(),
                "lost": dict(lost),
                "first_error": self._sidecar.first_error,
            }

    def _write_status(self):
        self._sidecar.write(self.status())

    def _failed(self, exc, path):
        """Records a write error (the sidecar names the first); returns its errno name."""
        name, first = self._sidecar.failed(exc, path)
        if first:
            self._write_status()
        return name

    # ---- closing -------------------------------------------------------------
    def close(self):
        """Flushes and closes the files; never raises for write errors. Later calls do nothing."""
        self._stop.set()
        timer = self._timer
        if timer is not None and timer is not threading.current_thread():
            timer.join(timeout=10)
        with self._lock:
            if self._closed:
                return
            self._flush_locked(status=False)
            self._records.give_up()  # still held back by write errors: lost now
            self._closed = True
            for fd in self._fds.values():
                try:
                    os.close(fd)
                except OSError as exc:  # e.g. EIO reported late by a network filesystem
                    self._failed(exc, self.prefix)
            self._write_status()
            self._sidecar.close()
        _LIVE.discard(self)

    def reopen(self):
        """Opens a closed writer again, appending to the same file set.

        Counters, the source-file index and the ring carry on where they
        stopped, no second metadata record is written and the sidecar says
        "open" again: a process that enables a capture into one dump root
        several times leaves one file set (one host label), never two.

        Returns:
          bool: True when open (already or again); False for a forked child's
          copy, whose files belong to the parent.

        Raises:
          OSError: a file of the set cannot be opened (e.g. it was deleted).
        """
        with self._lock:
            if not self._closed:
                return True
            if self._fds is None:
                return False
            fds = {}
            try:
                for suffix in self._fds:
                    fds[suffix] = os.open(self.path(suffix), _O_REOPEN | os.O_APPEND)
                status_fd = os.open(self.path(STATUS_SUFFIX), _O_REOPEN)
            except OSError:
                for fd in fds.values():
                    os.close(fd)
                raise
            for suffix, fd in fds.items():
                self._sizes[suffix] = os.fstat(fd).st_size
            self._fds = fds
            self._sidecar.fd = status_fd
            self._closed = False
            self._write_status()
            self._start_timer()
        _LIVE.add(self)
        return True

    def _start_timer(self):
        """Starts the flush thread (none when every write flushes)."""
        self._stop = threading.Event()
        self._timer = None
        if not self._every_write:
            self._timer = threading.Thread(
                target=_timer_loop, args=(weakref.ref(self), self._stop, self._period),
                name="tb-numerics-flush", daemon=True)
            self._timer.start()

    def _detach_in_child(self):
        """In a forked child: drops this copy without writing (the parent owns the files)."""
        self._lock = threading.RLock()  # another thread may have held it at the fork
        self._closed = True
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._sidecar.close()
        self._fds = None
        self._records.forget()

    @property
    def closed(self):
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _timer_loop(ref, stop, period):
    """The flush thread: holds the writer only weakly, so a forgotten writer still dies."""
    while not stop.wait(period):
        writer = ref()
        if writer is None:
            return
        writer._tick()
        del writer


def _close_at_exit(ref):
    writer = ref()
    if writer is not None:
        writer.close()


def _after_fork_in_child():
    for writer in list(_LIVE):
        writer._detach_in_child()
    _LIVE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
