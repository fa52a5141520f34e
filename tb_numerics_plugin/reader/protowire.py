"""Vectorized protobuf wire walking over many messages of one buffer at once.

:func:`fields` walks the top-level fields of every message together, one
numpy step per field *position* (not per message); :func:`packed` decodes
packed varint payloads; :func:`allowed_only` and :func:`counts` check the
fields found against a schema. Malformed input is flagged, never guessed at:
callers send flagged messages to protobuf itself.
"""

import dataclasses

import numpy as np

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5


def schema_table(allowed):
    """``{field number (< 128): bit mask of allowed wire types}`` as a lookup array."""
    table = np.zeros(128, np.int64)
    for number, mask in allowed.items():
        table[number] = mask
    return table


def varint(arr, pos, end):
    """Protobuf varints at ``pos``, none read at or past ``end``.

    Returns:
      (uint64 values, positions after them, ok): ``ok`` is False for a varint
      running past ``end``, longer than 10 bytes, or whose 10th byte is above 1
      (more than 64 bits).
    """
    last = len(arr) - 1
    b0 = arr[np.minimum(pos, last)]
    one = b0 < 0x80
    if one.all():  # the common case: one byte each (tags, small lengths)
        return b0.astype(np.uint64), pos + 1, pos < end
    b1 = arr[np.minimum(pos + 1, last)]
    if (one | (b1 < 0x80)).all():  # at most two bytes (lengths below 16384)
        value = np.where(one, b0, (b0 & 0x7F) | (b1.astype(np.uint64) << np.uint64(7)))
        after = pos + 2 - one
        return value.astype(np.uint64), after, after <= end
    value = np.zeros(len(pos), np.uint64)
    after = pos.copy()
    ok = np.ones(len(pos), bool)
    active = np.ones(len(pos), bool)
    for k in range(10):
        p = pos + k
        ok &= ~active | (p < end)
        byte = arr[np.clip(p, 0, last)].astype(np.uint64)
        value[active] |= (byte[active] & np.uint64(0x7F)) << np.uint64(7 * k)
        after[active] = p[active] + 1
        if k == 9:
            ok &= ~active | (byte <= 1)
        active &= byte >= 0x80
        if not active.any():
            break
    return value, after, ok


@dataclasses.dataclass
class Flat:
    """Every field found, one entry per field (in no particular order).

    ``row`` is the message's index; ``tag`` the tag's position; ``data`` and
    ``length`` the payload (length-delimited) or the value's bytes; ``value``
    the varint value (wire type 0).
    """

    row: np.ndarray
    number: np.ndarray
    wtype: np.ndarray
    tag: np.ndarray
    data: np.ndarray
    length: np.ndarray
    value: np.ndarray

    def select(self, mask):
        return Flat(*(getattr(self, f.name)[mask] for f in dataclasses.fields(self)))

    def by_number(self):
        """``{field number: Flat}``, each sorted by position.

        Field numbers must be below 256 (check with :func:`allowed_only` first):
        one radix sort by number, then each group sorted by position if needed.
        """
        cols = self.select(np.argsort(self.number.astype(np.uint8), kind="stable"))
        numbers, first = np.unique(cols.number, return_index=True)
        bounds = np.r_[first, len(cols.number)]
        groups = {}
        for num, a, b in zip(numbers.tolist(), bounds[:-1].tolist(), bounds[1:].tolist()):
            group = Flat(*(getattr(cols, f.name)[a:b] for f in dataclasses.fields(cols)))
            if (group.tag[1:] < group.tag[:-1]).any():
                group = group.select(np.argsort(group.tag))
            groups[num] = group
        return groups


