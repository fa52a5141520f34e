"""TFRecord framing of DebugEvent payloads, both directions.

A record on disk is::

    uint64 LE length | uint32 LE masked_crc32c(length bytes) | payload | uint32 LE masked_crc32c(payload)

with ``masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8`` (mod 2**32).

Reading is incremental: :func:`scan` starts at a byte offset, returns every
complete record after it together with the offset to resume from. A record
whose bytes are not all on disk yet (a writer mid-append) ends the scan
quietly; the next scan from the returned offset picks it up. A CRC mismatch is
reported as a :class:`CorruptRecord` naming the file and offset; the scan
skips the damaged bytes and keeps every good record before and after them.
"""

import dataclasses
import os
import struct

import crc32c
import numpy as np

HEADER_SIZE = 12
FOOTER_SIZE = 4
_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
# Longest payload we accept from a length field whose CRC checked out. Real
# records are kilobytes (a source file snapshot can be a few MB); a larger
# value means a corrupt header that happened to pass its CRC.
MAX_RECORD_BYTES = 1 << 30


def masked_crc32c(data):
    """Returns TFRecord's masked CRC-32C of ``data`` as an unsigned int."""
    crc = crc32c.crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32


def encode(payload):
    """Frames one serialized payload as a TFRecord.

    Args:
      payload: the serialized bytes.

    Returns:
      bytes: header, payload and footer.
    """
    length = _LENGTH.pack(len(payload))
    return b"".join(
        (length, _CRC.pack(masked_crc32c(length)), payload, _CRC.pack(masked_crc32c(payload)))
    )


_frame_c = None  # the reader extension's frame(), once looked up (False: not built)


def encode_all(payloads):
    """Frames each payload of ``payloads`` (a sequence of bytes) as :func:`encode`
    does and joins the records, in C where the reader's ``_frames`` extension was
    built: the writer's flushes frame every record they write, about a microsecond
    of Python each, in the thread that flushes while the program trains."""
    global _frame_c
    if _frame_c is None:
        try:  # imported on first use: the reader imports this module
            from tb_numerics_plugin.reader import _frames

            _frame_c = _frames.frame
        except Exception:  # not built, or the reader unusable here: a flush must not fail
            _frame_c = False
    if _frame_c:
        return _frame_c(payloads)
    return b"".join([encode(p) for p in payloads])


@dataclasses.dataclass(frozen=True)
class CorruptRecord:
    """Bytes of a file that failed their CRC and were skipped."""

    path: str
    offset: int
    skipped: int
    reason: str

    def __str__(self):
        return "%s: corrupt record at offset %d (%s); skipped %d bytes" % (
            self.path,
            self.offset,
            self.reason,
            self.skipped,
        )


@dataclasses.dataclass
class ScanResult:
    """What one :func:`scan` found.

    Attributes:
      records: list of ``(offset, payload)`` for each good record, in file order.
      next_offset: where the next scan resumes (start of the first incomplete record).
      corruptions: list of :class:`CorruptRecord`.
    """

    records: list
    next_offset: int
    corruptions: list


def _header_at(buf, pos):
    """Returns the payload length if a valid header starts at ``pos``, else None."""
    length_bytes = buf[pos : pos + 8]
    (crc,) = _CRC.unpack_from(buf, pos + 8)
    if masked_crc32c(length_bytes) != crc:
        return None
    (length,) = _LENGTH.unpack(length_bytes)
    if length > MAX_RECORD_BYTES:
        return None
    return length


def _record_at(buf, pos):
    """True when a whole valid record (both CRCs) starts at ``pos`` of ``buf``."""
    if len(buf) - pos < HEADER_SIZE + FOOTER_SIZE:
        return False
    length = _header_at(buf, pos)
    if length is None:
        return False
    stop = pos + HEADER_SIZE + length
    if stop + FOOTER_SIZE > len(buf):
        return False
    (crc,) = _CRC.unpack_from(buf, stop)
    return masked_crc32c(buf[pos + HEADER_SIZE : stop]) == crc


def _resync(buf, start):
    """Finds the next offset after ``start`` where a whole valid record begins.

    Only positions whose length field fits in 32 bits (its 4 high bytes zero,
    as for every record under :data:`MAX_RECORD_BYTES`) are CRC-checked, found
    with numpy, so skipping megabytes of damage stays fast.
    """
    end = len(buf) - HEADER_SIZE - FOOTER_SIZE
    if end <= start:
        return None
    arr = np.frombuffer(buf, np.uint8)
    first = start + 1
    window = arr[first + 4 : end + 8]
    if len(window) < 4:
        return None
    zero = window == 0
    # high[i]: bytes first+4+i .. first+7+i are all zero
    high = zero[:-3] & zero[1:-2] & zero[2:-1] & zero[3:]
    for rel in np.flatnonzero(high).tolist():
        pos = first + rel
        if pos > end:
            break
        if _record_at(buf, pos):
            return pos
    return None


