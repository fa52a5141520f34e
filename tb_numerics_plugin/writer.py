"""A tfdbg2 file-set writer: the six DebugEvent files of one process.

File names follow TensorFlow's: ``tfdbg_events.<unix_seconds>.<host>.<suffix>``,
with an optional part before the suffix (``.rank3``) so that ranks writing
into one dump root never clobber each other.

Non-execution records (source files, stack frames, graphs, devices) are
appended as they come. Executions and graph execution traces either stream
append-only (``circular_buffer_size=-1`` or 0) with a flush at least every
``flush_interval_s`` seconds, so a killed process leaves all but its last
moments on disk, or are kept as the last N in memory (``circular_buffer_size
=N``) and written whole at each :meth:`FileSetWriter.flush`, at
:meth:`FileSetWriter.close` and at interpreter exit. Such a rewrite goes to a
temporary file renamed over the old one, so a reader following the dump sees
either the previous window or the new one, never a half-truncated file.
"""

import atexit
import collections
import os
import socket
import threading
import time
import uuid
import weakref

from tb_numerics_plugin import records
from tb_numerics_plugin.filenames import SUFFIXES, file_set_prefix
from tb_numerics_plugin.proto import debug_event_pb2

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
_BUFFERED = ("execution", "graph_execution_traces")


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
      flush_interval_s: in streaming mode, longest time between disk flushes.

    Raises:
      OSError: the directory or files cannot be created.
    """

    def __init__(
        self,
        dump_root,
        tfdbg_run_id=None,
        circular_buffer_size=1000,
        host_name=None,
        part=None,
        tensorflow_version="",
        flush_interval_s=2.0,
    ):
        os.makedirs(dump_root, exist_ok=True)
        self.host_name = host_name or socket.gethostname()
        self.tfdbg_run_id = tfdbg_run_id or uuid.uuid4().hex[:16]
        self.prefix = file_set_prefix(dump_root, self.host_name, part)
        self.circular_buffer_size = circular_buffer_size
        self._flush_interval_s = flush_interval_s
        self._lock = threading.RLock()
        self._closed = False
        self._last_flush = time.monotonic()
        self._source_index = {}
        if circular_buffer_size and circular_buffer_size > 0:
            self._ring = {s: collections.deque(maxlen=circular_buffer_size) for s in _BUFFERED}
        else:
            self._ring = {}
        self._files = {s: open(self.path(s), "wb") for s in SUFFIXES}
        for suffix in self._ring:
            # Rewritten whole at each flush (see _flush_locked); only created here.
            self._files.pop(suffix).close()
        metadata = debug_event_pb2.DebugEvent(wall_time=time.time())
        metadata.debug_metadata.tensorflow_version = tensorflow_version
        metadata.debug_metadata.file_version = FILE_VERSION
        metadata.debug_metadata.tfdbg_run_id = self.tfdbg_run_id
        self._append("metadata", metadata.SerializeToString())
        self._files["metadata"].flush()
        atexit.register(_close_at_exit, weakref.ref(self))

    def path(self, suffix):
        """Returns the file path for one of :data:`SUFFIXES`."""
        return "%s.%s" % (self.prefix, suffix)

    def paths(self):
        """Returns the six file paths, in :data:`SUFFIXES` order."""
        return [self.path(s) for s in SUFFIXES]

    def _append(self, suffix, payload):
        self._files[suffix].write(records.encode(payload))

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
        if suffix not in SUFFIXES or suffix == "metadata":
            raise ValueError("unknown or read-only file suffix %r" % suffix)
        with self._lock:
            if self._closed:
                raise ValueError("FileSetWriter for %s is closed" % self.prefix)
            if suffix in self._ring:
                self._ring[suffix].append(payload)
                return
            self._append(suffix, payload)
            now = time.monotonic()
            if now - self._last_flush >= self._flush_interval_s:
                # Only the streamed files: the ring is written at explicit flushes.
                self._flush_locked(rewrite_ring=False)

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

    def flush(self):
        """Puts everything written so far on disk.

        In circular-buffer mode the execution and trace files are rewritten to
        hold exactly the buffered (last N) records.
        """
        with self._lock:
            if not self._closed:
                self._flush_locked()

    def _flush_locked(self, rewrite_ring=True):
        for suffix, ring in self._ring.items() if rewrite_ring else ():
            path = self.path(suffix)
            with open(path + ".tmp", "wb") as f:
                f.write(b"".join(records.encode(payload) for payload in ring))
            os.replace(path + ".tmp", path)
        for f in self._files.values():
            f.flush()
        self._last_flush = time.monotonic()

    def close(self):
        """Flushes and closes the files. Later calls do nothing."""
        with self._lock:
            if self._closed:
                return
            self._flush_locked()
            for f in self._files.values():
                f.close()
            self._closed = True

    @property
    def closed(self):
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _close_at_exit(ref):
    writer = ref()
    if writer is not None:
        writer.close()
