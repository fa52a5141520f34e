"""The numerics series of one file set (``<prefix>.numerics.tfevents``), read incrementally.

The format is :mod:`tb_numerics_plugin.series`'s: TFRecord-framed
``tensorboard.Event`` protos, one per summarized step, holding one scalar per
(kind, stat, module) and dtype descriptors. Like the tfdbg2 files of
:mod:`reader.fileset`, the file is read from the offset where the previous
update stopped: a half-written last record waits for the next update (and is
said, file and offset, once the file has not changed for ``settle_s``
seconds); damaged bytes are said (file, offset) and skipped, every good
record before and after them is kept. A file that shrank or was replaced is
read again from its start.

Per kind the reader keeps one row per (step event, module): the step, the
module's index and the seven stats of :data:`series.STATS` (NaN where the
event left a stat out). A step written twice (a reopened file set, a
re-enabled capture) keeps its last row per module. Tables are built on first
use and dropped when an update reads new rows.
"""

import array
import os
import time

import numpy as np

from tb_numerics_plugin import records, series

_WIDTH = len(series.STATS)
_STAT_INDEX = {stat: i for i, stat in enumerate(series.STATS)}


def _copy(arr, dtype):
    """A numpy copy of an ``array.array`` (a view would pin it: appends would fail)."""
    return np.frombuffer(arr, dtype).copy() if len(arr) else np.zeros(0, dtype)


class _KindRows:
    """The rows of one kind: step, module index and the stats, in file order."""

    def __init__(self):
        self.modules = {}  # module -> index, first-seen order
        self.dtypes = []  # per module index: the dtype last declared ("" unknown)
        self.steps = array.array("q")
        self.module_ids = array.array("q")
        self.values = array.array("d")

    def module_id(self, module):
        index = self.modules.get(module)
        if index is None:
            index = self.modules[module] = len(self.dtypes)
            self.dtypes.append("")
        return index

    def add(self, step, module, stats):
        self.steps.append(step)
        self.module_ids.append(self.module_id(module))
        self.values.extend(stats)


