"""Names of tfdbg2 dump files: one definition for the writer and the reader.

A file set is the six files one writer process (a host or rank) writes:
``tfdbg_events.<unix_seconds>.<host>[.<part>].<suffix>``, TensorFlow's naming
with an optional part (``rank3``) so ranks sharing a dump root never clash.
A writer that finds its name taken (two processes of one host starting in the
same second) adds a part naming its pid and a random token
(:func:`collision_part`, e.g. ``tfdbg_events.1700000000.host.p4242x9f3a``).
"""

import errno
import os
import re
import secrets
import socket
import time

PREFIX = "tfdbg_events"
SUFFIXES = (
    "metadata",
    "source_files",
    "stack_frames",
    "graphs",
    "execution",
    "graph_execution_traces",
)
# The writer's own sidecar beside the six files (not part of tfdbg2: TensorFlow's
# reader ignores it): what the writer kept, dropped and lost, in fixed-size JSON
# rewritten in place (docs/format.md, "Writer status").
STATUS_SUFFIX = "writer_status.json"
_CREATE_ATTEMPTS = 16
_O_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
# Groups: unix seconds, host label (host plus any part), suffix.
FILE_RE = re.compile(r"^%s\.(\d+)\.(.+)\.(%s)$" % (PREFIX, "|".join(SUFFIXES)))


def file_set_prefix(dump_root, host_name=None, part=None, unix_seconds=None):
    """Returns the path prefix of a file set (everything before ``.<suffix>``)."""
    host_name = host_name or socket.gethostname()
    stamp = int(time.time() if unix_seconds is None else unix_seconds)
    name = "%s.%d.%s" % (PREFIX, stamp, host_name)
    if part:
        name += "." + part
    return os.path.join(dump_root, name)


def collision_part(pid=None):
    """Returns the extra name part a writer adds when its file-set name is taken.

    ``p<pid>x<4 hex digits>``: the pid keeps labels readable, the random token
    keeps two attempts of one process (or a reused pid) apart.
    """
    return "p%dx%s" % (os.getpid() if pid is None else pid, secrets.token_hex(2))


def create_file_set(dump_root, host_name=None, part=None):
    """Claims a new file set: creates its six files and the status sidecar exclusively,
    the metadata file first, under a name no other writer holds.

    A taken name (another process of this host started in the same second)
    gets a :func:`collision_part`; no existing file is ever opened.

    Returns:
      (prefix, {suffix: fd}): the six files open for appending, the sidecar
      (``STATUS_SUFFIX``) open without ``O_APPEND`` (Linux ``pwrite`` would
      ignore its offset) for in-place rewrites.

    Raises:
      OSError: a file cannot be created (or every attempted name was taken).
    """
    base = file_set_prefix(dump_root, host_name, part)
    prefix = base
    for _ in range(_CREATE_ATTEMPTS):
        fds = {}
        try:
            for suffix in SUFFIXES:
                fds[suffix] = os.open("%s.%s" % (prefix, suffix), _O_CREATE | os.O_APPEND, 0o666)
            fds[STATUS_SUFFIX] = os.open("%s.%s" % (prefix, STATUS_SUFFIX), _O_CREATE, 0o666)
            return prefix, fds
        except OSError as exc:
            for suffix, fd in fds.items():  # ours alone: created a moment ago
                os.close(fd)
                os.unlink("%s.%s" % (prefix, suffix))
            if not isinstance(exc, FileExistsError):
                raise
            prefix = "%s.%s" % (base, collision_part())
    raise FileExistsError(errno.EEXIST, "no free file-set name after %d attempts"
                          % _CREATE_ATTEMPTS, base)
