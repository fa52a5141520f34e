"""Logdirs on object storage: fsspec URLs (``s3://``, ``gs://``, ...) read through a local mirror.

The reader reads local files by offset (and knows a rewritten file by its inode), so a
remote logdir is mirrored: :meth:`Mirror.sync` lists the remote tree and, per dump file,

- fetches only the bytes past what the mirror holds, with one range request, and appends
  them (the usual case: tfdbg2 files grow by appends);
- fetches a file whole, into a new local file renamed over the old one (a new inode, as a
  rewrite looks locally), when it shrank or its first bytes changed (a circular buffer
  rewritten at each flush), and always for the writer-status sidecar (rewritten in place);
- removes mirrored files that are gone remotely.

The reader then reads the mirror as any local logdir, incrementally. ``file://`` URLs are
plain local paths. Needs ``fsspec`` and the filesystem's own package (``s3fs``, ``gcsfs``;
``pip install 'tb-numerics[remote]'`` brings fsspec and s3fs); credentials and endpoints
come from the filesystem's usual configuration (for s3fs: ``AWS_*`` variables, including
``AWS_ENDPOINT_URL`` for an S3-compatible server).
"""

import hashlib
import os
import re
import tempfile
import threading

from tb_numerics_plugin import series
from tb_numerics_plugin.filenames import FILE_RE, STATUS_SUFFIX

_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_HEAD = 64  # bytes compared to tell an appended file from a rewritten one
# Bytes per range request, one request at a time. Few large requests: on a moto server on
# loopback one 200 MB request ran at 457 MB/s, 64 MB ones at 193 MB/s, four concurrent 50 MB
# ones at 269 MB/s (docs/benchmarks.md, "Reader on S3"). Peak memory of a fetch: one chunk.
_CHUNK = 256 << 20
# What a listing says of an object's version, by filesystem (S3 ETag, GCS generation, mtime).
_VERSION_KEYS = ("ETag", "etag", "generation", "LastModified", "mtime", "updated")


def is_url(path):
    """Whether ``path`` is a URL of a remote filesystem (``file://`` is local: False)."""
    m = _URL.match(str(path))
    return bool(m) and m.group(1).lower() != "file"


def local_path(path):
    """``path`` without a ``file://`` scheme."""
    text = str(path)
    return text[len("file://"):] if text.lower().startswith("file://") else text


def _mirrored(name):
    """Whether a file of this name is part of a dump the reader reads."""
    return bool(FILE_RE.match(name)) or name.endswith("." + STATUS_SUFFIX) or \
        name.endswith("." + series.SUFFIX)


class RemoteError(Exception):
    """A remote logdir that cannot be read (no fsspec, unknown scheme, listing failed)."""


