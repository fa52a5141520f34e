"""Fast bulk decoding of TFRecord framing and protobuf wire format.

Trace files hold millions of small records, so the per-record Python work
must stay tiny. Framing (record lengths, both CRCs of every record) is one C
pass where the optional extension ``_frames`` was built (setup.py), else a
tight Python loop that only reads lengths and CRCs of payloads, the CRC
comparisons vectorized with numpy; both stop at the first damaged record.
The protobuf field walk is vectorized over all records of a chunk with numpy.
Anything that does not check out falls back to
:func:`tb_numerics_plugin.records.scan_buffer`, the canonical scanner that
reports and skips damage, so the fast path never decides what is corrupt on
its own.
"""

import dataclasses
import struct

import crc32c
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tb_numerics_plugin import records

try:  # built by setup.py; optional, the Python walk below does the same
    from tb_numerics_plugin.reader import _frames
except ImportError:  # pragma: no cover - depends on the build
    _frames = None

_LEN = struct.Struct("<Q")
_U32 = np.uint64(0xFFFFFFFF)
_DELTA = np.uint64(0xA282EAD8)


@dataclasses.dataclass
class Frames:
    """Records found in one buffer.

    Attributes:
      buf: the bytes scanned.
      starts: int64 array, payload start of each good record within ``buf``.
      lengths: int64 array, payload lengths.
      next_pos: position in ``buf`` where the next scan resumes.
      corruptions: list of :class:`records.CorruptRecord`.
    """

    buf: bytes
    starts: np.ndarray
    lengths: np.ndarray
    next_pos: int
    corruptions: list


def _masked(crc):
    """Vectorized TFRecord CRC masking of a uint64 array of raw CRC-32C values."""
    return ((((crc >> np.uint64(15)) | (crc << np.uint64(17))) & _U32) + _DELTA) & _U32


def gather(arr, start, width):
    """Returns ``arr[start[i] : start[i] + width]`` for every i as a 2-D array.

    Raises:
      IndexError: a window runs past the end of ``arr``.
    """
    if not len(start) or not width:
        return np.zeros((len(start), width), arr.dtype)
    if arr.dtype != np.uint8 or not arr.flags.c_contiguous or width > len(arr):
        return sliding_window_view(arr, width)[start]
    # Each window as one opaque item: numpy copies it whole (a memcpy), where a
    # sliding_window_view copies byte by byte; 3 to 8 times faster.
    windows = np.ndarray((len(arr) - width + 1,), np.dtype((np.void, width)), arr, 0, (1,))
    return windows[start].view(np.uint8).reshape(len(start), width)


def gather_u32(arr, pos):
    """Reads little-endian uint32 values at byte positions ``pos`` of uint8 ``arr``."""
    return np.ascontiguousarray(gather(arr, pos, 4)).view("<u4").ravel().astype(np.uint64)


def _walk_lengths(buf):
    """Sequential pass: record positions and payload lengths.

    The only per-record Python loop of the trace path, so it does nothing else.
    """
    n = len(buf)
    unpack = _LEN.unpack_from
    positions = []
    append = positions.append
    pos = 0
    try:
        while True:
            (length,) = unpack(buf, pos)
            stop = pos + length + (records.HEADER_SIZE + records.FOOTER_SIZE)
            if stop > n:
                break
            append(pos)
            pos = stop
    except struct.error:
        pass  # fewer than 8 bytes left: an incomplete header
    return positions, pos


def _first_bad(buf, arr, positions):
    """Index of the first record whose header or payload CRC fails, else None.

    Returns:
      (index or None, int64 payload lengths).
    """
    if not len(positions):
        return None, np.zeros(0, np.int64)
    lengths = np.ascontiguousarray(gather(arr, positions, 8)).view("<u8").ravel()
    # Few distinct lengths: compute each one's header CRC once.
    distinct, inverse = np.unique(lengths, return_inverse=True)
    expected = np.array(
        [records.masked_crc32c(_LEN.pack(int(v))) for v in distinct], np.uint64
    )[inverse]
    ok = gather_u32(arr, positions + 8) == expected
    lengths = lengths.astype(np.int64)
    crc = crc32c.crc32c
    h = records.HEADER_SIZE
    begin = positions + h
    view = memoryview(buf)  # slices without copying the payloads
    raw = np.array(
        [crc(view[a:b]) for a, b in zip(begin.tolist(), (begin + lengths).tolist())], np.uint64
    )
    ok &= gather_u32(arr, positions + h + lengths) == _masked(raw)
    bad = np.flatnonzero(~ok)
    return (int(bad[0]) if len(bad) else None), lengths


def framing_backend():
    """``"c"`` when the C framing extension is in use, else ``"python"``."""
    return "python" if _frames is None else "c"