def scan_buffer(buf, base_offset=0, path="<buffer>", final=True):
    """Splits ``buf`` (bytes read from ``base_offset`` of ``path``) into records.

    Args:
      buf: bytes-like.
      base_offset: file offset of ``buf[0]``.
      path: file name used in corruption reports.
      final: ``buf`` runs to the current end of the file. When False, damage
        with no good record after it inside ``buf`` is left for a later call
        with more bytes instead of being skipped.

    Returns:
      ScanResult with offsets relative to the file, not the buffer.
    """
    buf = memoryview(buf)
    records, corruptions = [], []
    pos, size = 0, len(buf)
    while size - pos >= HEADER_SIZE:
        length = _header_at(buf, pos)
        if length is None:
            nxt = _resync(buf, pos)
            if nxt is None:
                if not final:
                    break
                # No later record is whole: report the damage and resume
                # after it, so bytes appended later are read.
                corruptions.append(
                    CorruptRecord(path, base_offset + pos, size - pos, "length CRC mismatch")
                )
                pos = size
                break
            corruptions.append(
                CorruptRecord(path, base_offset + pos, nxt - pos, "length CRC mismatch")
            )
            pos = nxt
            continue
        stop = pos + HEADER_SIZE + length
        if stop + FOOTER_SIZE > size:
            nxt = _resync(buf, pos) if final else None
            if nxt is None:
                break  # half-written: resume here later
            # A whole record after it: this length (CRC or not) is a lie, not
            # a record still being written.
            corruptions.append(CorruptRecord(
                path, base_offset + pos, nxt - pos,
                "length %d runs past the end of the file" % length))
            pos = nxt
            continue
        (crc,) = _CRC.unpack_from(buf, stop)
        payload = buf[pos + HEADER_SIZE : stop]
        if masked_crc32c(payload) != crc:
            after = stop + FOOTER_SIZE
            if after <= size - HEADER_SIZE and not _record_at(buf, after):
                # The length leads nowhere valid: good records inside the
                # claimed span are kept (a half-written one after it too).
                nxt = _resync(buf, pos)
                if nxt is not None:
                    after = min(after, nxt)
            corruptions.append(
                CorruptRecord(path, base_offset + pos, after - pos, "payload CRC mismatch")
            )
            pos = after
            continue
        records.append((base_offset + pos, bytes(payload)))
        pos = stop + FOOTER_SIZE
    return ScanResult(records, base_offset + pos, corruptions)


def iter_chunks(path, offset, split, opener=open, chunk_size=8 << 20):
    """Reads ``path`` from ``offset`` a chunk at a time and splits each into records.

    Bytes a split leaves unconsumed (an incomplete last record) are carried
    into the next chunk, so memory stays bounded by ``chunk_size`` plus one
    record however large the file.

    Args:
      path: file to read.
      offset: byte offset to start at.
      split: callable ``(buf, base_offset, final) -> (result, consumed)``;
        ``final`` is True when ``buf`` reaches the current end of the file.
      opener: callable like :func:`open` (lets fsspec URLs through).
      chunk_size: bytes read per step.

    Yields:
      ``(result, base_offset)`` per chunk; the last ``base_offset +
      consumed`` is where the next read resumes.

    Raises:
      OSError: the file cannot be opened or read.
    """
    with opener(path, "rb") as f:
        f.seek(offset)
        carry = b""
        while True:
            chunk = f.read(chunk_size)
            final = len(chunk) < chunk_size
            buf = carry + chunk if carry else chunk
            result, consumed = split(buf, offset, final)
            yield result, offset
            carry = buf[consumed:]
            offset += consumed
            if final:
                return


def iter_scan(path, offset=0, opener=open, chunk_size=8 << 20):
    """Reads the complete records of ``path`` from ``offset`` on, a chunk at a time.

    Yields:
      ScanResult per chunk; the last one's ``next_offset`` is where to resume.

    Raises:
      OSError: the file cannot be opened or read.
    """

    def split(buf, base, final):
        result = scan_buffer(buf, base, path, final=final)
        return result, result.next_offset - base

    for result, _ in iter_chunks(path, offset, split, opener, chunk_size):
        yield result


def scan(path, offset=0, opener=open):
    """Like :func:`iter_scan`, all chunks merged into one ScanResult."""
    merged = ScanResult([], offset, [])
    for part in iter_scan(path, offset, opener):
        merged.records.extend(part.records)
        merged.corruptions.extend(part.corruptions)
        merged.next_offset = part.next_offset
    return merged


def read_at(path, offset, opener=open):
    """Reads the one record that starts at ``offset``.

    Returns:
      bytes: its payload.

    Raises:
      ValueError: no valid record starts there (names file and offset).
      OSError: the file cannot be read.
    """
    with opener(path, "rb") as f:
        f.seek(offset)
        header = f.read(HEADER_SIZE)
        if len(header) < HEADER_SIZE:
            raise ValueError("%s: no record at offset %d (end of file)" % (path, offset))
        length = _header_at(header, 0)
        if length is None:
            raise ValueError("%s: no valid record header at offset %d" % (path, offset))
        rest = f.read(length + FOOTER_SIZE)
    return _check_payload(path, offset, length, rest)


def read_from(f, offset, path):
    """Like :func:`read_at`, through an open binary file (``os.pread``: no seek,
    so threads may share ``f``; a file renamed over since stays readable).

    Raises:
      ValueError: no valid record starts there (names ``path`` and offset).
      OSError: the file cannot be read.
    """
    fd = f.fileno()
    header = os.pread(fd, HEADER_SIZE, offset)
    if len(header) < HEADER_SIZE:
        raise ValueError("%s: no record at offset %d (end of file)" % (path, offset))
    length = _header_at(header, 0)
    if length is None:
        raise ValueError("%s: no valid record header at offset %d" % (path, offset))
    rest = os.pread(fd, length + FOOTER_SIZE, offset + HEADER_SIZE)
    return _check_payload(path, offset, length, rest)


def _check_payload(path, offset, length, rest):
    if len(rest) < length + FOOTER_SIZE:
        raise ValueError("%s: record at offset %d is incomplete" % (path, offset))
    payload = rest[:length]
    if masked_crc32c(payload) != _CRC.unpack_from(rest, length)[0]:
        raise ValueError("%s: payload CRC mismatch at offset %d" % (path, offset))
    return payload
