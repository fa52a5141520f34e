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
import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref

from tb_numerics_plugin import record_files
from tb_numerics_plugin.filenames import STATUS_SUFFIX, SUFFIXES, create_file_set
from tb_numerics_plugin.proto import debug_event_pb2

_log = logging.getLogger("tb_numerics_plugin.writer")

FILE_VERSION = "debug.Event:1"
STATUS_VERSION = 1
STATUS_BYTES = 4096
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
_BUFFERED = ("execution", "graph_execution_traces")
# Written first, in this order: executions and traces point into them.
_DEFINITIONS = ("source_files", "stack_frames", "graphs")
_COUNTED = _DEFINITIONS + _BUFFERED
_WRITABLE = frozenset(_COUNTED)
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
        self._ring = ({s: collections.deque(maxlen=circular_buffer_size) for s in _BUFFERED}
                      if ring else {})
        for suffix in self._ring:  # rewritten whole at each flush; only created here
            os.close(fds.pop(suffix))
        self._status_fd = fds.pop(STATUS_SUFFIX)
        self._fds = fds
        self._sizes = {s: 0 for s in fds}  # bytes of whole records in each streamed file
        self._pending = {s: [] for s in fds if s != "metadata"}
        self._pending_bytes = 0
        self._accepted = dict.fromkeys(_COUNTED, 0)
        self._ring_on_disk = dict.fromkeys(self._ring, 0)  # accepted count at the last rewrite
        self._blocked = dict.fromkeys(_COUNTED)  # suffix -> errno name keeping its records off disk
        self._lost = collections.Counter()  # errno name -> records dropped for good
        self._first_error = None
        self._logged = set()
        self._every_write = flush_interval_s <= 0
        self._presize_status()
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
                ring = self._ring.get(suffix)
                if ring is not None:
                    self._accepted[suffix] += len(payloads)
                    ring.extend(payloads)
                else:
                    self._stream_locked(suffix, payloads)

    def _stream_locked(self, suffix, payloads):
        for payload in payloads:
            self._accepted[suffix] += 1
            self._pending[suffix].append(payload)  # (a flush may replace the list)
            self._pending_bytes += len(payload)
            if self._pending_bytes >= _PENDING_LIMIT:
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
                self._log_once("hook", "tb-numerics flush timer hook failed: %r", exc)
        with self._lock:
            if not self._closed:
                self._flush_locked()

    def _flush_locked(self, rewrite_ring=True, status=True):
        # The sidecar goes first: killed mid-flush, it claims at least what is on disk.
        if status:
            self._write_status()
        losses = sum(self._lost.values()), tuple(self._blocked.values())
        blocked = None
        for suffix in _DEFINITIONS:
            pending = self._pending[suffix]
            if pending and blocked is None:
                n, blocked = self._write_records(suffix, pending)
                del pending[:n]  # the rest is kept for the next flush: traces need them
            self._blocked[suffix] = blocked if pending else None
        for suffix in _BUFFERED:
            if suffix in self._ring:
                if rewrite_ring and self._ring_on_disk[suffix] != self._accepted[suffix]:
                    if blocked is None:
                        self._rewrite_ring(suffix)
                    else:
                        self._blocked[suffix] = blocked
                continue
            pending = self._pending[suffix]
            if pending:
                # Not attempted when their definitions could not be written.
                n, error = self._write_records(suffix, pending) if blocked is None else (0, blocked)
                if n < len(pending):
                    self._lost[error] += len(pending) - n
                pending.clear()
        # Definitions held back by an error wait for the next timed flush: counting them
        # here would make every write retry a failing disk.
        self._pending_bytes = 0
        if status and losses != (sum(self._lost.values()), tuple(self._blocked.values())):
            self._write_status()

    def _write_records(self, suffix, payloads):
        """Appends framed records; returns (records on disk, errno name or None).

        A write that fails part-way is cut back to the last whole record.
        """
        n, self._sizes[suffix], exc = record_files.append(
            self._fds[suffix], self._sizes[suffix], payloads)
        return n, None if exc is None else self._failed(exc, self.path(suffix))

    def _rewrite_ring(self, suffix):
        path = self.path(suffix)
        accepted = self._accepted[suffix]
        exc = record_files.replace(path, self._ring[suffix])
        if exc is not None:  # the previous window stays
            self._blocked[suffix] = self._failed(exc, path + record_files.TMP_SUFFIX)
            return
        self._ring_on_disk[suffix] = accepted
        self._blocked[suffix] = None

    # ---- status --------------------------------------------------------------
    def status(self):
        """Returns the sidecar's content (docs/format.md, "Writer status") as a dict."""
        with self._lock:
            lost = collections.Counter(self._lost)
            lost.update(self._held_back())
            return {
                "version": STATUS_VERSION,
                "pid": os.getpid(),
                "tfdbg_run_id": self.tfdbg_run_id,
                "circular_buffer_size": self.circular_buffer_size if self._ring else -1,
                "state": "closed" if self._closed else "open",
                "updated_wall_time": time.time(),
                "written": dict(self._accepted),
                "evicted": {s: max(0, self._accepted[s] - len(self._ring[s])) if self._ring else 0
                            for s in _BUFFERED},
                "lost": dict(lost),
                "first_error": self._first_error,
            }

    def _held_back(self):
        """Records an error keeps off the disk for now, by errno name: definitions pending
        behind it and ring records accepted since the last rewrite that are still held."""
        held = collections.Counter()
        for suffix in _DEFINITIONS:
            if self._blocked[suffix]:
                held[self._blocked[suffix]] += len(self._pending[suffix])
        for suffix, ring in self._ring.items():
            if self._blocked[suffix]:
                held[self._blocked[suffix]] += min(
                    len(ring), self._accepted[suffix] - self._ring_on_disk[suffix])
        return held

    def _presize_status(self):
        try:
            _, exc = record_files.write_all(self._status_fd, b" " * STATUS_BYTES)
        except OSError as exc_:
            exc = exc_
        if exc is not None:
            self._failed(exc, self.path(STATUS_SUFFIX))

    def _write_status(self):
        if self._status_fd is None:
            return
        data = json.dumps(self.status()).encode()
        if len(data) > STATUS_BYTES:  # only a huge error message can do this
            self._first_error = self._first_error[:200]
            data = json.dumps(self.status()).encode()[:STATUS_BYTES]
        try:
            os.pwrite(self._status_fd, data.ljust(STATUS_BYTES), 0)
        except OSError as exc:
            self._log_once("status", "tb-numerics could not update %s: %s",
                           self.path(STATUS_SUFFIX), exc)

    def _failed(self, exc, path):
        """Records a write error once; returns its errno name."""
        name = record_files.errno_name(exc)
        if self._first_error is None:
            self._first_error = ("%s: %s (%s)" % (path, exc.strerror or exc, name))[:1000]
            self._write_status()
        self._log_once(name, "tb-numerics could not write %s (%s: %s); the program continues and "
                       "the records that missed the disk are counted in %s", path, name,
                       exc.strerror or exc, self.path(STATUS_SUFFIX))
        return name

    def _log_once(self, key, message, *args):
        if key not in self._logged:
            self._logged.add(key)
            _log.warning(message, *args)

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
            self._lost.update(self._held_back())  # still held back by write errors: lost now
            for suffix in _COUNTED:
                if suffix in _DEFINITIONS:
                    self._pending[suffix].clear()
                self._blocked[suffix] = None
            self._closed = True
            for fd in self._fds.values():
                try:
                    os.close(fd)
                except OSError as exc:  # e.g. EIO reported late by a network filesystem
                    self._failed(exc, self.prefix)
            self._write_status()
            try:
                os.close(self._status_fd)
            except OSError:
                pass
            self._status_fd = None
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
            self._status_fd = status_fd
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
        for fd in list(self._fds.values()) + [self._status_fd]:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fds = None
        self._status_fd = None
        self._pending = {s: [] for s in self._pending}
        self._ring = {s: collections.deque() for s in self._ring}

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