def _walk_checked(buf, arr):
    """Good records from the start of ``buf`` up to the first damaged or incomplete one.

    Returns:
      (payload starts, payload lengths, stop, damaged): int64 arrays for the
      good records; ``stop`` is where the walk ended, the start of the first
      record that fails a CRC (``damaged`` True) or does not fit in ``buf``.
    """
    if _frames is not None:
        room = len(buf) // (records.HEADER_SIZE + records.FOOTER_SIZE) + 1
        starts, lengths = np.empty(room, np.int64), np.empty(room, np.int64)
        count, stop, damaged = _frames.walk(buf, starts, lengths)
        return starts[:count].copy(), lengths[:count].copy(), stop, bool(damaged)
    positions, pos = _walk_lengths(buf)
    positions = np.asarray(positions, np.int64)
    bad, lengths = _first_bad(buf, arr, positions)
    if bad is None:
        return positions + records.HEADER_SIZE, lengths, pos, False
    return positions[:bad] + records.HEADER_SIZE, lengths[:bad], int(positions[bad]), True


def _tail_needs_scan(buf, pos, final):
    """True when the incomplete bytes at ``pos`` need the canonical scanner.

    A length field failing its CRC can never become whole; at the end of the
    file a length running past it may be a lie (a valid record follows) that
    :func:`records.scan_buffer` reports and resyncs past, instead of waiting
    forever for bytes that will not come.
    """
    if len(buf) - pos < records.HEADER_SIZE:
        return False
    return final or records._header_at(buf, pos) is None


def frame(buf, base_offset, path, final):
    """Splits ``buf`` (read from ``base_offset`` of ``path``) into records.

    Args:
      buf: bytes.
      base_offset: file offset of ``buf[0]``.
      path: file name for corruption reports.
      final: ``buf`` reaches the current end of the file.

    Returns:
      Frames. Good records before and after damage are all kept.
    """
    arr = np.frombuffer(buf, np.uint8)
    good_starts, good_lengths, cut, damaged = _walk_checked(buf, arr)
    if not damaged and not _tail_needs_scan(buf, cut, final):
        return Frames(buf, good_starts, good_lengths, cut, [])
    # Damage: keep the clean prefix, let the canonical scanner handle the rest.
    slow = records.scan_buffer(
        memoryview(buf)[cut:], base_offset + cut, path, final=final
    )
    starts = list(good_starts)
    lens = list(good_lengths)
    for offset, payload in slow.records:
        starts.append(offset - base_offset + records.HEADER_SIZE)
        lens.append(len(payload))
    return Frames(
        buf,
        np.asarray(starts, np.int64),
        np.asarray(lens, np.int64),
        slow.next_offset - base_offset,
        slow.corruptions,
    )


def iter_frames(path, offset=0, chunk_size=8 << 20, opener=open):
    """Reads ``path`` from ``offset`` in chunks and frames each one.

    Each chunk is read from where the previous one's records ended: the
    incomplete record at its end is read again from the file (the page
    cache) rather than copied in front of the next chunk, which would copy
    every chunk once more. A record longer than a chunk widens the read.

    Yields:
      ``(Frames, base_offset)``; the last ``base_offset + frames.next_pos`` is
      where the next call resumes (start of an incomplete last record).

    Raises:
      OSError: the file cannot be read.
    """
    with opener(path, "rb") as f:
        size = chunk_size
        while True:
            f.seek(offset)
            buf = f.read(size)
            final = len(buf) < size
            frames = frame(buf, offset, path, final)
            yield frames, offset
            if final:
                return
            size = chunk_size if frames.next_pos else size + chunk_size
            offset += frames.next_pos


def varint(arr, pos):
    """Vectorized protobuf varint read.

    Args:
      arr: uint8 array (reads past its end are clamped).
      pos: int64 array of positions.

    Returns:
      (values uint64 array, positions after each varint).
    """
    value = np.zeros(len(pos), np.uint64)
    active = np.ones(len(pos), bool)
    end = pos.copy()
    for k in range(10):
        byte = arr[np.minimum(pos + k, len(arr) - 1)].astype(np.uint64)
        value[active] |= (byte[active] & np.uint64(0x7F)) << np.uint64(7 * k)
        end[active] = pos[active] + k + 1
        active &= byte >= 0x80
        if not active.any():
            break
    return value, end


@dataclasses.dataclass
class Field:
    """Where one field of each message was found (-1 = absent; last one wins).

    For length-delimited fields ``tag`` is the position of the tag, ``start``
    of the data and ``length`` its size; for varints ``value`` holds the
    number; for fixed64/fixed32 ``start`` is the position of the bytes.
    """

    tag: np.ndarray
    start: np.ndarray
    length: np.ndarray
    value: np.ndarray


