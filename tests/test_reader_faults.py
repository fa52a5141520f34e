"""Damaged, partial and odd dumps: warnings naming file and offset, never a crash, no good data lost."""

import glob
import os
import shutil
import time

import pytest

import dumps
from faults import hostile
from tb_numerics_plugin.reader import Logdir, wire


@pytest.fixture(autouse=True, params=["c", "python"])
def framing(request, monkeypatch):
    """Every test twice: records framed by the C extension, then by the Python walk."""
    if request.param == "python":
        monkeypatch.setattr(wire, "_frames", None)
    elif wire.framing_backend() != "c":
        pytest.skip("the C framing extension is not built")
    return request.param


def _copy(ours_dump, tmp_path):
    dst = str(tmp_path / "dump")
    shutil.copytree(ours_dump, dst)
    return dst


def _file(root, suffix):
    (path,) = glob.glob(os.path.join(root, "*." + suffix))
    return path


def _run(root, name="."):
    run = Logdir(root).run(name)
    run.update()
    return run


def test_truncated_last_record_of_a_live_writer_is_left_for_later_without_warning(
        ours_dump, tmp_path):
    root = _copy(ours_dump, tmp_path)
    hostile.write_status(root, state="open", pid=os.getpid(), updated_wall_time=time.time())
    path = _file(root, "graph_execution_traces")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 5)
    run = _run(root)
    assert run.num_graph_execution_traces() == 9
    assert run.warnings == []


def test_truncated_last_record_of_a_closed_writer_warns_with_file_and_offset(ours_dump,
                                                                             tmp_path):
    root = _copy(ours_dump, tmp_path)
    path = _file(root, "graph_execution_traces")
    last = dumps.record_offsets(path)[-1]
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 5)
    run = _run(root)
    assert run.num_graph_execution_traces() == 9
    (warning,) = run.warnings
    assert warning.startswith(path) and "at offset %d are an incomplete record" % last in warning


def test_truncated_file_without_sidecar_warns_once_it_has_not_changed_for_a_while(
        ours_dump, tmp_path):
    root = _copy(ours_dump, tmp_path)
    os.remove(hostile.status_path(root))
    path = _file(root, "execution")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 5)
    run = _run(root)
    assert run.warnings == []  # just written: maybe a writer mid-append
    old = time.time() - 2 * run.fileset().settle_s
    os.utime(path, (old, old))
    run.update()
    assert any(w.startswith(path) and "at offset 0 are an incomplete record" in w
               for w in run.warnings)


def test_file_cut_at_a_record_boundary_is_caught_by_the_writer_counts(ours_dump, tmp_path):
    root = _copy(ours_dump, tmp_path)
    path = _file(root, "graph_execution_traces")
    with open(path, "r+b") as f:
        f.truncate(dumps.record_offsets(path)[7])
    (warning,) = _run(root).warnings
    assert warning.startswith(path) and "wrote 10 records, 7 are on disk: 3 lost" in warning


def test_update_catches_up_once_the_truncated_record_is_completed(ours_dump, tmp_path):
    root = _copy(ours_dump, tmp_path)
    path = _file(root, "graph_execution_traces")
    with open(path, "rb") as f:
        whole = f.read()
    with open(path, "wb") as f:
        f.write(whole[:-5])
    run = _run(root)
    with open(path, "ab") as f:
        f.write(whole[-5:])
    assert run.update() is True
    assert run.num_graph_execution_traces() == 10
    assert run.graph_execution_trace(9)["health"]["nan"] == 3


def test_records_appended_later_are_indexed_by_update(ours_dump, tmp_path):
    root = _copy(ours_dump, tmp_path)
    run = _run(root)
    dumps.append_record(_file(root, "graph_execution_traces"),
                        dumps.trace_payload("Log", dumps.GOOD, 2000.0))
    assert run.update() is True
    assert run.num_graph_execution_traces() == 11
    assert run.update() is False


def test_flipped_byte_warns_with_file_and_offset_and_keeps_other_records(ours_dump, tmp_path):
    root = _copy(ours_dump, tmp_path)
    path = _file(root, "graph_execution_traces")
    offsets = dumps.record_offsets(path)
    dumps.flip_byte(path, offsets[4] + 30)  # inside the 5th record's payload
    run = _run(root)
    assert run.num_graph_execution_traces() == 9
    (warning,) = run.warnings
    assert path in warning and "offset %d" % offsets[4] in warning
    names = [d["op_name"] for d in run.graph_execution_trace_digests(0, None)]
    assert names == ["Log", "mul"] * 2 + ["mul"] + ["Log", "mul"] * 2


