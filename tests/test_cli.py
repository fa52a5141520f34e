"""`tb-numerics report`: text, --json schema, --check and exit codes."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

import dumps
from faults import hostile
from tb_numerics_plugin import cli

RUN_KEYS = {"run", "hosts", "tensor_debug_mode", "num_executions", "num_graph_execution_traces",
            "num_graphs", "steps", "alerts", "first_bad_tensor", "warnings", "health_available",
            "incomplete", "writers", "trends", "growth"}
FIRST_BAD_KEYS = {"kind", "index", "host", "op_type", "op_name", "module", "output_slot",
                  "graph_name", "wall_time", "step", "health", "source", "user_source",
                  "stack_frame_ids", "inputs", "path", "sink", "explanation"}


def _report(capsys, *argv):
    code = cli.main(["report", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_is_one_object_with_the_documented_schema(ours_dump, capsys):
    code, out, err = _report(capsys, ours_dump, "--json")
    assert code == 0 and err == ""
    (run,) = json.loads(out)["runs"]
    assert set(run) == RUN_KEYS
    fb = run["first_bad_tensor"]
    assert set(fb) == FIRST_BAD_KEYS
    assert (fb["op_name"], fb["graph_name"], fb["source"]["line"]) == ("Log", "loss", 4)
    assert {"size", "neg_inf", "pos_inf", "nan"} <= set(fb["health"])
    assert set(fb["inputs"][0]) == {"name", "op_type", "health", "source"}
    assert run["alerts"] == {"InfNan": 5, "OverflowHeadroom": 0, "MaskedNonFinite": 0}
    assert run["incomplete"] is False
    (status,) = run["writers"].values()
    assert status["state"] == "closed" and status["notes"] == []


def test_json_of_real_tf_dumps_has_every_run(tf_dumps, capsys):
    code, out, _ = _report(capsys, tf_dumps, "--json")
    runs = {r["run"]: r for r in json.loads(out)["runs"]}
    assert set(runs) == {"FULL_HEALTH", "CONCISE_HEALTH", "CURT_HEALTH", "SHAPE", "NO_TENSOR",
                         "FULL_TENSOR"}
    assert runs["FULL_HEALTH"]["first_bad_tensor"]["op_type"] == "Log"
    assert runs["SHAPE"]["first_bad_tensor"] is None


def test_text_report_tells_the_story(tf_dumps, capsys):
    code, out, _ = _report(capsys, tf_dumps, "--run", "FULL_HEALTH")
    assert code == 0
    assert "first bad tensor: graph execution trace" in out and "Log:0 (Log) in graph loss" in out
    assert "| log_probs = tf.math.log(probs)" in out
    assert "probs:0 (Placeholder): finite" in out
    assert "tf_mnist.py:" in out


def test_check_exits_1_when_an_inf_nan_alert_exists(ours_dump, capsys):
    assert _report(capsys, ours_dump, "--check")[0] == 1


def test_check_exits_0_on_a_clean_dump(tmp_path, capsys):
    dumps.write_dump(str(tmp_path), bad_from=None)
    code, out, _ = _report(capsys, str(tmp_path), "--check")
    assert code == 0 and "no inf or NaN found" in out


def test_missing_logdir_exits_2_with_one_line(tmp_path, capsys):
    code, out, err = _report(capsys, str(tmp_path / "nope"))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "no such directory" in err


def test_logdir_without_dumps_exits_2(tmp_path, capsys):
    code, _, err = _report(capsys, str(tmp_path))
    assert code == 2 and "no tfdbg2 dumps found" in err


def test_unknown_run_exits_2(ours_dump, capsys):
    code, _, err = _report(capsys, ours_dump, "--run", "other")
    assert code == 2 and "no run 'other'" in err


def test_warnings_are_printed(ours_dump, tmp_path, capsys):
    root = str(tmp_path / "d")
    shutil.copytree(ours_dump, root)
    (path,) = [os.path.join(root, f) for f in os.listdir(root) if f.endswith(".stack_frames")]
    os.remove(path)
    code, out, _ = _report(capsys, root)
    assert "warnings:" in out and "missing file" in out


def test_console_script_prints_no_progress_when_stderr_is_not_a_tty(ours_dump):
    proc = subprocess.run([sys.executable, "-m", "tb_numerics_plugin.cli", "report", ours_dump],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith("tb-numerics report: ")


def test_update_reports_progress_through_the_trace_file(ours_dump):
    from tb_numerics_plugin.reader import Logdir

    seen = []
    Logdir(ours_dump).run(".").update(progress=lambda *a: seen.append(a))
    assert seen and seen[-1][0] == "testhost" and seen[-1][1] == seen[-1][2]


def _clean_copy(tmp_path):
    root = str(tmp_path / "clean")
    dumps.write_dump(root, bad_from=None)
    return root


def test_check_exits_5_when_a_clean_dump_lost_records(tmp_path, capsys):
    root = _clean_copy(tmp_path)
    path = hostile.file_of(root, "graph_execution_traces")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 5)
    code, out, err = _report(capsys, root, "--check")
    assert code == cli.EXIT_INCOMPLETE == 5
    assert "not a clean check" in err and "are an incomplete record" in out
    assert "no inf or NaN found among the records read" in out


def test_check_exits_5_when_the_writer_lost_records(tmp_path, capsys):
    root = _clean_copy(tmp_path)
    hostile.write_status(root, lost={"ENOSPC": 12}, first_error="x.execution: ENOSPC")
    code, out, _ = _report(capsys, root, "--check")
    assert code == 5 and "12 records lost (ENOSPC 12): x.execution: ENOSPC" in out


def test_check_exits_5_when_a_ring_writer_did_not_close(tmp_path, capsys):
    root = _clean_copy(tmp_path)
    hostile.write_status(root, state="open", pid=2 ** 22 + 7, circular_buffer_size=8,
                         updated_wall_time=time.time() - 3600)
    code, out, _ = _report(capsys, root, "--check")
    assert code == 5 and "writer did not close: ring-buffered executions" in out


def test_ring_evictions_are_noted_but_the_check_stays_clean(tmp_path, capsys):
    root = _clean_copy(tmp_path)
    hostile.write_status(root, circular_buffer_size=10,
                         written={"execution": 1, "graph_execution_traces": 50},
                         evicted={"execution": 0, "graph_execution_traces": 40})
    code, out, _ = _report(capsys, root, "--check")
    assert code == 0
    assert "ring buffer of 10 kept the last 10 of 50 graph execution traces" in out


def test_check_exits_3_when_no_trace_or_execution_could_be_read(tmp_path, capsys):
    root = _clean_copy(tmp_path)
    for suffix in ("graph_execution_traces", "execution"):
        open(hostile.file_of(root, suffix), "wb").close()
    code, _, err = _report(capsys, root, "--check")
    assert code == 3 and "no execution or graph execution trace could be read" in err


def test_a_file_instead_of_a_directory_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "f.txt"
    path.write_text("x")
    code, out, err = _report(capsys, str(path))
    assert code == 2 and out == "" and err.count("\n") == 1 and "not a directory" in err


def test_terminal_controls_in_names_and_code_are_escaped(tmp_path, capsys):
    root = hostile.escape_dump(str(tmp_path / "evil"))
    code, out, err = _report(capsys, root)
    assert code == 0 and err == ""
    assert "\x1b" not in out and "\x07" not in out
    assert "Lo\\x1b[2J\\x1b]0;pwned\\x07" in out  # the op name, shown escaped
    assert "# \\x1b[2J" in out  # the code line
    assert "host\\x1b[31m" in out  # the host label from the file name


def test_file_names_that_are_not_utf8_are_kept_escaped(tmp_path, capsys):
    root = hostile.base_dump(str(tmp_path / "d"))
    hostile.CASES["non_utf8_file_names"](root)
    hostile.CASES["truncate_execution_14"](root)
    code, out, err = _report(capsys, root, "--check")
    assert code == 1 and "test\\xffhost" in out
    code, out, _ = _report(capsys, root, "--json")
    assert code == 0 and json.loads(out)["runs"][0]["hosts"] == ["test\udcffhost"]


def test_subprocess_on_a_hostile_dump_prints_no_traceback(tmp_path):
    root = hostile.base_dump(str(tmp_path / "d"), bad_from=None)
    for name in ("trace_mode_1000", "op_num_outputs_huge", "huge_length_graph_execution_traces",
                 "trace_op_not_utf8", "trace_full_tensor_huge_shape", "non_utf8_file_names"):
        hostile.CASES[name](root)
    env = dict(os.environ, PYTHONIOENCODING="ascii")
    proc = subprocess.run([sys.executable, "-m", "tb_numerics_plugin.cli", "report", root,
                           "--check"], capture_output=True, text=True, env=env)
    assert proc.returncode == 5, proc.stderr
    assert "Traceback" not in proc.stderr and "not a clean check" in proc.stderr
    assert "unknown tensor_debug_mode 1000" in proc.stdout
    assert "claims 2147483647 outputs" in proc.stdout


def test_version_names_the_package_and_the_protobuf_runtime(capsys):
    import google.protobuf
    import tb_numerics_plugin

    try:
        cli.main(["--version"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    assert out.startswith("tb-numerics %s " % tb_numerics_plugin.__version__)
    assert "protobuf runtime %s" % google.protobuf.__version__ in out


def test_python_dash_m_runs_the_same_report_with_logdir_spelled_as_tensorboard(ours_dump):
    cmd = [sys.executable, "-m", "tb_numerics_plugin", "report", "--logdir", ours_dump, "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (run,) = json.loads(proc.stdout)["runs"]
    assert run["first_bad_tensor"]["op_name"] == "Log"


def test_logdir_given_twice_differently_is_a_usage_error(ours_dump, tmp_path, capsys):
    code, _, err = _report(capsys, ours_dump, "--logdir", str(tmp_path))
    assert code == cli.EXIT_USAGE and "two logdirs given" in err
    code, _, err = _report(capsys)
    assert code == cli.EXIT_USAGE and "needs a LOGDIR" in err


def test_a_logdir_of_tensorboard_summaries_gets_a_hint(tmp_path, capsys):
    SummaryWriter = pytest.importorskip("torch.utils.tensorboard").SummaryWriter

    with SummaryWriter(str(tmp_path / "train")) as summaries:  # real scalar summaries
        summaries.add_scalar("loss", 0.5, 1)
    code, _, err = _report(capsys, str(tmp_path))
    assert code == cli.EXIT_USAGE
    assert "no tfdbg2 dumps found" in err and "TensorBoard summaries" in err
    assert "enable_dump_debug_info" in err
