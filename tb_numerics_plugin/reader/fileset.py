"""One file set (one writer process: a host or rank) read incrementally.

Each of the six files is read from the offset where the previous update
stopped. A half-written last record is left for the next update, and said
(file, offset) once the writer is done with the file: its sidecar says
closed, or the file has not changed for :attr:`FileSet.settle_s` seconds.
Damaged bytes are reported (file, offset) and skipped, every good record is
kept.

A circular-buffer writer replaces its execution and trace files whole at each
flush (a new file renamed over the old one): such a file, or one that shrank,
is indexed again from its start as a new *generation*. Records are served
(:meth:`FileSet.read_event`) from the generation they were indexed from: the
file handle of a rewritten file is kept open, and POSIX keeps a renamed-over
file readable through it, so an item never mixes two generations.
"""

import os
import time

import numpy as np

from tb_numerics_plugin import records
from tb_numerics_plugin.filenames import SUFFIXES
from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.reader import status as status_lib
from tb_numerics_plugin.reader import wire
from tb_numerics_plugin.reader.executions import ExecutionTable
from tb_numerics_plugin.reader.graphs import GraphIndex
from tb_numerics_plugin.reader.traces import TraceTable

_HEAD_BYTES = 64
_REWRITTEN = ("execution", "graph_execution_traces")
_HEALTH_MODES = frozenset((2, 3, 4, 6, 7, 8))


def _reserve(cols, frames, left):
    """Sizes ``cols`` for the ``left`` bytes still to read, from this chunk's record density
    (once: growing a large table step by step copies every column each time)."""
    if frames.next_pos and len(frames.starts):
        per_record = frames.next_pos / len(frames.starts)
        cols.reserve(len(cols) + int(max(0, left) / per_record * 1.02) + 16)


class RecordUnavailable(KeyError):
    """A record indexed earlier can no longer be read (file replaced, truncated, unreadable)."""

    def __str__(self):
        return str(self.args[0]) if self.args else "record unavailable"