class Mirror:
    """A local copy of a remote logdir, brought up to date by :meth:`sync`.

    Args:
      url: the logdir's URL (``s3://bucket/logs``).
      cache_dir: where to mirror (default: a directory named after the URL under
        ``$TB_NUMERICS_MIRROR``, else under the system temp dir; the processes of a user
        that read the same URL share it).

    Attributes:
      url, local_root: the URL and its local mirror directory.

    Raises:
      RemoteError: fsspec (or the scheme's filesystem package) is missing.
    """

    def __init__(self, url, cache_dir=None):
        try:
            import fsspec  # pylint: disable=import-outside-toplevel
        except ImportError as e:
            raise RemoteError("%s: reading a remote logdir needs fsspec (pip install "
                              "'tb-numerics[remote]'): %s" % (url, e)) from None
        try:
            self._fs, self._root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as e:
            raise RemoteError("%s: %s" % (url, e)) from None
        self._root = self._root.rstrip("/")
        self.url = url
        digest = hashlib.sha256(url.encode()).hexdigest()[:16]
        base = os.environ.get("TB_NUMERICS_MIRROR") or os.path.join(
            tempfile.gettempdir(), "tb-numerics-mirror-%d" % getattr(os, "getuid", lambda: 0)())
        self.local_root = cache_dir or os.path.join(base, digest)
        os.makedirs(self.local_root, exist_ok=True)
        self._lock = threading.Lock()
        self._versions = {}  # relative path -> the version the mirror last synced

    def _remote_files(self, under):
        """``{relative path: (size, version or None)}`` of the dump files under ``under`` (a
        remote path); the version is what the listing says of the object (``_VERSION_KEYS``)."""
        try:
            self._fs.invalidate_cache(under)  # fsspec caches listings: a live dump grows
            found = self._fs.find(under, detail=True)
        except FileNotFoundError:
            return {}
        except Exception as e:  # botocore/aiohttp errors: said with the URL
            raise RemoteError("%s: cannot list: %s: %s" % (self.url, type(e).__name__, e))
        out = {}
        for path, info in found.items():
            if info.get("type", "file") != "file":
                continue
            rel = path[len(self._root):].lstrip("/")
            if _mirrored(rel.rsplit("/", 1)[-1]):
                version = next((info[k] for k in _VERSION_KEYS if info.get(k)), None)
                out[rel] = (int(info.get("size") or 0), version)
        return out

    def sync(self, run=None):
        """Brings the mirror of the logdir (or of run directory ``run``) up to date.

        Returns:
          the number of bytes fetched.

        Raises:
          RemoteError: the listing failed (a file that fails to fetch is left as it was
          and fetched again at the next sync).
        """
        prefix = "" if run in (None, ".") else run.strip("/") + "/"
        with self._lock:
            # paths relative to the logdir's root, the run's prefix included
            remote = self._remote_files(self._root + ("/" + prefix.rstrip("/") if prefix else ""))
            fetched = 0
            for rel, (size, version) in sorted(remote.items()):
                try:
                    fetched += self._sync_file(rel, size, version)
                except OSError:
                    continue  # a remote read that failed: tried again at the next sync
            self._drop_vanished(prefix, remote)
            return fetched

    def _sync_file(self, rel, size, version):
        local = os.path.join(self.local_root, *rel.split("/"))
        remote = self._root + "/" + rel
        have = os.path.getsize(local) if os.path.exists(local) else 0
        if version is not None and have == size and self._versions.get(rel) == version:
            return 0  # unchanged since the last sync
        whole = rel.endswith("." + STATUS_SUFFIX) or size < have
        if not whole and have:
            with open(local, "rb") as f:
                head = f.read(_HEAD)
            if self._fs.cat_file(remote, start=0, end=len(head)) != head:
                whole = True  # rewritten from its start (a circular buffer's new generation)
        if whole or not have:
            fetched = self._fetch_whole(remote, local, size)
        elif size == have:
            fetched = 0
        else:
            with open(local, "ab") as f:
                fetched = self._copy_range(remote, have, size, f)
        self._versions[rel] = version  # only once fetched: a failed fetch is tried again
        return fetched

    def _copy_range(self, remote, start, end, f):
        """Writes bytes [start, end) of ``remote`` to ``f`` with range requests of
        :data:`_CHUNK` bytes, one after the other. Returns the bytes written."""
        written = 0
        while start + written < end:
            part = self._fs.cat_file(remote, start=start + written,
                                     end=min(end, start + written + _CHUNK))
            f.write(part)
            written += len(part)
            if not part:  # the object is shorter than listed: done for now
                break
        return written

    def _fetch_whole(self, remote, local, size):
        os.makedirs(os.path.dirname(local), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(local), prefix=".fetch.")
        try:
            with os.fdopen(fd, "wb") as f:
                written = self._copy_range(remote, 0, size, f)
            os.replace(tmp, local)  # a new inode: the reader sees a rewritten file
            return written
        except BaseException:
            os.unlink(tmp)
            raise

    def _drop_vanished(self, prefix, remote):
        base = os.path.join(self.local_root, *prefix.rstrip("/").split("/")) if prefix else \
            self.local_root
        for dirpath, _, filenames in os.walk(base):
            for name in filenames:
                if not _mirrored(name):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), self.local_root)
                if rel.replace(os.sep, "/") not in remote:
                    os.unlink(os.path.join(dirpath, name))
