"""`tb-numerics report`: text, --json schema, --check and exit codes."""

import json
import os
import shutil
import subprocess
import sys

import dumps
from tb_numerics_plugin import cli

RUN_KEYS = {"run", "hosts", "tensor_debug_mode", "num_executions", "num_graph_execution_traces",
            "num_graphs", "alerts", "first_bad_tensor", "warnings", "health_available"}
FIRST_BAD_KEYS = {"kind", "index", "host", "op_type", "op_name", "module", "output_slot",
                  "graph_name", "wall_time", "health", "source", "user_source", "stack_frame_ids",
                  "inputs", "path", "sink", "explanation"}


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
