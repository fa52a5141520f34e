"""Framed records put in a file whole or not at all: the writer's two ways to disk.

:func:`append` adds records to the end of a streamed file; a write that stops
part-way (ENOSPC, EFBIG, EIO) is cut back to the last whole record, so a file
never keeps half a record. :func:`replace` writes a file's whole new content to a
temporary file renamed over it, so a reader sees either the old content or the
new one. Neither raises for write errors: they come back as the OSError that
stopped the write, for the caller to count (``writer.FileSetWriter``).
"""

import errno as errno_codes
import os

from tb_numerics_plugin import records

TMP_SUFFIX = ".tmp"  # replace()'s temporary file: the path with this added


def errno_name(exc):
    """The errno's symbolic name of ``exc`` ("ENOSPC"), else its type's name."""
    return errno_codes.errorcode.get(exc.errno, "OSError") if exc.errno else type(exc).__name__


def write_all(fd, data):
    """Writes ``data`` to ``fd``; returns the bytes written and the OSError that stopped it."""
    done, view = 0, memoryview(data)
    try:
        while done < len(data):
            done += os.write(fd, view[done:])
    except OSError as exc:
        return done, exc
    return done, None


def append(fd, size, payloads):
    """Appends ``payloads`` framed to the file ``fd``, which holds ``size`` bytes of whole
    records.

    Returns:
      ``(records on disk, the file's size of whole records now, OSError or None)``.
    """
    data = records.encode_all(payloads)
    done, exc = write_all(fd, data)
    if exc is None:
        return len(payloads), size + done, None
    n = kept = 0
    for payload in payloads:
        framed = records.HEADER_SIZE + len(payload) + records.FOOTER_SIZE
        if kept + framed > done:
            break
        kept += framed
        n += 1
    if done > kept:
        try:
            os.ftruncate(fd, size + kept)
        except OSError:  # the reader tolerates a half-written last record
            pass
    return n, size + kept, exc


def replace(path, payloads):
    """Makes ``payloads``, framed, the whole content of ``path``, written first to the
    temporary file ``path + TMP_SUFFIX``.

    Returns:
      None when done; else the OSError that stopped it, the old content left in place
      and the temporary file removed.
    """
    tmp = path + TMP_SUFFIX
    data = records.encode_all(payloads)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            _, exc = write_all(fd, data)
        finally:
            os.close(fd)
        if exc is not None:
            raise exc
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return exc
    return None
