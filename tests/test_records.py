"""TFRecord framing: encoding, incremental scans, half-written and corrupt records."""

import struct

import pytest

from tb_numerics_plugin import records


def _payloads(n):
    return [("record-%d-" % i).encode() * (i % 7 + 1) for i in range(n)]


def _file(tmp_path, payloads):
    path = tmp_path / "f.execution"
    path.write_bytes(b"".join(records.encode(p) for p in payloads))
    return path


def test_masked_crc_matches_tensorflow_known_value():
    crc = records.masked_crc32c(b"")
    # CRC-32C of the empty string is 0; masking gives the constant delta.
    assert crc == 0xA282EAD8


def test_encode_layout_is_little_endian_length_crc_payload_crc():
    framed = records.encode(b"abc")
    assert struct.unpack("<Q", framed[:8])[0] == 3
    assert struct.unpack("<I", framed[8:12])[0] == records.masked_crc32c(framed[:8])
    assert framed[12:15] == b"abc"
    assert struct.unpack("<I", framed[15:])[0] == records.masked_crc32c(b"abc")


def test_encode_all_frames_each_payload_as_encode_does_in_c_and_in_python(monkeypatch):
    # the writer's flushes frame through encode_all: the reader extension's frame() where
    # it was built, else encode per payload; both give encode's bytes, joined
    import collections

    payloads = _payloads(5) + [b"", bytes(range(256)) * 300]
    want = b"".join(records.encode(p) for p in payloads)
    assert records.encode_all(payloads) == want
    assert records.encode_all(collections.deque(payloads, maxlen=10)) == want  # a ring
    assert records.encode_all([]) == b""
    try:
        from tb_numerics_plugin.reader import _frames
    except ImportError:  # a build without a compiler: encode_all framed in Python above
        _frames = None
    if _frames is not None:
        assert records._frame_c is _frames.frame
        with pytest.raises(TypeError, match="item 1 is str"):
            records.encode_all([b"a", "b"])
    monkeypatch.setattr(records, "_frame_c", False)  # as where the extension is missing
    assert records.encode_all(payloads) == want


def test_scan_returns_every_record_with_its_offset(tmp_path):
    payloads = _payloads(50)
    path = _file(tmp_path, payloads)
    result = records.scan(str(path))
    assert [p for _, p in result.records] == payloads
    assert result.next_offset == path.stat().st_size
    assert result.corruptions == []
    for offset, payload in result.records:
        assert records.read_at(str(path), offset) == payload


def test_half_written_last_record_is_left_for_later_then_read(tmp_path):
    payloads = _payloads(10)
    whole = b"".join(records.encode(p) for p in payloads)
    path = tmp_path / "f.graphs"
    path.write_bytes(whole[:-5])
    first = records.scan(str(path))
    assert [p for _, p in first.records] == payloads[:-1]
    assert first.corruptions == []
    with open(path, "ab") as f:
        f.write(whole[-5:])
    second = records.scan(str(path), first.next_offset)
    assert [p for _, p in second.records] == payloads[-1:]
    assert second.next_offset == len(whole)


def test_header_cut_inside_the_length_field_is_not_an_error(tmp_path):
    whole = b"".join(records.encode(p) for p in _payloads(3))
    path = tmp_path / "f.graphs"
    path.write_bytes(whole + records.encode(b"tail")[:6])
    result = records.scan(str(path))
    assert len(result.records) == 3 and result.corruptions == []
    assert result.next_offset == len(whole)


def test_flipped_payload_byte_is_reported_and_the_rest_kept(tmp_path):
    payloads = _payloads(20)
    path = _file(tmp_path, payloads)
    offsets = [o for o, _ in records.scan(str(path)).records]
    data = bytearray(path.read_bytes())
    data[offsets[7] + records.HEADER_SIZE + 1] ^= 0x40
    path.write_bytes(bytes(data))
    result = records.scan(str(path))
    assert [p for _, p in result.records] == payloads[:7] + payloads[8:]
    (bad,) = result.corruptions
    assert bad.offset == offsets[7] and "payload CRC" in bad.reason
    assert str(path) in str(bad) and str(offsets[7]) in str(bad)


def test_flipped_length_byte_resyncs_on_the_next_good_record(tmp_path):
    payloads = _payloads(20)
    path = _file(tmp_path, payloads)
    offsets = [o for o, _ in records.scan(str(path)).records]
    data = bytearray(path.read_bytes())
    data[offsets[3]] ^= 0x01
    path.write_bytes(bytes(data))
    result = records.scan(str(path))
    assert [p for _, p in result.records] == payloads[:3] + payloads[4:]
    assert result.corruptions[0].offset == offsets[3]
    assert result.corruptions[0].skipped == offsets[4] - offsets[3]


def test_small_chunks_give_the_same_records(tmp_path):
    payloads = _payloads(200)
    path = _file(tmp_path, payloads)
    got = []
    for part in records.iter_scan(str(path), chunk_size=37):
        got.extend(p for _, p in part.records)
    assert got == payloads


def test_empty_file_has_no_records(tmp_path):
    path = tmp_path / "f.metadata"
    path.write_bytes(b"")
    result = records.scan(str(path))
    assert result.records == [] and result.next_offset == 0 and result.corruptions == []


def test_read_at_a_wrong_offset_names_file_and_offset(tmp_path):
    path = _file(tmp_path, _payloads(3))
    with pytest.raises(ValueError, match=r"f\.execution.*offset 5"):
        records.read_at(str(path), 5)
