"""RunReader.trends: the numerics series of a file set, read incrementally (reader/trends.py).

Series are written with the real encoder (series.SeriesWriter) beside real dumps of
tests/dumps.py.
"""

import os
import time

import numpy as np
import pytest

import dumps
import trends_data
from trends_data import GROWING, STEADY
from tb_numerics_plugin import records, series


def _dump(tmp_path, **kw):
    root = str(tmp_path)
    path = trends_data.dump_with_series(root, **kw)
    return root, path


def test_each_stat_equals_the_one_computed_from_the_tensor(tmp_path):
    root, _ = _dump(tmp_path, steps=range(10, 13))
    trends = dumps.read_run(root).trends()
    values = trends_data.tensor(12 - 10, 120.0, 1.1)
    f = values[np.isfinite(values)]
    expected = {"abs_max": np.abs(f).max(), "min": f.min(), "max": f.max(), "mean": f.mean(),
                "std": f.std(), "nonfinite": 0.0,
                "headroom_bits": np.log2(65504.0 / np.abs(f).max())}
    for stat, want in expected.items():
        steps, modules, table = trends.table("output", stat)
        assert steps.tolist() == [10, 11, 12] and modules == [GROWING, STEADY]
        # simple_value is a float32: six digits survive
        assert table[0, 2] == pytest.approx(want, rel=1e-6, abs=1e-6), stat


def test_modules_kinds_and_steps_are_listed_in_first_seen_order(tmp_path):
    root = str(tmp_path)
    writer = dumps.write_dump(root)
    path = series.path_for(writer.prefix)
    trends_data.write_steps(path, [0, 1], {"b": ("float32", trends_data.tensor),
                                           "a": ("float16", trends_data.tensor)}, kind="grad")
    trends_data.write_steps(path, [2, 3], {"c": ("bfloat16", trends_data.tensor)})
    trends = dumps.read_run(root).trends()
    assert trends.kinds() == ["output", "grad"]
    assert trends.modules("grad") == [("b", "float32"), ("a", "float16")]
    assert trends.modules("output") == [("c", "bfloat16")]
    assert trends.modules("weight") == []
    assert trends.steps() == [0, 1, 2, 3]
    assert trends.steps("grad") == [0, 1]


def test_a_module_missing_at_a_step_is_nan_there(tmp_path):
    root = str(tmp_path)
    path = series.path_for(dumps.write_dump(root).prefix)
    trends_data.write_steps(path, range(4), {
        "always": ("float32", trends_data.tensor),
        "odd": ("float32", lambda s: trends_data.tensor(s) if s % 2 else None)})
    steps, modules, table = dumps.read_run(root).trends().table("output", "abs_max")
    assert modules == ["always", "odd"]
    assert np.isnan(table[1, [0, 2]]).all() and np.isfinite(table[1, [1, 3]]).all()
    assert np.isfinite(table[0]).all()


def test_a_dump_without_a_series_file_has_empty_trends_and_no_warning(tmp_path):
    dumps.write_dump(str(tmp_path))
    run = dumps.read_run(str(tmp_path))
    trends = run.trends()
    assert trends.kinds() == [] and trends.steps() == [] and trends.modules("output") == []
    steps, modules, table = trends.table("output", "abs_max")
    assert steps.shape == (0,) and modules == [] and table.shape == (0, 0)
    assert run.warnings == [] and trends.warnings == []


def test_an_unknown_host_is_a_key_error(tmp_path):
    root, _ = _dump(tmp_path)
    with pytest.raises(KeyError):
        dumps.read_run(root).trends("nohost")


def test_update_reads_only_what_was_appended_and_leaves_the_dump_generation(tmp_path):
    root = str(tmp_path)
    path = series.path_for(dumps.write_dump(root).prefix)
    modules = {"m": ("float16", trends_data.tensor)}
    trends_data.write_steps(path, range(5), modules)
    run = dumps.read_run(root)
    generation, trends_generation = run.generation, run.trends_generation
    assert run.trends().steps() == list(range(5))
    trends_data.write_steps(path, range(5, 9), modules)
    assert run.update() is True
    assert run.trends().steps() == list(range(9))
    assert run.trends().num_events == 9
    assert run.generation == generation and run.trends_generation == trends_generation + 1
    assert run.update() is False


def test_a_half_written_last_record_waits_for_the_rest(tmp_path):
    root = str(tmp_path)
    path = series.path_for(dumps.write_dump(root).prefix)
    trends_data.write_steps(path, range(3), {"m": ("float32", trends_data.tensor)})
    record = series.step_record(3, [("output", "m", trends_data.stats([1.0, 2.0], "float32"))])
    with open(path, "ab") as f:
        f.write(record[:20])
    run = dumps.read_run(root)
    assert run.trends().steps() == [0, 1, 2] and run.warnings == []
    with open(path, "ab") as f:
        f.write(record[20:])
    run.update()
    assert run.trends().steps() == [0, 1, 2, 3] and run.warnings == []
    _, _, table = run.trends().table("output", "abs_max")
    assert table[0, 3] == 2.0


