"""Record framing: the C extension and the Python walk find the same records and the same
damage; narrow columns keep every value exactly."""

import os
import random

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from tb_numerics_plugin import records
from tb_numerics_plugin.reader import columns, wire

needs_c = pytest.mark.skipif(wire.framing_backend() != "c",
                             reason="the C framing extension is not built")


def _buffer(n=40, seed=0):
    rng = random.Random(seed)
    payloads = [os.urandom(rng.choice([0, 1, 7, 8, 9, 100, 700])) for _ in range(n)]
    return b"".join(records.encode(p) for p in payloads), payloads


def _damaged(buf, at):
    return buf[:at] + bytes([buf[at] ^ 0xFF]) + buf[at + 1:]


def _frame_both(buf, final, monkeypatch):
    fast = wire.frame(buf, 1000, "f", final)
    with monkeypatch.context() as m:
        m.setattr(wire, "_frames", None)
        slow = wire.frame(buf, 1000, "f", final)
    return fast, slow


def _same(a, b):
    assert a.starts.tolist() == b.starts.tolist()
    assert a.lengths.tolist() == b.lengths.tolist()
    assert a.next_pos == b.next_pos
    assert [str(c) for c in a.corruptions] == [str(c) for c in b.corruptions]


@needs_c
@pytest.mark.parametrize("software", [False, True])
def test_c_crc_is_tfrecords_masked_crc32c(software):
    from tb_numerics_plugin.reader import _frames

    for n in list(range(40)) + [1000, 4097]:
        data = os.urandom(n)
        assert _frames.masked_crc32c(data, software) == records.masked_crc32c(data)


@needs_c
def test_c_and_python_walks_find_the_same_records_in_a_clean_buffer(monkeypatch):
    buf, payloads = _buffer()
    fast, slow = _frame_both(buf, True, monkeypatch)
    _same(fast, slow)
    assert [buf[s:s + n] for s, n in zip(fast.starts, fast.lengths)] == payloads


@needs_c
@pytest.mark.parametrize("where", ["length", "header crc", "payload", "footer crc"])
def test_damage_is_reported_with_its_offset_by_both_walks(where, monkeypatch):
    buf, payloads = _buffer()
    offsets = [o for o, _ in records.scan_buffer(buf, 0, "f").records]
    victim = offsets[5]
    at = {"length": victim + 1, "header crc": victim + 9, "footer crc": None,
          "payload": victim + 12}[where]
    if at is None:
        at = offsets[6] - 1
    if where == "payload" and len(payloads[5]) == 0:
        at = offsets[6] - 1  # an empty payload: damage its CRC instead
    fast, slow = _frame_both(_damaged(buf, at), True, monkeypatch)
    _same(fast, slow)
    assert [c.offset for c in fast.corruptions] == [1000 + victim]
    assert len(fast.starts) == len(payloads) - 1


@needs_c
@pytest.mark.parametrize("final", [False, True])
def test_both_walks_stop_at_a_half_written_last_record(final, monkeypatch):
    buf, payloads = _buffer()
    last = [o for o, _ in records.scan_buffer(buf, 0, "f").records][-1]
    for cut in (last + 3, last + 12, len(buf) - 1):
        fast, slow = _frame_both(buf[:cut], final, monkeypatch)
        _same(fast, slow)
        assert fast.next_pos == last and len(fast.starts) == len(payloads) - 1


def test_iter_frames_widens_its_read_for_a_record_longer_than_a_chunk(tmp_path):
    payloads = [b"a" * 10, os.urandom(5000), b"b" * 20, os.urandom(3000)]
    path = str(tmp_path / "f")
    with open(path, "wb") as f:
        f.write(b"".join(records.encode(p) for p in payloads) + b"\x05\x00")
    got, end = [], 0
    for frames, base in wire.iter_frames(path, 0, chunk_size=1024):
        got += [frames.buf[s:s + n] for s, n in zip(frames.starts, frames.lengths)]
        assert not frames.corruptions
        end = base + frames.next_pos
    assert got == payloads
    assert end == os.path.getsize(path) - 2  # the half-written header is left for later


def test_gather_copies_the_same_windows_as_a_sliding_view():
    arr = np.frombuffer(os.urandom(4096), np.uint8)
    start = np.array([0, 17, 4000, 3, 3], np.int64)
    for width in (1, 4, 8, 33, 96):
        assert (wire.gather(arr, start, width) == sliding_window_view(arr, width)[start]).all()
    assert wire.gather(arr, start[:0], 8).shape == (0, 8)
    with pytest.raises(IndexError):
        wire.gather(arr, np.array([4090]), 8)


def test_a_float32_column_keeps_exact_values_narrow_and_widens_for_the_first_inexact():
    cols = columns.Columns({"v": (columns.FLOAT32_IF_EXACT, 1)})
    exact = np.array([[1.0, np.nan, -np.inf], [2.0 ** 24, 0.5, 3.0]])
    cols.extend(v=exact)
    assert cols["v"].dtype == np.float32
    np.testing.assert_array_equal(cols["v"], exact)
    inexact = np.array([[2.0 ** 24 + 1, 0.1, 1e300]])
    cols.extend(v=inexact)
    assert cols["v"].dtype == np.float64
    np.testing.assert_array_equal(cols["v"], np.vstack([exact, inexact]))


def test_an_int32_column_widens_for_a_value_past_its_range():
    cols = columns.Columns({"id": (columns.INT32_IF_FITS, 0)})
    cols.extend(id=[0, -5, 2 ** 31 - 1])
    assert cols["id"].dtype == np.int32
    cols.extend(id=np.array([2 ** 40], np.int64))
    assert cols["id"].dtype == np.int64
    assert cols["id"].tolist() == [0, -5, 2 ** 31 - 1, 2 ** 40]
