"""The file-set writer's records between accepting them and the disk, and their counts.

``writer.FileSetWriter`` owns the files, the lock, the status sidecar and the
flush thread; :class:`RecordBuffers` owns the records in memory: each streamed
file's pending records, the rings of the last N executions and traces, and how
many records each file accepted, which reached the disk and which a write error
keeps off it. Its :meth:`RecordBuffers.flush` puts them on disk in the order
readers rely on: definitions (source files, stack frames, graphs) before the
executions and traces that point into them, so a reader never finds a trace whose
op, frames or source are not on disk.
"""

import collections

# Written first, in this order: executions and traces point into them.
DEFINITIONS = ("source_files", "stack_frames", "graphs")
BUFFERED = ("execution", "graph_execution_traces")
COUNTED = DEFINITIONS + BUFFERED


class RecordBuffers:
    """The records one writer accepted and has not written yet, and their counts.

    Not thread-safe: the writer calls it under its lock.

    Args:
      streamed: the suffixes whose records are appended to their files (each gets a
        pending list).
      ring_size: N > 0 keeps executions and traces as the last N, written whole at
        flushes; 0 or None: they are in ``streamed`` instead.

    Attributes:
      ring: ``{suffix: deque of the last N payloads}`` (empty when streaming).
      accepted: ``{suffix: records accepted}`` for the counted suffixes.
      lost: ``Counter`` of records dropped for good, by errno name.
    """

    def __init__(self, streamed, ring_size):
        self.ring = ({s: collections.deque(maxlen=ring_size) for s in BUFFERED}
                     if ring_size else {})
        self._pending = {s: [] for s in streamed}
        self._pending_bytes = 0
        self.accepted = dict.fromkeys(COUNTED, 0)
        self._ring_on_disk = dict.fromkeys(self.ring, 0)  # accepted count at the last rewrite
        self._blocked = dict.fromkeys(COUNTED)  # suffix -> errno name keeping its records off disk
        self.lost = collections.Counter()

    def extend_ring(self, suffix, payloads):
        """Adds ``payloads`` to ``suffix``'s ring; False when ``suffix`` has none (it
        streams)."""
        ring = self.ring.get(suffix)
        if ring is None:
            return False
        self.accepted[suffix] += len(payloads)
        ring.extend(payloads)
        return True

    def add(self, suffix, payload):
        """Queues one payload for ``suffix``'s file; returns the bytes now pending."""
        self.accepted[suffix] += 1
        self._pending[suffix].append(payload)  # (a flush may replace the list)
        self._pending_bytes += len(payload)
        return self._pending_bytes

    def flush(self, append, replace, rewrite_ring=True):
        """Writes what is pending, definitions first.

        Args:
          append: ``append(suffix, payloads)`` appends to ``suffix``'s file and returns
            ``(records on disk, errno name or None)``.
          replace: ``replace(suffix, payloads)`` rewrites ``suffix``'s file whole and
            returns the errno name or None.
          rewrite_ring: False leaves the rings' files as they are.

        Returns:
          bool: whether the records lost or held back changed.
        """
        before = sum(self.lost.values()), tuple(self._blocked.values())
        blocked = None
        for suffix in DEFINITIONS:
            pending = self._pending[suffix]
            if pending and blocked is None:
                n, blocked = append(suffix, pending)
                del pending[:n]  # the rest is kept for the next flush: traces need them
            self._blocked[suffix] = blocked if pending else None
        for suffix in BUFFERED:
            if suffix in self.ring:
                if rewrite_ring and self._ring_on_disk[suffix] != self.accepted[suffix]:
                    self._rewrite(suffix, replace, blocked)
                continue
            pending = self._pending[suffix]
            if pending:
                # Not attempted when their definitions could not be written.
                n, error = append(suffix, pending) if blocked is None else (0, blocked)
                if n < len(pending):
                    self.lost[error] += len(pending) - n
                pending.clear()
        # Definitions held back by an error wait for the next timed flush: counting them
        # here would make every write retry a failing disk.
        self._pending_bytes = 0
        return before != (sum(self.lost.values()), tuple(self._blocked.values()))

    def _rewrite(self, suffix, replace, blocked):
        if blocked is None:
            accepted = self.accepted[suffix]
            blocked = replace(suffix, self.ring[suffix])
            if blocked is None:
                self._ring_on_disk[suffix] = accepted
        self._blocked[suffix] = blocked  # on an error the previous window stays

    def held_back(self):
        """Records an error keeps off the disk for now, by errno name: definitions pending
        behind it and ring records accepted since the last rewrite that are still held."""
        held = collections.Counter()
        for suffix in DEFINITIONS:
            if self._blocked[suffix]:
                held[self._blocked[suffix]] += len(self._pending[suffix])
        for suffix, ring in self.ring.items():
            if self._blocked[suffix]:
                held[self._blocked[suffix]] += min(
                    len(ring), self.accepted[suffix] - self._ring_on_disk[suffix])
        return held

    def evicted(self):
        """``{suffix: records a ring dropped to keep its last N}`` for executions and
        traces (0 when streaming)."""
        return {s: max(0, self.accepted[s] - len(self.ring[s])) if self.ring else 0
                for s in BUFFERED}

    def give_up(self):
        """At close, after the last flush: what errors still hold back is lost, and
        nothing is held any more."""
        self.lost.update(self.held_back())
        for suffix in DEFINITIONS:
            self._pending[suffix].clear()
        self._blocked = dict.fromkeys(COUNTED)

    def forget(self):
        """Drops every record without writing it (a forked child's copy)."""
        self._pending = {s: [] for s in self._pending}
        self.ring = {s: collections.deque() for s in self.ring}