def test_flipped_length_byte_resyncs_on_the_next_record(ours_dump, tmp_path):
    root = _copy(ours_dump, tmp_path)
    path = _file(root, "graph_execution_traces")
    offsets = dumps.record_offsets(path)
    dumps.flip_byte(path, offsets[2] + 1)  # the 3rd record's length field
    run = _run(root)
    assert run.num_graph_execution_traces() == 9
    assert any("offset %d" % offsets[2] in w for w in run.warnings)


def test_damage_in_a_small_file_is_reported_and_the_rest_kept(ours_dump, tmp_path):
    root = _copy(ours_dump, tmp_path)
    path = _file(root, "stack_frames")
    offsets = dumps.record_offsets(path)
    dumps.flip_byte(path, offsets[1] + 20)
    run = _run(root)
    assert any(path in w and "offset %d" % offsets[1] in w for w in run.warnings)
    assert run.stack_frames(["f-user-log", "f-lib"])[0]["lineno"] == 4


def test_empty_metadata_file_is_a_warning(ours_dump, tmp_path):
    root = _copy(ours_dump, tmp_path)
    open(_file(root, "metadata"), "wb").close()
    run = _run(root)
    assert any("no metadata record" in w for w in run.warnings)
    assert run.num_graph_execution_traces() == 10


def test_empty_trace_file_of_a_health_run_says_traces_were_lost(ours_dump, tmp_path):
    root = _copy(ours_dump, tmp_path)
    os.remove(hostile.status_path(root))  # without the writer's counts too
    path = _file(root, "graph_execution_traces")
    open(path, "wb").close()
    run = _run(root)
    assert run.warnings == []  # just written: maybe a live writer, not there yet
    old = time.time() - 2 * run.fileset().settle_s
    for name in os.listdir(root):
        os.utime(os.path.join(root, name), (old, old))
    run.update()
    assert run.num_graph_execution_traces() == 0
    assert run.tensor_debug_mode == "FULL_HEALTH"  # from the execution
    (warning,) = run.warnings
    assert warning.startswith(path) and "no graph execution trace" in warning


def test_missing_suffix_file_is_a_warning_naming_it(ours_dump, tmp_path):
    root = _copy(ours_dump, tmp_path)
    path = _file(root, "stack_frames")
    os.remove(path)
    run = _run(root)
    assert any(path in w and "missing" in w for w in run.warnings)
    assert run.num_graph_execution_traces() == 10
    assert run.op_info(dumps.GRAPH_ID, "Log")["stack_frame_ids"] == ["f-user-log", "f-lib"]


def test_file_set_without_metadata_is_read_with_a_warning(ours_dump, tmp_path):
    root = _copy(ours_dump, tmp_path)
    os.remove(_file(root, "metadata"))
    run = _run(root)
    assert any("no metadata file" in w for w in run.warnings)
    assert run.num_graph_execution_traces() == 10
    assert run.tfdbg_run_ids == []


def test_garbage_payload_with_valid_framing_is_skipped_with_a_warning(ours_dump, tmp_path):
    root = _copy(ours_dump, tmp_path)
    path = _file(root, "graph_execution_traces")
    offset = os.path.getsize(path)
    dumps.append_record(path, b"\xff\xff\xff not a DebugEvent")
    dumps.append_record(path, dumps.trace_payload("Log", dumps.GOOD, 3000.0))
    run = _run(root)
    assert run.num_graph_execution_traces() == 11
    assert any("offset %d" % offset in w for w in run.warnings)


def test_two_hosts_in_one_run_are_two_labels(tmp_path):
    root = str(tmp_path / "job")
    dumps.write_dump(root, host="vm", part="rank0", bad_from=None)
    dumps.write_dump(root, host="vm", part="rank1", bad_from=2, t0=900.0)
    run = _run(str(tmp_path), "job")
    assert run.hosts == ["vm.rank0", "vm.rank1"]
    assert run.num_graph_execution_traces("vm.rank1") == 10
    assert len(run.bad_trace_indices("vm.rank0")) == 0
    assert list(run.bad_trace_indices("vm.rank1")) == [4, 5, 6, 7, 8, 9]


def test_file_set_that_appears_later_is_picked_up_by_update(tmp_path):
    root = str(tmp_path / "job")
    dumps.write_dump(root, host="vm", part="rank0")
    run = _run(str(tmp_path), "job")
    dumps.write_dump(root, host="vm", part="rank1")
    assert run.update() is True
    assert run.hosts == ["vm.rank0", "vm.rank1"]