def _field_step(arr, tag_pos):
    """Reads one field at each position: (number, data start, length, varint value, next)."""
    tag, p = varint(arr, tag_pos)
    number = (tag >> np.uint64(3)).astype(np.int64)
    wire_type = (tag & np.uint64(7)).astype(np.int64)
    value = np.zeros(len(p), np.uint64)
    length = np.zeros(len(p), np.int64)
    data = p.copy()
    nxt = p.copy()
    is_var = wire_type == 0
    if is_var.any():
        value[is_var], nxt[is_var] = varint(arr, p[is_var])
    nxt[wire_type == 1] += 8
    nxt[wire_type == 5] += 4
    is_len = wire_type == 2
    if is_len.any():
        ln, q = varint(arr, p[is_len])
        length[is_len] = ln.astype(np.int64)
        data[is_len] = q
        nxt[is_len] = q + length[is_len]
    # Groups (3, 4) are long deprecated and 6, 7 do not exist: treat as damage.
    bad = (wire_type > 5) | (wire_type == 3) | (wire_type == 4) | (length < 0)
    return number, data, length, value, nxt, bad


def walk(arr, start, end, numbers):
    """Vectorized walk over the top-level fields of many messages.

    Args:
      arr: uint8 array holding the messages.
      start, end: int64 arrays bounding each message.
      numbers: field numbers to report.

    Returns:
      (dict number -> Field, malformed bool array): ``malformed`` marks
      messages whose fields did not end exactly at ``end`` or used an
      unsupported wire type.
    """
    n = len(start)
    found = {
        num: Field(np.full(n, -1, np.int64), np.full(n, -1, np.int64),
                   np.zeros(n, np.int64), np.zeros(n, np.uint64))
        for num in numbers
    }
    pos = start.copy()
    malformed = np.zeros(n, bool)
    while True:
        act = np.flatnonzero((pos < end) & ~malformed)
        if not len(act):
            break
        tag_pos = pos[act]
        number, data, length, value, nxt, bad = _field_step(arr, tag_pos)
        malformed[act[bad]] = True
        for num, field in found.items():
            sel = number == num
            if sel.any():
                rows = act[sel]
                field.tag[rows] = tag_pos[sel]
                field.start[rows] = data[sel]
                field.length[rows] = length[sel]
                field.value[rows] = value[sel]
        pos[act] = nxt
    malformed |= pos != end
    return found, malformed


# Multipliers of the word hash in group_rows (odd 64-bit constants).
_HASH_MUL = np.uint64(0x9E3779B97F4A7C15)
_HASH_LEN = np.uint64(0xC2B2AE3D27D4EB4F)
# Byte strings longer than this are not grouped (trace keys: op names are rarely > 200 bytes).
MAX_GROUPED = 256


def gather_rows(arr, starts, width):
    """``arr[s : s + width]`` per row; rows running past the end come back zero, flagged False."""
    inside = starts + width <= len(arr)
    out = np.zeros((len(starts), width), np.uint8)
    if inside.any():
        out[inside] = gather(arr, starts[inside], width)
    return out, inside


def group_rows(arr, starts, lengths, max_width=MAX_GROUPED):
    """Groups byte strings ``arr[s : s + length]`` that are equal, without a Python loop.

    Returns:
      (representative row of each group, group index per row, bool mask of
      rows whose grouping is certain). Rows are hashed word by word, then each
      is compared byte for byte with its group's representative, so a hash
      collision can only make a row uncertain (per-record path), never wrong.
      Nothing is grouped when the longest string exceeds ``max_width``.
    """
    n = len(starts)
    width = (int(lengths.max(initial=0)) + 7) // 8 * 8
    if not n or width == 0 or width > max_width:
        return np.zeros(0, np.int64), np.zeros(n, np.int64), np.zeros(n, bool)
    rows, inside = gather_rows(arr, starts, width)
    # A string near the end of the chunk: its own bytes, without the padding past it.
    for r in np.flatnonzero(~inside & (starts + lengths <= len(arr))).tolist():
        s, ln = int(starts[r]), int(lengths[r])
        rows[r, :ln] = arr[s : s + ln]
        inside[r] = True
    rows[np.arange(width)[None, :] >= lengths[:, None]] = 0
    words = rows.view("<u8")
    h = lengths.astype(np.uint64) * _HASH_LEN
    with np.errstate(over="ignore"):
        for j in range(words.shape[1]):
            h = (h ^ words[:, j]) * _HASH_MUL
    _, reps, inverse = np.unique(h, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    rep_of_row = reps[inverse]
    certain = inside & (lengths == lengths[rep_of_row]) & (words == words[rep_of_row]).all(1)
    return reps, inverse, certain