class FileSet:
    """The indexed content of one file set.

    Args:
      prefix: path up to (excluding) ``.<suffix>``.

    Attributes:
      label: host label (the file-set name part after the timestamp).
      timestamp: the unix seconds of the file name.
      metadata: dict of the DebugMetadata record ({} until read).
      graphs: GraphIndex; executions: ExecutionTable; traces: TraceTable.
      status: the parsed writer-status sidecar (``reader.status``), or None.
      settle_s: a file unchanged for this long, whose writer is not known to
        be alive, is finished: a partial record at its end is reported.
    """

    settle_s = 60.0

    def __init__(self, prefix):
        self.prefix = prefix
        name = os.path.basename(prefix)
        _, stamp, label = name.split(".", 2)
        self.timestamp = int(stamp)
        self.label = label
        self.offsets = {s: 0 for s in SUFFIXES}
        self.record_counts = {s: 0 for s in SUFFIXES}  # framed records, this generation
        self._identity = {}  # suffix -> (st_dev, st_ino, head) of the generation indexed
        self._held = {}  # suffix -> open file of that generation (rewritten files only)
        self._rewritten = set()  # suffixes seen replaced: hold their handles from now on
        self._mtimes = {}  # suffix -> st_mtime at the last update
        self.metadata = {}
        self.graphs = GraphIndex()
        self.executions = ExecutionTable()
        self.traces = TraceTable()
        self.status = None
        self._damage = []  # persistent warnings: corrupt bytes, unreadable files
        self._state = []  # warnings about the current state, rebuilt by update()
        self._notes = []  # writer-status notes, rebuilt by update()
        self._note_losses = []
        self._raw_notes = []

    def path(self, suffix):
        return "%s.%s" % (self.prefix, suffix)

    @property
    def warnings(self):
        """Warnings in a stable order: damage found so far, then current-state ones."""
        return self.losses + [n for n in self._notes if n not in self._note_losses]

    @property
    def losses(self):
        """The warnings that mean records were lost or could not be read (not the
        informational writer notes, such as a ring buffer's evictions)."""
        return (
            self._damage
            + self.graphs.warnings
            + self.executions.warnings
            + self.traces.warnings
            + self._state
            + self._note_losses
        )

    def writer_status(self):
        """The sidecar status plus ``"notes"``, or None (no sidecar: e.g. TensorFlow's dumps)."""
        if self.status is None:
            return None
        return dict(self.status, notes=list(self._raw_notes))

    def update(self, progress=None):
        """Reads what was appended to each file since the last call.

        Args:
          progress: optional callable ``(bytes_read, bytes_to_read)`` called
            after each chunk of the trace file (the one that can be large).

        Returns:
          bool: whether any new record was indexed (or the writer status changed).
        """
        self._state = []
        # The sidecar first: "closed" read before the files means the files are final.
        previous = self.status
        self.status, problem = status_lib.read(self.prefix)
        if problem:
            self._state.append(problem)
        grew = self.status != previous and self.status is not None
        tails = {}
        for suffix in SUFFIXES:
            path = self.path(suffix)
            try:
                grew |= self._read(suffix, path, tails, progress)
            except FileNotFoundError:
                if suffix != "metadata":  # said below, more precisely
                    self._state.append("%s: missing file (file set %s)" % (path, self.label))
            except OSError as e:
                self._state.append("%s: cannot read: %s" % (path, e))
        if not self.metadata:
            path = self.path("metadata")
            if os.path.exists(path):
                self._state.append("%s: no metadata record (empty file?)" % path)
            else:
                self._state.append("file set %s has no metadata file" % self.prefix)
        now = time.time()
        self._check_tails(tails, now)
        mtimes = [m for m in self._mtimes.values()]
        if mtimes and self._finished(max(mtimes), now):
            # Only then: a live writer (TensorFlow's writes a call's Execution
            # after its traces) may have written one file and not yet another.
            self._check_references(tails)
        self._check_counts()
        self._notes, self._note_losses, self._raw_notes = [], [], []
        if self.status is not None:
            notes, losses = status_lib.notes(self.status, self.label, now)
            self._raw_notes = notes
            where = status_lib.path_of(self.prefix)
            self._notes = ["%s: %s" % (where, n) for n in notes]
            self._note_losses = ["%s: %s" % (where, n) for n in losses]
        return grew

    # -- reading ----------------------------------------------------------------

    def _read(self, suffix, path, tails, progress=None):
        f = open(path, "rb")
        try:
            st = os.fstat(f.fileno())
            head = os.pread(f.fileno(), _HEAD_BYTES, 0)
            replaced = self._restart_if_replaced(suffix, st, head)
            self._identity[suffix] = (st.st_dev, st.st_ino, head)
            before = self.offsets[suffix]
            if st.st_size > before:
                def opener(_, mode):
                    return os.fdopen(os.dup(f.fileno()), mode)

                if suffix == "graph_execution_traces":
                    self._read_traces(path, opener, st.st_size, progress)
                elif suffix == "execution":
                    self._read_executions(path, opener, st.st_size)
                else:
                    handler = getattr(self, "_on_" + suffix)
                    for result in records.iter_scan(path, before, opener):
                        self._damage.extend(str(c) for c in result.corruptions)
                        self.record_counts[suffix] += len(result.records)
                        handler(result.records, path)
                        self.offsets[suffix] = result.next_offset
            end = os.fstat(f.fileno())
            self._mtimes[suffix] = end.st_mtime
            if end.st_size > self.offsets[suffix]:
                tails[suffix] = (path, self.offsets[suffix], end.st_size, end.st_mtime)
            if self._hold(suffix):
                old = self._held.get(suffix)
                if old is not None and old is not f:
                    old.close()
                self._held[suffix], f = f, None
            return replaced or self.offsets[suffix] != before
        finally:
            if f is not None:
                f.close()

    def _hold(self, suffix):
        """Whether to keep the handle of ``suffix``: a file replaced whole at each flush."""
        if suffix not in _REWRITTEN:
            return False
        ring = self.status is not None and self.status["circular_buffer_size"] > 0
        return ring or suffix in self._rewritten

    def _restart_if_replaced(self, suffix, st, head):
        """Drops the index of a rewritten execution/trace file; True if it did.

        A rewrite shows as a new (st_dev, st_ino), a file shorter than what
        was read, or different first bytes (the ring dropped its oldest
        records). While the old generation's handle is held its inode cannot
        be handed out again; otherwise the first bytes catch a reused one.
        """
        if suffix not in _REWRITTEN:
            return False
        previous = self._identity.get(suffix)
        if not self.offsets[suffix] or previous is None:
            return False
        same = previous[:2] == (st.st_dev, st.st_ino) and head.startswith(previous[2])
        if same and st.st_size >= self.offsets[suffix]:
            return False
        self._rewritten.add(suffix)
        self.offsets[suffix] = 0
        self.record_counts[suffix] = 0
        if suffix == "execution":
            self.executions = ExecutionTable()
        else:
            self.traces = TraceTable()
        return True

    def read_event(self, suffix, offset):
        """The DebugEvent at ``offset`` of file ``suffix``, from the generation indexed.

        Raises:
          RecordUnavailable: the file was replaced since it was indexed (run
            ``update()``), or the record no longer reads; names file and offset.
        """
        path = self.path(suffix)
        try:
            held = self._held.get(suffix)
            if held is not None:
                payload = records.read_from(held, offset, path)
            else:
                with open(path, "rb") as f:
                    st = os.fstat(f.fileno())
                    known = self._identity.get(suffix)
                    if known is not None and known[:2] != (st.st_dev, st.st_ino):
                        raise RecordUnavailable(
                            "%s: replaced since it was indexed; the record at offset %d is gone "
                            "(update the run)" % (path, offset))
                    payload = records.read_from(f, offset, path)
            return debug_event_pb2.DebugEvent.FromString(payload)
        except RecordUnavailable:
            raise
        except Exception as e:  # OSError, ValueError (framing), DecodeError
            raise RecordUnavailable("%s: record at offset %d can no longer be read (%s)"
                                    % (path, offset, e)) from None

    def holds_files(self):
        """Whether the index keeps open file handles (a rewritten file's generation)."""
        return bool(self._held)

    def close(self):
        """Closes the held handles (a later update reopens what it needs)."""
        for f in self._held.values():
            f.close()
        self._held = {}

    def _read_executions(self, path, opener, size):
        for frames, base in wire.iter_frames(path, self.offsets["execution"], opener=opener):
            self._damage.extend(str(c) for c in frames.corruptions)
            self.record_counts["execution"] += len(frames.starts)
            self.executions.add_frames(frames, base, path)
            self.offsets["execution"] = base + frames.next_pos
            _reserve(self.executions.cols, frames, size - self.offsets["execution"])

    def _read_traces(self, path, opener, size, progress=None):
        suffix = "graph_execution_traces"
        start = self.offsets[suffix]
        for frames, base in wire.iter_frames(path, start, opener=opener):
            self._damage.extend(str(c) for c in frames.corruptions)
            self.record_counts[suffix] += len(frames.starts)
            self.traces.add_frames(frames, base, path)
            self.offsets[suffix] = base + frames.next_pos
            _reserve(self.traces.cols, frames, size - self.offsets[suffix])
            if progress is not None:
                progress(self.offsets[suffix] - start, max(size - start, 1))

    # -- what the files should hold ---------------------------------------------

    def _finished(self, mtime, now):
        """Whether the writer is done with a file (closed, or gone quiet)."""
        if self.status is not None:
            if self.status["state"] == "closed":
                return True
            if not status_lib.writer_gone(self.status, self.label, now):
                return False
        return now - mtime >= self.settle_s

    def _check_tails(self, tails, now):
        for suffix, (path, offset, size, mtime) in sorted(tails.items()):
            if self._finished(mtime, now):
                self._state.append("%s: %d bytes at offset %d are an incomplete record "
                                   "(the writer stopped mid-record: truncated?)"
                                   % (path, size - offset, offset))

    def _check_references(self, tails):
        """Empty files whose records other files refer to: records lost, said per file."""
        status = self.status

        def empty(suffix):
            if status is not None and not status["written"].get(suffix) \
                    and not any(status["lost"].values()):
                return False  # the writer says it wrote none of these and lost none
            return (self.record_counts[suffix] == 0 and suffix in self._identity
                    and suffix not in tails)  # a partial record there is said already

        ex, tr, gi = self.executions, self.traces, self.graphs
        health_calls = int(np.isin(ex.cols["mode"], list(_HEALTH_MODES)).sum())
        said = []
        if empty("graph_execution_traces") and gi.ops and health_calls:
            said.append(("graph_execution_traces", "no graph execution trace, but %d executions "
                         "ran in a health mode and the graphs file holds %d ops"
                         % (health_calls, len(gi.ops))))
        if empty("execution") and len(tr):
            said.append(("execution", "no execution, but %d graph execution traces ran"
                         % len(tr)))
        if empty("graphs") and (len(tr) or (len(ex) and (ex.cols["graph_id"] >= 0).any())):
            said.append(("graphs", "no graph record, but traces or executions name graphs"))
        if empty("stack_frames") and any(op.code_location.stack_frame_ids
                                         for op in gi.ops.values()):
            said.append(("stack_frames", "no stack frame, but ops name stack frames"))
        if empty("source_files") and gi.stack_frames:
            said.append(("source_files", "no source file, but %d stack frames name source files"
                         % len(gi.stack_frames)))
        for suffix, text in said:
            self._state.append("%s: %s: records lost?" % (self.path(suffix), text))

    def _check_counts(self):
        """A closed writer's counts against what is on disk (catches cuts at record bounds)."""
        loud = self._damage + self.graphs.warnings + self.executions.warnings \
            + self.traces.warnings + self._state
        for suffix in SUFFIXES:
            expected = status_lib.expected_records(self.status, suffix)
            got = self.record_counts[suffix]
            path = self.path(suffix)
            if expected is None or got >= expected or any(path in w for w in loud):
                continue
            self._state.append("%s: the writer wrote %d records, %d are on disk: %d lost "
                               "(truncated?)" % (path, expected, got, expected - got))

    def _events(self, recs, path):
        for offset, payload in recs:
            try:
                yield offset, debug_event_pb2.DebugEvent.FromString(payload)
            except Exception as e:  # protobuf's DecodeError type differs by backend
                self._damage.append(
                    "%s: record at offset %d is not a DebugEvent (%s); skipped" % (path, offset, e)
                )

    def _on_metadata(self, recs, path):
        for _, event in self._events(recs, path):
            if event.WhichOneof("what") == "debug_metadata" and not self.metadata:
                m = event.debug_metadata
                self.metadata = {
                    "tensorflow_version": m.tensorflow_version,
                    "file_version": m.file_version,
                    "tfdbg_run_id": m.tfdbg_run_id,
                    "wall_time": event.wall_time,
                }

    def _on_source_files(self, recs, path):
        for offset, event in self._events(recs, path):
            self.graphs.add_source_file_record(event, offset, path)

    def _on_stack_frames(self, recs, path):
        for offset, event in self._events(recs, path):
            self.graphs.add_stack_frame_record(event, offset, path)

    def _on_graphs(self, recs, path):
        for offset, event in self._events(recs, path):
            self.graphs.add_graph_record(event, offset, path)

