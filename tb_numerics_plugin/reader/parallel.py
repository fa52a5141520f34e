"""The file sets of one run indexed in parallel: worker processes, one per core.

``RunReader.update`` hands this module the run's file sets. Where two or more of
them have at least :data:`PARALLEL_MIN_BYTES` unread (hosts, ranks), they are split
into groups of about equal bytes, one per core: the reading process keeps the
first group, and each file set of the others is indexed by a fresh interpreter
(``python -m tb_numerics_plugin.reader.worker``) whose index comes back pickled.
"""

import concurrent.futures
import logging
import os
import pickle
import subprocess
import sys
import tempfile

_log = logging.getLogger(__name__)

# A file set with less unread trace and execution bytes than this is read in this process:
# below it a worker's start and the trip of the index back cost more than they save.
PARALLEL_MIN_BYTES = 32 << 20
_BULK_SUFFIXES = ("graph_execution_traces", "execution")


def cores():
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _unread_bytes(fs):
    """Bytes of the trace and execution files of ``fs`` past what it indexed (0 if unreadable)."""
    total = 0
    for suffix in _BULK_SUFFIXES:
        try:
            total += max(0, os.stat(fs.path(suffix)).st_size - fs.offsets[suffix])
        except OSError:
            pass
    return total


def _index_elsewhere(fs):
    """``fs.update()`` in a fresh interpreter (``python -m tb_numerics_plugin.reader.worker``).

    A child started from nothing, not ``multiprocessing``: a forked one inherits the locks
    the plugin's threads hold, and a spawned one re-imports the caller's ``__main__``.

    Returns:
      ``(fs, grew)``, the file set as the child indexed it; None when the child failed or
      ``fs`` came to hold file handles, which cannot travel: the caller then reads ``fs``.
    """
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    # The index comes back through a file, read at once: through a pipe the child waits on
    # every read this process makes while it holds the GIL.
    fd, path = tempfile.mkstemp(prefix="tb_numerics_index_", suffix=".pickle")
    try:
        with os.fdopen(fd, "wb") as out:
            proc = subprocess.run(
                [sys.executable, "-m", "tb_numerics_plugin.reader.worker"],
                input=pickle.dumps(fs, protocol=pickle.HIGHEST_PROTOCOL),
                stdout=out, stderr=subprocess.PIPE, env=env, check=False)
        if proc.returncode == 0:
            with open(path, "rb") as f:
                return pickle.load(f)
        problem = "exit %d: %s" % (proc.returncode, proc.stderr.decode(errors="replace")[-2000:])
    except Exception as e:  # pylint: disable=broad-except
        # whatever went wrong in the child or its answer, this process reads the file set
        problem = repr(e)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    _log.info("indexing %s in a worker failed (%s); reading it here", fs.label, problem)
    return None


def _balanced(sizes, groups):
    """Labels of ``sizes`` ({label: bytes}) split into at most ``groups`` lists of about
    equal total bytes (each label to the lightest list, largest first)."""
    out = [[] for _ in range(groups)]
    totals = [0] * groups
    for label in sorted(sizes, key=sizes.get, reverse=True):
        k = totals.index(min(totals))
        out[k].append(label)
        totals[k] += sizes[label]
    return [g for g in out if g]


class Workers:
    """The file sets of one update indexed by child processes while this process reads its
    own share (``RunReader.update``).

    With ``workers`` = N cores and two or more file sets of at least
    :data:`PARALLEL_MIN_BYTES` unread, those are split into N groups of about equal bytes;
    this process keeps the first, the others go to N - 1 children, one file set per child
    (a child's start costs about 0.3 s of imports), started when the block is entered.

    Attributes:
      labels: the labels sent to children (empty when there are none).
    """

    def __init__(self, filesets, progress, workers):
        workers = cores() if workers is None else int(workers)
        # One file set, or one core: nothing to share, not even a stat per file.
        unread = {label: _unread_bytes(fs) for label, fs in filesets.items()} \
            if workers > 1 and len(filesets) > 1 else {}
        big = {label: n for label, n in unread.items() if n >= PARALLEL_MIN_BYTES}
        groups = _balanced(big, workers) if len(big) > 1 else []
        # largest first: the children's slots fill with the longest work
        self.labels = sorted((label for g in groups[1:] for label in g), key=unread.get,
                             reverse=True)
        self._filesets = filesets
        self._progress = progress
        self._unread = unread
        self._pool = None
        self._futures = {}
        self._slots = max(1, workers - 1)

    def __enter__(self):
        if self.labels:
            # Threads here only wait on the children.
            self._pool = concurrent.futures.ThreadPoolExecutor(self._slots)
            self._futures = {self._pool.submit(_index_elsewhere, self._filesets[label]): label
                             for label in self.labels}
        return self

    def collect(self):
        """Waits for the children: ``{label: (indexed file set, grew)}`` of those that
        indexed theirs."""
        done = {}
        for future in concurrent.futures.as_completed(self._futures):
            label = self._futures[future]
            result = future.result()
            if result is not None:
                done[label] = result
                if self._progress is not None:
                    self._progress(label, self._unread[label], self._unread[label])
        return done

    def __exit__(self, *exc):
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        return False
