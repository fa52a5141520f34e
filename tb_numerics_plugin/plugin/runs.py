"""The runs under TensorBoard's logdir: one shared reader per run, kept fresh cheaply.

TensorBoard serves requests on threads. Each run gets one ``RunReader``
for the life of the process and one lock: a request holds the lock while it
reads, so a concurrent ``update()`` never changes the tables under it.
Freshness is throttled: a run is updated (incrementally, only the bytes
appended since the last call) at most once per ``update_interval_s``, and
the logdir is re-walked for new runs at most once per ``discover_interval_s``.
"""

import contextlib
import logging
import threading
import time

from tb_numerics_plugin.reader import DumpError, Logdir

logger = logging.getLogger(__name__)


class _Run:
    """A run's reader, its lock and when it was last updated."""

    def __init__(self, reader):
        self.reader = reader
        self.lock = threading.Lock()
        self.updated_at = None


class RunRegistry:
    """Discovers runs and hands out their shared, throttled-fresh readers.

    Args:
      logdir: TensorBoard's logdir; empty or None means no runs.
      update_interval_s: least time between two ``update()`` calls of a run.
      discover_interval_s: least time between two walks of the logdir.
      active_interval_s: least time between two ``has_dumps()`` checks.
      clock: a monotonic clock in seconds (tests may pass their own).
    """

    def __init__(
        self,
        logdir,
        update_interval_s=1.0,
        discover_interval_s=1.0,
        active_interval_s=5.0,
        clock=time.monotonic,
    ):
        self._logdir = None
        if logdir:
            try:
                self._logdir = Logdir(logdir)
            except DumpError as e:  # a URL whose filesystem is missing: no runs, said once
                logger.error("tb-numerics: cannot read the logdir: %s", e)
        self._update_interval_s = update_interval_s
        self._discover_interval_s = discover_interval_s
        self._active_interval_s = active_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._runs = {}
        self._names = []
        self._discovered_at = None
        self._active = False
        self._active_checked_at = None

    def has_dumps(self):
        """Returns whether the logdir holds a dump (cheap; re-checked at most every few seconds)."""
        if self._logdir is None:
            return False
        with self._lock:
            now = self._clock()
            stale = self._active_checked_at is None or (
                now - self._active_checked_at >= self._active_interval_s
            )
            # Once dumps were seen, answer at once: listing must stay cheap.
            if stale and not self._active:
                self._active = bool(self._logdir.has_dumps())
                self._active_checked_at = now
            return self._active

    def names(self):
        """Returns the run names, re-discovering them when the last walk is stale.

        Returns:
          list of str: run names, sorted, as ``Logdir.runs()`` names them.
        """
        if self._logdir is None:
            return []
        with self._lock:
            now = self._clock()
            due = self._discovered_at is None or (
                now - self._discovered_at >= self._discover_interval_s
            )
            if due:
                try:
                    self._names = sorted(self._logdir.runs())
                except DumpError:
                    # The logdir may not exist yet: TensorBoard can start first.
                    self._names = []
                self._discovered_at = now
            return list(self._names)

    def _get(self, name):
        """Returns the ``_Run`` for a known run name, or None."""
        with self._lock:
            run = self._runs.get(name)
        # Only names not served yet need the (throttled) logdir walk.
        if run is not None or name not in self.names():
            return run
        with self._lock:
            run = self._runs.get(name)
            if run is None:
                try:
                    run = _Run(self._logdir.run(name))
                except KeyError:
                    # Listed a moment ago, gone now (directory removed).
                    return None
                self._runs[name] = run
            return run

    @contextlib.contextmanager
    def open(self, name):
        """Yields the run's reader, locked and updated if the last update is stale.

        A failing ``update()`` (a dump being rewritten, a file removed) is
        logged with its traceback; what was indexed before stays served.

        Args:
          name: a run name as :meth:`names` lists it.

        Yields:
          RunReader, or None when no such run exists.
        """
        run = self._get(name)
        if run is None:
            yield None
            return
        with run.lock:
            now = self._clock()
            if run.updated_at is None or now - run.updated_at >= self._update_interval_s:
                try:
                    run.reader.update()
                except Exception:  # pylint: disable=broad-except
                    logger.exception("numerics plugin: updating run %r failed", name)
                run.updated_at = self._clock()
            yield run.reader

    def read_in_background(self):
        """Starts indexing every run now, on a daemon thread, so the first request finds it read.

        TensorBoard's page takes seconds to load before our tab asks for
        anything; reading during that time is what makes the first alert
        appear at once. Requests that arrive meanwhile wait on the run's
        lock, exactly as they would for their own first update. Errors are
        logged, never raised: serving does not depend on this head start.

        Returns:
          threading.Thread: the started thread (tests join it).
        """
        thread = threading.Thread(target=self._read_all, name="numerics-read", daemon=True)
        thread.start()
        return thread

    def _read_all(self):
        try:
            for name in self.names():
                with self.open(name):
                    pass
        except Exception:  # pylint: disable=broad-except
            logger.exception("numerics plugin: background read of %s failed", self._logdir)
