"""The RunReader/Logdir API of docs/internals.md on a dump of ours."""

import os
import subprocess
import sys

import numpy as np
import pytest

import dumps
from tb_numerics_plugin.reader import DumpError, Logdir

TRACE_DIGEST_KEYS = {"index", "host", "op_name", "op_type", "output_slot", "graph_id",
                     "graph_name", "wall_time", "step", "tensor_debug_mode", "health"}
EXECUTION_DIGEST_KEYS = {"index", "host", "op_type", "graph_id", "wall_time", "step",
                         "output_tensor_ids", "tensor_debug_mode", "health"}


@pytest.fixture(scope="module")
def run(ours_dump):
    reader = Logdir(ours_dump).run(".")
    reader.update()
    return reader


def test_run_names_are_directories_relative_to_the_logdir(tmp_path):
    dumps.write_dump(str(tmp_path / "a"))
    dumps.write_dump(str(tmp_path / "b" / "c"))
    dumps.write_dump(str(tmp_path))
    assert Logdir(str(tmp_path)).runs() == [".", "a", "b/c"]


def test_logdir_returns_one_reader_per_run(ours_dump):
    logdir = Logdir(ours_dump)
    assert logdir.run(".") is logdir.run(".")


def test_unknown_run_is_a_key_error(ours_dump):
    with pytest.raises(KeyError):
        Logdir(ours_dump).run("nope")


def test_run_outside_the_logdir_is_a_key_error(ours_dump):
    with pytest.raises(KeyError):
        Logdir(os.path.join(ours_dump)).run("..")


def test_missing_logdir_raises_dump_error(tmp_path):
    with pytest.raises(DumpError, match="no such directory"):
        Logdir(str(tmp_path / "missing")).runs()


def test_has_dumps_only_once_a_metadata_file_exists(tmp_path):
    logdir = Logdir(str(tmp_path))
    assert not logdir.has_dumps()
    dumps.write_dump(str(tmp_path / "deep" / "er"))
    assert logdir.has_dumps()


def test_run_properties(run):
    assert run.hosts == ["testhost"]
    assert run.tensor_debug_mode == "FULL_HEALTH"
    assert len(run.tfdbg_run_ids) == 1
    assert run.warnings == []


def test_trace_digests_have_the_contract_keys(run):
    digests = run.graph_execution_trace_digests(0, 2)
    assert [set(d) for d in digests] == [TRACE_DIGEST_KEYS] * 2
    assert digests[0]["op_type"] == "Log" and digests[0]["graph_name"] == "loss"
    assert digests[0]["health"]["zero"] == 3


def test_trace_paging_is_clipped_python_style(run):
    assert len(run.graph_execution_trace_digests(8, 100)) == 2
    assert run.graph_execution_trace_digests(20, 30) == []
    assert [d["index"] for d in run.graph_execution_trace_digests(7, -1)] == [7, 8, 9]


def test_full_trace_adds_device_value_and_graph_ids(run):
    t = run.graph_execution_trace(6)
    assert t["device_name"] == dumps.DEVICE
    assert t["debug_tensor_value"] == [float(v) for v in dumps.LOG_BAD]
    assert t["graph_ids"] == [dumps.GRAPH_ID]


def test_trace_index_out_of_range_is_an_index_error(run):
    with pytest.raises(IndexError):
        run.graph_execution_trace(10)


def test_unknown_host_is_a_key_error(run):
    with pytest.raises(KeyError):
        run.num_graph_execution_traces("otherhost")


def test_execution_digest_and_full_execution(run):
    (digest,) = run.execution_digests(0, None)
    assert set(digest) == EXECUTION_DIGEST_KEYS
    assert digest["output_tensor_ids"] == [7] and digest["health"]["nan"] == 3
    full = run.execution(0)
    assert full["debug_tensor_values"] == [[float(v) for v in dumps.MUL_BAD]]
    assert full["num_outputs"] == 1 and full["graph_name"] is None


def test_find_traces_by_op_type_name_and_badness(run):
    assert list(run.find_graph_execution_traces(op_type="Log")) == [0, 2, 4, 6, 8]
    assert list(run.find_graph_execution_traces(name_contains="mu")) == [1, 3, 5, 7, 9]
    assert list(run.find_graph_execution_traces(op_type="Log", bad_only=True)) == [6, 8]
    assert run.find_graph_execution_traces(op_type="Conv2D").dtype == np.int64


def test_bad_indices(run):
    assert list(run.bad_trace_indices()) == [6, 7, 8, 9]
    assert list(run.bad_execution_indices()) == [0]


def test_graph_info(run):
    assert run.graph_ids() == [dumps.GRAPH_ID]
    assert run.graph_info(dumps.GRAPH_ID) == {
        "graph_id": dumps.GRAPH_ID, "name": "loss", "outer_graph_id": None,
        "inner_graph_ids": [], "num_ops": 3}


def test_op_info_has_inputs_and_consumers(run):
    info = run.op_info(dumps.GRAPH_ID, "Log")
    assert info["inputs"] == [{"op_name": "x", "output_slot": 0, "op_type": "Placeholder"}]
    assert info["consumers"] == [[{"op_name": "mul", "input_slot": 0, "op_type": "Mul"}]]
    assert info["stack_frame_ids"] == ["f-user-log", "f-lib"]


def test_unknown_op_is_a_key_error(run):
    with pytest.raises(KeyError):
        run.op_info(dumps.GRAPH_ID, "Conv2D")


def test_stack_frames_resolve_file_by_source_file_order(run):
    user, lib = run.stack_frames(["f-user-log", "f-lib"])
    assert (user["file_path"], user["lineno"], user["file_index"]) == (dumps.USER_FILE, 4, 0)
    assert lib["file_path"] == dumps.LIB_FILE


def test_source_files_are_served_from_the_dump(run):
    assert [f["file_path"] for f in run.source_files()] == [dumps.USER_FILE, dumps.LIB_FILE]
    assert run.source_file(0)["lines"] == dumps.USER_LINES
    with pytest.raises(IndexError):
        run.source_file(2)


def test_reader_analysis_and_cli_import_neither_torch_nor_tensorflow():
    code = ("import sys, tb_numerics_plugin.reader, tb_numerics_plugin.analysis, "
            "tb_numerics_plugin.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tensorflow')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
