"""Logdir: finds runs (directories holding tfdbg2 file sets) under a root, recursively."""

import os
import threading

from tb_numerics_plugin.filenames import FILE_RE
from tb_numerics_plugin.reader import remote
from tb_numerics_plugin.reader.run import RunReader


class DumpError(Exception):
    """A logdir that cannot be read at all (missing, not a directory, unreadable)."""


class Logdir:
    """The runs under one directory, local or on object storage.

    Args:
      path: the logdir: a local path (``file://`` allowed) or an fsspec URL
        (``s3://bucket/logs``, read through a local mirror: ``reader/remote.py``). No I/O
        happens until a method is called.

    Attributes:
      path: the local directory read (for a URL, its mirror).
      location: what the user named: the URL, else ``path``.

    Raises:
      DumpError: a URL whose filesystem cannot be used (fsspec or its package missing).
    """

    def __init__(self, path):
        self._mirror = None
        if remote.is_url(path):
            try:
                self._mirror = remote.Mirror(str(path))
            except remote.RemoteError as e:
                raise DumpError(str(e)) from None
            self.path = self._mirror.local_root
            self.location = str(path)
        else:
            self.path = os.path.abspath(remote.local_path(path))
            self.location = self.path
        self._runs = {}
        self._names = None  # the run names of the last walk
        self._lock = threading.Lock()

    def _sync(self, run=None):
        """Brings the mirror of a remote logdir (or of one run) up to date; local: nothing."""
        if self._mirror is not None:
            try:
                self._mirror.sync(run)
            except remote.RemoteError as e:
                raise DumpError(str(e)) from None

    def _check(self):
        if not os.path.isdir(self.path):
            if os.path.exists(self.path):
                raise DumpError("%s: not a directory" % self.path)
            raise DumpError("%s: no such directory" % self.path)
        if not os.access(self.path, os.R_OK | os.X_OK):
            raise DumpError("%s: directory is not readable" % self.path)

    def runs(self):
        """Names of the runs, sorted: directories relative to the logdir ("." = itself).

        Walks the tree once per call and remembers the result for :meth:`run`.

        Raises:
          DumpError: the logdir is missing or unreadable.
        """
        self._sync()
        self._check()
        found = []
        for dirpath, dirnames, filenames in os.walk(self.path):
            dirnames.sort()
            if any(FILE_RE.match(f) for f in filenames):
                rel = os.path.relpath(dirpath, self.path)
                found.append(rel.replace(os.sep, "/"))
        found.sort()
        self._names = frozenset(found)
        return found

    def run(self, name):
        """The RunReader of run ``name`` (one cached instance per run).

        A name the last :meth:`runs` listed is opened without walking the
        tree again; an unknown one walks it once (it may have appeared since).

        Raises:
          KeyError: no run of that name.
        """
        with self._lock:
            reader = self._runs.get(name)
            if reader is not None:
                return reader
            if not isinstance(name, str):
                raise KeyError("no run %r in %s" % (name, self.path))
            path = os.path.normpath(os.path.join(self.path, name))
            inside = path == self.path or path.startswith(self.path + os.sep)
            if not inside or not os.path.isdir(path):
                raise KeyError("no run %r in %s" % (name, self.path))
            if self._names is None or name not in self._names:
                try:
                    self.runs()
                except DumpError:
                    pass
            if name not in (self._names or ()):
                raise KeyError("no run %r in %s" % (name, self.path))
            sync = None if self._mirror is None else (lambda name=name: self._sync(name))
            reader = self._runs[name] = RunReader(path, name, sync=sync)
            return reader

    def has_dumps(self):
        """True once any ``*.metadata`` file of a file set exists under the logdir."""
        if self._mirror is not None:
            try:
                self._sync()
            except DumpError:
                return False
        if not os.path.isdir(self.path):
            return False
        for _, dirnames, filenames in os.walk(self.path):
            for f in filenames:
                if f.endswith(".metadata") and FILE_RE.match(f):
                    return True
        return False