def test_a_partial_record_left_by_a_writer_gone_quiet_is_a_warning(tmp_path):
    root = str(tmp_path)
    path = series.path_for(dumps.write_dump(root).prefix)
    trends_data.write_steps(path, range(3), {"m": ("float32", trends_data.tensor)})
    size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(b"\x01\x02\x03")
    old = time.time() - 2 * 60.0
    os.utime(path, (old, old))
    run = dumps.read_run(root)
    (warning,) = run.warnings
    assert warning.startswith(path) and "3 bytes at offset %d" % size in warning
    assert run.incomplete == []


def test_a_crc_bad_record_is_a_warning_naming_file_and_offset_and_later_records_are_kept(
        tmp_path):
    root = str(tmp_path)
    path = series.path_for(dumps.write_dump(root).prefix)
    trends_data.write_steps(path, range(6), {"m": ("float32", trends_data.tensor)})
    offsets = dumps.record_offsets(path)  # file version, then steps 0..5
    bad = offsets[3]  # step 2
    dumps.flip_byte(path, bad + records.HEADER_SIZE + 5)
    run = dumps.read_run(root)
    assert run.trends().steps() == [0, 1, 3, 4, 5]
    (warning,) = run.warnings
    assert warning.startswith(path) and "offset %d" % bad in warning
    # The series feeds no inf/NaN verdict: damage there leaves the dump complete.
    assert run.incomplete == []


def test_a_record_that_is_not_an_event_is_skipped_with_a_warning(tmp_path):
    root = str(tmp_path)
    path = series.path_for(dumps.write_dump(root).prefix)
    trends_data.write_steps(path, range(2), {"m": ("float32", trends_data.tensor)})
    offset = os.path.getsize(path)
    dumps.append_record(path, b"\xff\xff\xff not a protobuf")
    trends_data.write_steps(path, [2], {"m": ("float32", trends_data.tensor)})
    run = dumps.read_run(root)
    assert run.trends().steps() == [0, 1, 2]
    (warning,) = run.warnings
    assert "record at offset %d" % offset in warning and "not a tensorboard Event" in warning


def test_a_step_written_twice_keeps_its_last_values(tmp_path):
    root = str(tmp_path)
    path = series.path_for(dumps.write_dump(root).prefix)
    trends_data.write_steps(path, range(3), {"m": ("float32", lambda s: trends_data.tensor(0))})
    trends_data.write_steps(path, [1], {"m": ("float32", lambda s: trends_data.tensor(0, 8.0))})
    steps, _, table = dumps.read_run(root).trends().table("output", "abs_max")
    assert steps.tolist() == [0, 1, 2] and table[0].tolist() == [1.0, 8.0, 1.0]


def test_the_dtype_of_a_module_is_the_last_one_declared(tmp_path):
    root = str(tmp_path)
    path = series.path_for(dumps.write_dump(root).prefix)
    trends_data.write_steps(path, [0], {"m": ("float32", trends_data.tensor)})
    trends_data.write_steps(path, [1], {"m": ("float16", trends_data.tensor)})
    run = dumps.read_run(root)
    assert run.trends().modules("output") == [("m", "float16")]
    _, _, bits = run.trends().table("output", "headroom_bits")
    assert bits[0, 0] == pytest.approx(np.log2(3.4028234663852886e38), rel=1e-6)
    assert bits[0, 1] == pytest.approx(np.log2(65504.0), rel=1e-6)


def test_a_replaced_series_file_is_read_again_from_its_start(tmp_path):
    root = str(tmp_path)
    path = series.path_for(dumps.write_dump(root).prefix)
    trends_data.write_steps(path, range(5), {"m": ("float32", trends_data.tensor)})
    run = dumps.read_run(root)
    os.unlink(path)
    trends_data.write_steps(path, [7], {"n": ("float32", trends_data.tensor)})
    assert run.update() is True
    assert run.trends().steps() == [7] and run.trends().modules("output") == [("n", "float32")]
    os.unlink(path)
    run.update()
    assert run.trends().steps() == [] and run.trends().kinds() == []


def test_each_host_reads_the_series_named_after_its_own_file_set(tmp_path):
    root = str(tmp_path)
    for rank, rate in ((0, 1.0), (1, 2.0)):
        writer = dumps.write_dump(root, part="rank%d" % rank)
        trends_data.write_steps(series.path_for(writer.prefix), range(3),
                                {"m": ("float32", lambda s, r=rate: trends_data.tensor(s, 1, r))},
                                part="rank%d" % rank)
    run = dumps.read_run(root)
    assert run.hosts == ["testhost.rank0", "testhost.rank1"]
    _, _, rank0 = run.trends("testhost.rank0").table("output", "abs_max")
    _, _, rank1 = run.trends("testhost.rank1").table("output", "abs_max")
    assert rank0[0].tolist() == [1.0, 1.0, 1.0] and rank1[0].tolist() == [1.0, 2.0, 4.0]


def test_the_series_file_does_not_make_a_file_set_or_a_run(tmp_path):
    root, _ = _dump(tmp_path)
    run = dumps.read_run(root)
    assert run.hosts == ["testhost"] and run.warnings == []