def fields(arr, start, end):
    """Walks the top-level fields of the messages ``arr[start:end]``, all at once.

    Returns:
      (Flat of the fields of well-formed messages, bool mask of malformed ones:
      a bad varint, a wire type other than 0/1/2/5, field number 0, a field
      running past the message's end).
    """
    n = len(start)
    pos = start.copy()
    malformed = np.zeros(n, bool)
    found = []
    act = np.flatnonzero(pos < end)
    while len(act):
        p, e = pos[act], end[act]
        tag, q, ok = varint(arr, p, e)
        number = (tag >> np.uint64(3)).astype(np.int64)
        wtype = (tag & np.uint64(7)).astype(np.int64)
        value = np.zeros(len(act), np.uint64)
        length = np.zeros(len(act), np.int64)
        data, nxt = q.copy(), q.copy()
        sel = wtype == VARINT
        if sel.any():
            value[sel], nxt[sel], good = varint(arr, q[sel], e[sel])
            ok[sel] &= good
        for wt, size in ((FIXED64, 8), (FIXED32, 4)):
            sel = wtype == wt
            if sel.any():
                length[sel] = size
                nxt[sel] += size
        sel = wtype == LEN
        if sel.all():  # often: every message is at a length-delimited field
            ln, data, good = varint(arr, q, e)
            good &= ln <= np.maximum(e - data, 0).astype(np.uint64)
            length = np.where(good, ln, 0).astype(np.int64)
            nxt = data + length
            ok &= good
        elif sel.any():
            ln, d, good = varint(arr, q[sel], e[sel])
            room = np.maximum(e[sel] - d, 0).astype(np.uint64)
            good &= ln <= room
            length[sel] = np.where(good, ln, 0).astype(np.int64)
            data[sel] = d
            nxt[sel] = d + length[sel]
            ok[sel] &= good
        ok &= ((wtype <= 2) | (wtype == 5)) & (number > 0) & (nxt <= e)
        malformed[act[~ok]] = True
        cols = (act, number, wtype, p, data, length, value)
        found.append(cols if ok.all() else tuple(c[ok] for c in cols))
        pos[act] = nxt
        act = act[ok]
        act = act[pos[act] < end[act]]
    if not found:
        empty = np.zeros(0, np.int64)
        return Flat(empty, empty, empty, empty, empty, empty, np.zeros(0, np.uint64)), malformed
    flat = Flat(*(np.concatenate(col) for col in zip(*found)))
    if malformed.any():
        flat = flat.select(~malformed[flat.row])
    return flat, malformed


def allowed_only(flat, table, n):
    """Rows (of ``n``) holding a field number or wire type outside ``table`` (schema_table)."""
    number = np.minimum(flat.number, len(table) - 1)
    allowed = (table[number] >> flat.wtype) & 1
    allowed &= flat.number < len(table)
    return np.bincount(flat.row[allowed == 0], minlength=n) > 0


def counts(flat, number, n):
    """How many times field ``number`` occurs in each of the ``n`` messages."""
    return np.bincount(flat.row[flat.number == number], minlength=n)


def packed(arr, data, length):
    """Decodes packed varint payloads ``arr[data : data + length]``.

    Returns:
      (uint64 values, payload index of each value, bool ok per payload).
    """
    m = len(data)
    total = int(length.sum())
    ok = np.ones(m, bool)
    if not total:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64), ok
    first = np.cumsum(length) - length
    owner = np.repeat(np.arange(m), length)
    idx = np.repeat(data - first, length) + np.arange(total)
    byte = arr[idx]
    term = byte < 0x80
    full = length > 0
    ok[full] = term[(first + length - 1)[full]]
    begins = np.zeros(total, bool)
    begins[1:] = term[:-1]
    begins[first[full]] = True
    vstart = np.flatnonzero(begins)
    k = np.arange(total) - vstart[np.cumsum(begins) - 1]
    too_long = (k > 9) | ((k == 9) & (byte > 1))
    if too_long.any():
        ok[np.unique(owner[too_long])] = False
    shift = (7 * np.minimum(k, 9)).astype(np.uint64)
    contrib = (byte & 0x7F).astype(np.uint64) << shift
    values = np.add.reduceat(contrib, vstart)
    return values, owner[vstart], ok


def last_field_start(raw, number):
    """Where the payload of ``raw``'s last field starts, if that field is
    length-delimited field ``number``; else None (a plain walk, once per header)."""
    pos, cut = 0, None
    n = len(raw)
    while pos < n:
        tag, pos = py_varint(raw, pos)
        if tag is None:
            return None
        wtype = tag & 7
        if wtype == 0:
            _, pos = py_varint(raw, pos)
            if pos is None:
                return None
        elif wtype in (1, 5):
            pos += 8 if wtype == 1 else 4
        elif wtype == 2:
            ln, pos = py_varint(raw, pos)
            if ln is None:
                return None
            cut = pos if tag >> 3 == number else None
            pos += ln
        else:
            return None
        if wtype != 2:
            cut = None
    return cut if pos == n else None


def py_varint(raw, pos):
    """(value, next position) of the varint at ``pos``, or (None, None)."""
    value = 0
    for k in range(10):
        if pos + k >= len(raw):
            return None, None
        byte = raw[pos + k]
        value |= (byte & 0x7F) << (7 * k)
        if byte < 0x80:
            return value, pos + k + 1
    return None, None