class SeriesReader:
    """The numerics series of one host (file set): :meth:`update` reads what was appended.

    Args:
      prefix: the file set's path prefix; the file is ``series.path_for(prefix)``.
      host: the file set's host label (named in nothing but :attr:`host`).

    Attributes:
      path: the series file. host: the host label.
      generation: counts the updates that read new rows (caches check it).
      settle_s: a file unchanged for this long is finished: a partial record
        at its end is said among the warnings.

    Not thread-safe by itself: :class:`~tb_numerics_plugin.reader.run.RunReader`
    calls it under the run's lock.
    """

    settle_s = 60.0

    def __init__(self, prefix, host=None):
        self.path = series.path_for(prefix)
        self.host = host
        self.generation = 0
        self._reset()

    def _reset(self):
        self.offset = 0
        self._identity = None
        self._kinds = {}  # kind -> _KindRows
        self._events = 0
        self._damage = []
        self._tail = None
        self._tables = {}

    # -- reading ----------------------------------------------------------------

    def update(self):
        """Reads the records appended since the last call.

        Returns:
          bool: whether any new row (or dtype) was read, or the file was read
          again from its start.
        """
        self._tail = None
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            grew = self._events > 0 or bool(self._damage)
            if grew:  # the file went away: nothing of it is served any more
                self._reset()
                self.generation += 1
            return grew
        except OSError as e:
            self._tail = "%s: cannot read: %s" % (self.path, e)
            return False
        with f:
            st = os.fstat(f.fileno())
            restarted = False
            if self._identity is not None and (
                    self._identity != (st.st_dev, st.st_ino) or st.st_size < self.offset):
                self._reset()
                restarted = True
            self._identity = (st.st_dev, st.st_ino)
            grew = False
            if st.st_size > self.offset:
                grew = self._scan(f)
            end = os.fstat(f.fileno())
            if end.st_size > self.offset and time.time() - end.st_mtime >= self.settle_s:
                self._tail = ("%s: %d bytes at offset %d are an incomplete record (the writer "
                              "stopped mid-record: truncated?)"
                              % (self.path, end.st_size - self.offset, self.offset))
        if grew or restarted:
            self.generation += 1
            self._tables = {}
        return grew or restarted

    def _scan(self, f):
        def opener(_, mode):
            return os.fdopen(os.dup(f.fileno()), mode)

        grew = False
        for result in records.iter_scan(self.path, self.offset, opener):
            self._damage.extend(str(c) for c in result.corruptions)
            for offset, payload in result.records:
                grew |= self._on_record(offset, payload)
            self.offset = result.next_offset
        return grew

    def _on_record(self, offset, payload):
        try:
            step, _, values, descriptors = series.decode_event(payload)
        except ValueError as e:
            self._damage.append("%s: record at offset %d: %s; skipped" % (self.path, offset, e))
            return False
        for kind, _, module, dtype in descriptors:
            rows = self._rows(kind)
            rows.dtypes[rows.module_id(module)] = dtype
        if step is None or not values:
            return bool(descriptors)
        per_module = {}  # (kind, module) -> the stats of this event
        for kind, stat, _, module, value in values:
            row = per_module.get((kind, module))
            if row is None:
                row = per_module[(kind, module)] = [float("nan")] * _WIDTH
            row[_STAT_INDEX[stat]] = value
        for (kind, module), row in per_module.items():
            self._rows(kind).add(step, module, row)
        self._events += 1
        return True

    def _rows(self, kind):
        rows = self._kinds.get(kind)
        if rows is None:
            rows = self._kinds[kind] = _KindRows()
        return rows

    # -- queries ----------------------------------------------------------------

    @property
    def warnings(self):
        """Damaged or unreadable records (file, offset), then a stalled partial record."""
        return list(self._damage) + ([self._tail] if self._tail else [])

    @property
    def num_events(self):
        """Step events read (the file-version event not counted)."""
        return self._events

    def kinds(self):
        """The kinds holding rows, in :data:`series.KINDS` order."""
        return [k for k in series.KINDS if k in self._kinds and len(self._kinds[k].steps)]

    def modules(self, kind):
        """``[(module, dtype)]`` of ``kind`` in first-seen order (dtype "" when never
        declared, else the last declared); [] for a kind without rows."""
        rows = self._kinds.get(kind)
        if rows is None:
            return []
        return list(zip(rows.modules, rows.dtypes))

    def dtype(self, kind, module):
        """The last dtype declared for ``(kind, module)``, or "" (unknown)."""
        rows = self._kinds.get(kind)
        if rows is None or module not in rows.modules:
            return ""
        return rows.dtypes[rows.modules[module]]

    def steps(self, kind=None):
        """The distinct steps summarized (of ``kind``, or of any kind), sorted, as ints."""
        kinds = [kind] if kind is not None else list(self._kinds)
        parts = [_copy(self._kinds[k].steps, np.int64) for k in kinds if k in self._kinds]
        if not parts:
            return []
        return np.unique(np.concatenate(parts)).tolist()

    def table(self, kind, stat):
        """One stat of every module of ``kind`` at every step ``kind`` was summarized.

        Args:
          kind: one of :data:`series.KINDS`.
          stat: one of :data:`series.STATS`.

        Returns:
          ``(steps, modules, values)``: steps int64[n] sorted, modules [str] in
          first-seen order (m of them), values float64[m, n], NaN where a
          module has no value at a step. The arrays are shared: do not modify.

        Raises:
          KeyError: an unknown stat.
        """
        column = _STAT_INDEX[stat]
        key = (kind, stat)
        cached = self._tables.get(key)
        if cached is not None:
            return cached
        rows = self._kinds.get(kind)
        if rows is None or not len(rows.steps):
            out = (np.zeros(0, np.int64), [m for m, _ in self.modules(kind)],
                   np.zeros((len(self.modules(kind)), 0)))
        else:
            steps = _copy(rows.steps, np.int64)
            ids = _copy(rows.module_ids, np.int64)
            vals = _copy(rows.values, np.float64).reshape(-1, _WIDTH)[:, column]
            unique = np.unique(steps)
            cells = ids * len(unique) + np.searchsorted(unique, steps)
            # A cell written twice keeps its last row: the first of the reversed order.
            _, last = np.unique(cells[::-1], return_index=True)
            keep = len(cells) - 1 - last
            values = np.full(len(rows.dtypes) * len(unique), np.nan)
            values[cells[keep]] = vals[keep]
            out = (unique, list(rows.modules), values.reshape(len(rows.dtypes), len(unique)))
        self._tables[key] = out
        return out
