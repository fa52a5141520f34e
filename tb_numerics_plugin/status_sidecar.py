"""A file-set writer's status sidecar and the write errors it reports.

The sidecar (``<prefix>.writer_status.json``, docs/format.md, "Writer status")
holds JSON padded to exactly :data:`STATUS_BYTES`, rewritten in place, so that
updating it needs no new disk blocks on a full disk. Write errors never reach the
program: the first one is kept in full for the sidecar, and each errno is logged
once.
"""

import json
import logging
import os

from tb_numerics_plugin import record_files

_log = logging.getLogger("tb_numerics_plugin.writer")

STATUS_VERSION = 1
STATUS_BYTES = 4096


class StatusSidecar:
    """One writer's sidecar file and its record of write errors.

    Not thread-safe: the writer calls it under its lock.

    Args:
      fd: the sidecar's open file descriptor, or None (nothing is written).
      path: its path, named in messages.

    Attributes:
      fd: the descriptor (None once closed); the writer sets it again on reopening.
      first_error: ``"path: message (ERRNO)"`` of the first write error, or None.
    """

    def __init__(self, fd, path):
        self.fd = fd
        self.path = path
        self.first_error = None
        self._logged = set()

    def presize(self):
        """Fills the file with :data:`STATUS_BYTES` spaces, the blocks every later write
        reuses; returns the OSError that stopped it, or None."""
        try:
            _, exc = record_files.write_all(self.fd, b" " * STATUS_BYTES)
        except OSError as exc_:
            exc = exc_
        return exc

    def write(self, status):
        """Writes the ``status`` dict over the file's content; never raises (a failure
        is logged once)."""
        if self.fd is None:
            return
        data = json.dumps(status).encode()
        if len(data) > STATUS_BYTES:  # only a huge error message can do this
            self.first_error = self.first_error[:200]
            data = json.dumps(dict(status, first_error=self.first_error)).encode()[:STATUS_BYTES]
        try:
            os.pwrite(self.fd, data.ljust(STATUS_BYTES), 0)
        except OSError as exc:
            self.log_once("status", "tb-numerics could not update %s: %s", self.path, exc)

    def failed(self, exc, path):
        """Notes a write error on ``path``.

        Returns:
          ``(errno name, whether it is the first error)``: after the first, the caller
          writes the sidecar, which now names it.
        """
        name = record_files.errno_name(exc)
        first = self.first_error is None
        if first:
            self.first_error = ("%s: %s (%s)" % (path, exc.strerror or exc, name))[:1000]
        self.log_once(name, "tb-numerics could not write %s (%s: %s); the program continues and "
                      "the records that missed the disk are counted in %s", path, name,
                      exc.strerror or exc, self.path)
        return name, first

    def log_once(self, key, message, *args):
        """Logs ``message`` as a warning the first time ``key`` comes."""
        if key not in self._logged:
            self._logged.add(key)
            _log.warning(message, *args)

    def close(self):
        """Closes the file; errors are ignored (the sidecar was written before)."""
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.fd = None
