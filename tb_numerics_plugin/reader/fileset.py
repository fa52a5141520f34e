"""One file set (one writer process: a host or rank) read incrementally.

Each of the six files is read from the offset where the previous update
stopped. A half-written last record is left for the next update; damaged
bytes are reported (file, offset) and skipped, every good record is kept.
A circular-buffer writer replaces its execution and trace files whole at each
flush (a new file renamed over the old one): such a file, or one that shrank,
is indexed again from its start.
"""

import os

from tb_numerics_plugin import records
from tb_numerics_plugin.filenames import SUFFIXES
from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.reader import wire
from tb_numerics_plugin.reader.executions import ExecutionTable
from tb_numerics_plugin.reader.graphs import GraphIndex
from tb_numerics_plugin.reader.traces import TraceTable

_HEAD_BYTES = 64


class FileSet:
    """The indexed content of one file set.

    Args:
      prefix: path up to (excluding) ``.<suffix>``.

    Attributes:
      label: host label (the file-set name part after the timestamp).
      timestamp: the unix seconds of the file name.
      metadata: dict of the DebugMetadata record ({} until read).
      graphs: GraphIndex; executions: ExecutionTable; traces: TraceTable.
    """

    def __init__(self, prefix):
        self.prefix = prefix
        name = os.path.basename(prefix)
        _, stamp, label = name.split(".", 2)
        self.timestamp = int(stamp)
        self.label = label
        self.offsets = {s: 0 for s in SUFFIXES}
        self._identity = {}  # suffix -> (st_dev, st_ino) of the file last read
        self.metadata = {}
        self.graphs = GraphIndex()
        self.executions = ExecutionTable()
        self.traces = TraceTable()
        self._damage = []  # persistent warnings: corrupt bytes, unreadable files
        self._state = []  # warnings about the current state, rebuilt by update()

    def path(self, suffix):
        return "%s.%s" % (self.prefix, suffix)

    @property
    def warnings(self):
        """Warnings in a stable order: damage found so far, then current-state ones."""
        return (
            self._damage
            + self.graphs.warnings
            + self.executions.warnings
            + self.traces.warnings
            + self._state
        )

    def update(self, progress=None):
        """Reads what was appended to each file since the last call.

        Args:
          progress: optional callable ``(bytes_read, bytes_to_read)`` called
            after each chunk of the trace file (the one that can be large).

        Returns:
          bool: whether any new record was indexed.
        """
        self._state = []
        grew = False
        for suffix in SUFFIXES:
            path = self.path(suffix)
            if not os.path.exists(path):
                if suffix != "metadata":  # said below, more precisely
                    self._state.append("%s: missing file (file set %s)" % (path, self.label))
                continue
            try:
                grew |= self._read(suffix, path, progress)
            except OSError as e:
                self._state.append("%s: cannot read: %s" % (path, e))
        if not self.metadata:
            path = self.path("metadata")
            if os.path.exists(path):
                self._state.append("%s: no metadata record (empty file?)" % path)
            else:
                self._state.append("file set %s has no metadata file" % self.prefix)
        return grew

    def _read(self, suffix, path, progress=None):
        replaced = self._restart_if_replaced(suffix, path)
        if os.path.getsize(path) <= self.offsets[suffix]:
            return replaced
        if suffix == "graph_execution_traces":
            return self._read_traces(path, progress)
        if suffix == "execution":
            return self._read_executions(path)
        before = self.offsets[suffix]
        handler = getattr(self, "_on_" + suffix)
        for result in records.iter_scan(path, before):
            self._damage.extend(str(c) for c in result.corruptions)
            handler(result.records, path)
            self.offsets[suffix] = result.next_offset
        return self.offsets[suffix] != before

    def _restart_if_replaced(self, suffix, path):
        """Drops the index of a rewritten execution/trace file; True if it did.

        A rewrite shows as a new inode, a file shorter than what was read, or
        different first bytes (the ring dropped its oldest records). The inode
        alone is not enough: the file system may hand a freed one out again.
        """
        if suffix not in ("execution", "graph_execution_traces"):
            return False
        with open(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
            size = os.fstat(f.fileno()).st_size
            identity = (os.fstat(f.fileno()).st_ino, head)
        previous = self._identity.get(suffix)
        self._identity[suffix] = identity
        if not self.offsets[suffix] or previous is None:
            return False
        same = previous[0] == identity[0] and head.startswith(previous[1])
        if same and size >= self.offsets[suffix]:
            return False
        self.offsets[suffix] = 0
        if suffix == "execution":
            self.executions = ExecutionTable()
        else:
            self.traces = TraceTable()
        return True

    def _read_executions(self, path):
        before = len(self.executions)
        for frames, base in wire.iter_frames(path, self.offsets["execution"]):
            self._damage.extend(str(c) for c in frames.corruptions)
            buf = frames.buf
            self.executions.add_records(
                [(base + s - records.HEADER_SIZE, buf[s : s + n]) for s, n in
                 zip(frames.starts.tolist(), frames.lengths.tolist())], path)
            self.offsets["execution"] = base + frames.next_pos
        return len(self.executions) != before

    def _read_traces(self, path, progress=None):
        before = len(self.traces)
        suffix = "graph_execution_traces"
        size = os.path.getsize(path)
        start = self.offsets[suffix]
        for frames, base in wire.iter_frames(path, start):
            self._damage.extend(str(c) for c in frames.corruptions)
            self.traces.add_frames(frames, base, path)
            self.offsets[suffix] = base + frames.next_pos
            if frames.next_pos and len(frames.starts):
                # Size the columns once from the first chunk's record density.
                per_record = frames.next_pos / len(frames.starts)
                left = max(0, size - self.offsets[suffix])
                self.traces.cols.reserve(len(self.traces) + int(left / per_record * 1.02) + 16)
            if progress is not None:
                progress(self.offsets[suffix] - start, max(size - start, 1))
        return len(self.traces) != before

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

