"""RunReader: one run (a directory of file sets), the API of docs/internals.md."""

import collections
import os
import threading

import numpy as np

from tb_numerics_plugin.reader import dataflow
from tb_numerics_plugin.reader import parallel
from tb_numerics_plugin.reader import steps as steps_lib
from tb_numerics_plugin.reader import health as health_lib
from tb_numerics_plugin.reader import trends as trends_lib
from tb_numerics_plugin.reader import views
from tb_numerics_plugin.filenames import FILE_RE
from tb_numerics_plugin.reader.fileset import FileSet


def _clip(begin, end, total):
    begin = 0 if begin is None else max(0, min(int(begin), total))
    end = total if end is None or int(end) < 0 else max(begin, min(int(end), total))
    return begin, end


def _check_index(index, total, what):
    if not isinstance(index, (int, np.integer)) or not 0 <= index < total:
        raise IndexError("%s index %r out of range [0, %d)" % (what, index, total))
    return int(index)


class RunReader:
    """Reads one run incrementally; every per-host method takes ``host=None`` (first host).

    Args:
      path: the run directory.
      name: the run name (directory relative to the logdir, "." for the logdir).
      sync: optional callable run first by each :meth:`update` (a remote logdir's
        mirror brought up to date, ``reader/remote.py``); its failure is a warning.

    Thread-safe: ``update()`` and the queries share one lock. :attr:`generation`
    counts the updates that indexed new data (analysis caches check it);
    :attr:`trends_generation` counts those that read new numerics series rows
    (:meth:`trends`), which leave :attr:`generation` alone: a series grows at
    every step of a live training while the traces may not.
    """

    def __init__(self, path, name=".", sync=None):
        self.path = path
        self.name = name
        self._sync = sync  # brings a remote run's local mirror up to date (reader/remote.py)
        self._filesets = collections.OrderedDict()  # label -> FileSet
        self._warnings = []
        self.lock = threading.RLock()
        self.generation = 0
        self._bad = {}
        self._flows = {}
        self._steps = {}
        self._failed = []
        self._series = {}  # label -> trends_lib.SeriesReader
        self._series_failed = []
        self.trends_generation = 0

    # -- discovery and update -------------------------------------------------

    def _discover(self):
        try:
            names = os.listdir(self.path)
        except OSError as e:
            self._warnings = ["%s: cannot list run directory: %s" % (self.path, e)]
            return
        self._warnings = []
        prefixes = sorted({os.path.join(self.path, n.rsplit(".", 1)[0])
                           for n in names if FILE_RE.match(n)})
        known = {fs.prefix for fs in self._filesets.values()}
        for prefix in prefixes:
            if prefix in known:
                continue
            fs = FileSet(prefix)
            if fs.label in self._filesets:
                fs.label = "%s#%d" % (fs.label, fs.timestamp)
            self._filesets[fs.label] = fs

    def update(self, progress=None, workers=None):
        """Indexes what was appended since the last call, and new file sets.

        When two or more file sets (hosts, ranks) each have at least
        :data:`parallel.PARALLEL_MIN_BYTES` unread, they are indexed in worker
        processes, one per core, and their indexes come back to this process;
        the answer is the same as reading them one after the other.

        Args:
          progress: optional callable ``(host, bytes_read, bytes_to_read)``,
            called as large trace files are read (for progress displays); a
            file set read by a worker reports once, when it is done.
          workers: processes to index file sets in (default: the cores this
            process may use); 1 reads everything in this process.

        Returns:
          bool: True if anything new was indexed.
        """
        with self.lock:
            self._failed, self._series_failed = [], []
            if self._sync is not None:
                try:
                    self._sync()
                except Exception as e:  # pylint: disable=broad-except
                    # the mirror as it stands is still read; the next update tries again
                    self._failed.append("run %s: %s" % (self.name, e))
            self._discover()
            grew = trends_grew = False
            with parallel.Workers(self._filesets, progress, workers) as elsewhere:
                for fs in list(self._filesets.values()):
                    if fs.label not in elsewhere.labels:  # this process's share
                        grew |= self._update_here(fs, progress)
                done = elsewhere.collect()
            for label in elsewhere.labels:  # what a worker could not index
                if label in done:
                    self._filesets[label] = done[label][0]
                    grew |= done[label][1]
                else:
                    grew |= self._update_here(self._filesets[label], progress)
            for fs in self._filesets.values():
                try:
                    trends_grew |= self._series_of(fs).update()
                except Exception as e:  # pylint: disable=broad-except
                    self._series_failed.append("%s: reading failed: %s: %s" % (
                        self._series_of(fs).path, type(e).__name__, e))
            if trends_grew:
                self.trends_generation += 1
            if grew:
                self.generation += 1
                self._bad.clear()
                self._flows.clear()
                self._steps.clear()
            return grew or trends_grew

    def _update_here(self, fs, progress):
        """``fs.update()`` in this process; a failure is said, never raised."""
        report = None if progress is None else (
            lambda done, total, label=fs.label: progress(label, done, total))
        try:
            return fs.update(report)
        except Exception as e:  # a bug of ours: said, and the other file sets still read
            self._failed.append("file set %s: reading failed: %s: %s"
                                % (fs.prefix, type(e).__name__, e))
            return False

    def _series_of(self, fs):
        series = self._series.get(fs.label)
        if series is None:
            series = self._series[fs.label] = trends_lib.SeriesReader(fs.prefix, fs.label)
        return series

    # -- run-level properties -------------------------------------------------

    @property
    def hosts(self):
        """Host labels, one per file set, sorted."""
        return sorted(self._filesets)

    @property
    def warnings(self):
        """Every warning of the run: damage (file, offset), missing files, no metadata."""
        out = list(self._warnings) + list(self._failed)
        for label in self.hosts:
            out.extend(self._filesets[label].warnings)
            if label in self._series:
                out.extend(self._series[label].warnings)
        out.extend(self._series_failed)
        if not self._filesets:
            out.append("%s: no tfdbg file set found" % self.path)
        return out

    @property
    def incomplete(self):
        """The warnings that mean records were lost or unreadable ([] when every record
        written was read): damaged or hostile records, truncated or missing files, empty
        files other files refer to, a writer's losses or a writer that did not close. Not
        informational ones such as a ring buffer's evictions."""
        out = list(self._warnings) + list(self._failed)
        for label in self.hosts:
            out.extend(self._filesets[label].losses)
        return out

    def trends(self, host=None):
        """The numerics series of ``host``'s file set (``<prefix>.numerics.tfevents``,
        :mod:`tb_numerics_plugin.series`): a
        :class:`~tb_numerics_plugin.reader.trends.SeriesReader`, read by :meth:`update`,
        empty when the file set has no series file. Call its methods under :attr:`lock`.
        Its damage warnings are among :attr:`warnings`, not :attr:`incomplete` (the
        series holds no record the inf/NaN analysis reads).

        Raises:
          KeyError: an unknown host.
        """
        fs = self.fileset(host)
        with self.lock:
            return self._series_of(fs)

    def writer_status(self, host=None):
        """The writer-status sidecar of ``host``'s file set, or None (none: TF's dumps).

        Returns:
          dict with the sidecar's fields (docs/format.md, "Writer status";
          wrong types neutralised) plus ``"notes"``: human sentences about
          evictions, losses and a writer that did not close. The same notes are
          in :attr:`warnings`. Raises KeyError for an unknown host.
        """
        fs = self.fileset(host)
        with self.lock:
            return fs.writer_status()

    def close(self):
        """Closes the file handles held for circular-buffer files (a later update reopens)."""
        with self.lock:
            for fs in self._filesets.values():
                fs.close()

    @property
    def tfdbg_run_ids(self):
        ids = {fs.metadata.get("tfdbg_run_id") for fs in self._filesets.values()}
        return sorted(i for i in ids if i)

    @property
    def tensor_debug_mode(self):
        """The mode of the graph traces (else of the executions), or "UNSPECIFIED"."""
        with self.lock:
            counts = collections.Counter()
            for fs in self._filesets.values():
                if len(fs.traces):
                    per_mode = np.bincount(fs.traces.modes())
                    counts.update({int(m): int(per_mode[m]) for m in np.flatnonzero(per_mode)})
            if not counts:
                for fs in self._filesets.values():
                    if len(fs.executions):
                        counts.update(fs.executions.cols["mode"].tolist())
            counts.pop(0, None)
            if not counts:
                return "UNSPECIFIED"
            return health_lib.mode_name(counts.most_common(1)[0][0])

    def fileset(self, host=None):
        """The FileSet of ``host`` (None = first). Raises KeyError for an unknown host."""
        if host is None:
            if not self._filesets:
                raise KeyError("run %r has no file sets" % self.name)
            return self._filesets[self.hosts[0]]
        if host not in self._filesets:
            raise KeyError("run %r has no host %r (hosts: %s)" % (self.name, host, self.hosts))
        return self._filesets[host]

    # -- executions -------------------------------------------------------------

    def num_executions(self, host=None):
        return len(self.fileset(host).executions)

    def execution_digests(self, begin=0, end=None, host=None):
        fs = self.fileset(host)
        with self.lock:
            b, e = _clip(begin, end, len(fs.executions))
            return [views.execution_digest(fs, i) for i in range(b, e)]

    def execution(self, index, host=None):
        """Raises IndexError when out of range."""
        fs = self.fileset(host)
        with self.lock:
            return views.execution(fs, _check_index(index, len(fs.executions), "execution"))

    # -- graph execution traces -------------------------------------------------

    def num_graph_execution_traces(self, host=None):
        return len(self.fileset(host).traces)

    def graph_execution_trace_digests(self, begin=0, end=None, host=None):
        fs = self.fileset(host)
        with self.lock:
            b, e = _clip(begin, end, len(fs.traces))
            return [views.trace_digest(fs, i) for i in range(b, e)]

    def graph_execution_trace(self, index, host=None):
        """Raises IndexError when out of range."""
        fs = self.fileset(host)
        with self.lock:
            return views.trace(fs, _check_index(index, len(fs.traces), "graph execution trace"))

    def find_graph_execution_traces(self, op_type=None, name_contains=None, bad_only=False,
                                    host=None, step=None):
        """Indices of traces matching every given filter (``step``: that training step
        only), as an int64 array."""
        fs = self.fileset(host)
        with self.lock:
            keys = fs.traces.keys
            ok = np.ones(len(keys), bool)
            for k in range(len(keys)):
                if name_contains is not None and name_contains not in keys.op_name[k]:
                    ok[k] = False
                elif op_type is not None:
                    op = fs.graphs.op(keys.context[k], keys.op_name[k])
                    ok[k] = op is not None and op.op_type == op_type
            mask = ok[fs.traces.cols["key"]] if len(keys) else np.zeros(0, bool)
            if bad_only:
                mask = mask & self._bad_mask(fs, "traces")
            if step is not None:
                mask = mask & (fs.traces.steps() == int(step))
            return np.flatnonzero(mask).astype(np.int64)

    # -- training steps ---------------------------------------------------------

    def step_index(self, host=None):
        """The :class:`~tb_numerics_plugin.reader.steps.StepIndex` of one host (built on
        first use, dropped when ``update()`` indexes new data)."""
        fs = self.fileset(host)
        with self.lock:
            index = self._steps.get(fs.label)
            if index is None:
                index = self._steps[fs.label] = steps_lib.StepIndex(
                    fs.executions.steps(), fs.traces.steps())
            return index

    def steps(self, host=None):
        """The distinct training steps marked on ``host``'s executions and traces, sorted
        ([] for a dump without steps, such as TF's)."""
        return self.step_index(host).steps.tolist()

    def first_at_step(self, step, kind="execution", host=None):
        """Where to jump for ``step``: the first record of ``kind`` in the smallest
        marked step >= ``step`` that ``kind``'s records hold.

        Args:
          step: an int.
          kind: "execution" or "graph_execution_trace".

        Returns:
          ``(step, index)``, or None when no record of ``kind`` has a step >= ``step``.

        Raises:
          KeyError: an unknown kind or host.
        """
        return self.step_index(host).at_or_after(int(step), kind)

    def _bad_mask(self, fs, table):
        cached = self._bad.get((fs.label, table))
        if cached is not None:
            return cached
        if table == "traces":
            mask = health_lib.bad_mask(fs.traces.modes(), fs.traces.cols["values"])
        else:
            c = fs.executions.cols
            mask = health_lib.bad_mask(c["mode"], c["values"])
        self._bad[(fs.label, table)] = mask
        return mask

    def bad_trace_indices(self, host=None):
        fs = self.fileset(host)
        with self.lock:
            return np.flatnonzero(self._bad_mask(fs, "traces")).astype(np.int64)

    def bad_execution_indices(self, host=None):
        fs = self.fileset(host)
        with self.lock:
            return np.flatnonzero(self._bad_mask(fs, "executions")).astype(np.int64)

    def dataflow(self, host=None):
        """The :class:`~tb_numerics_plugin.reader.dataflow.DataFlow` queries of one host
        (built on first use, dropped when ``update()`` indexes new data)."""
        fs = self.fileset(host)
        with self.lock:
            flow = self._flows.get(fs.label)
            if flow is None:
                flow = self._flows[fs.label] = dataflow.DataFlow(fs)
            return flow

    # -- graphs, stacks, sources ------------------------------------------------

    def graph_ids(self, host=None):
        return list(self.fileset(host).graphs.graph_order)

    def graph_info(self, graph_id, host=None):
        """Raises KeyError for an unknown graph."""
        return views.graph_info(self.fileset(host), graph_id)

    def op_info(self, graph_id, op_name, host=None):
        """Raises KeyError for an unknown graph or op."""
        fs = self.fileset(host)
        with self.lock:
            return views.op_info(fs, graph_id, op_name)

    def stack_frames(self, ids, host=None):
        """Raises KeyError naming the first unknown id."""
        fs = self.fileset(host)
        return [views.stack_frame(fs, i) for i in ids]

    def source_files(self, host=None):
        fs = self.fileset(host)
        return [
            {"index": i, "host_name": h, "file_path": p, "num_lines": n}
            for i, (_, p, h, n) in enumerate(fs.graphs.source_files)
        ]

    def source_file(self, index, host=None):
        """Raises IndexError for an unknown index, RecordUnavailable (a KeyError) when its
        record can no longer be read."""
        fs = self.fileset(host)
        files = fs.graphs.source_files
        index = _check_index(index, len(files), "source file")
        _, path, host_name, _ = files[index]
        return {
            "index": index,
            "host_name": host_name,
            "file_path": path,
            "lines": views.source_lines(fs, index),
        }
