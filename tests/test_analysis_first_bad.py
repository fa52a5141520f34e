"""First bad tensor: which one, its inputs, the producer rule, the user's source line."""

import dumps
from tb_numerics_plugin.analysis import analyze_run, first_bad
from tb_numerics_plugin.analysis.source import is_library
from tb_numerics_plugin.reader import Logdir


def _run(root, name="."):
    run = Logdir(root).run(name)
    run.update()
    return run


def test_first_bad_tensor_is_the_first_bad_trace_in_order(ours_dump):
    fb = analyze_run(_run(ours_dump))["first_bad_tensor"]
    assert (fb["kind"], fb["index"], fb["op_name"]) == ("graph_execution_trace", 6, "Log")


def test_source_is_the_innermost_user_frame_with_the_snapshot_line(ours_dump):
    fb = analyze_run(_run(ours_dump))["first_bad_tensor"]
    assert fb["source"] == {"file": dumps.USER_FILE, "line": 4, "code": "y = tf.math.log(x)",
                            "func": "loss", "kind": "user"}
    assert fb["user_source"] == fb["source"]


def test_untraced_input_is_reported_as_unknown(ours_dump):
    fb = analyze_run(_run(ours_dump))["first_bad_tensor"]
    assert fb["inputs"] == [{"name": "x:0", "op_type": "Placeholder", "health": None,
                             "source": None}]
    assert "x:0 was not traced" in fb["explanation"]


def test_an_op_fed_a_bad_input_only_propagates(ours_dump):
    run = _run(ours_dump)
    mul = run.graph_execution_trace_digests(7, 8)[0]
    producer, inputs, propagated = first_bad.producer_walk(run, run.fileset(), mul)
    assert producer["op_name"] == "Log" and producer["index"] == 6
    assert [d["op_name"] for d in propagated] == ["mul"]


def test_earliest_wall_time_wins_across_hosts(tmp_path):
    root = str(tmp_path / "job")
    dumps.write_dump(root, host="vm", part="rank0", bad_from=1, t0=2000.0)
    dumps.write_dump(root, host="vm", part="rank1", bad_from=3, t0=1000.0)
    fb = analyze_run(_run(str(tmp_path), "job"))["first_bad_tensor"]
    assert (fb["host"], fb["index"]) == ("vm.rank1", 6)


def test_executions_are_considered_when_no_trace_is_bad(tmp_path):
    dumps.write_dump(str(tmp_path), bad_from=99)  # traces stay good; the execution is bad
    fb = analyze_run(_run(str(tmp_path)))["first_bad_tensor"]
    assert (fb["kind"], fb["index"], fb["op_type"]) == ("execution", 0, "__inference_loss_1")
    assert fb["health"]["nan"] == 3
    assert fb["explanation"].startswith("__inference_loss_1 produced 3 NaN of 10 elements")


def test_a_traced_input_names_its_trace_as_the_source(ours_dump):
    run = _run(ours_dump)
    mul = run.graph_execution_trace_digests(7, 8)[0]
    (item,) = first_bad.trace_inputs(run, run.fileset(), mul)
    assert item["source"] == {"kind": "graph_execution_trace", "index": 6}


def test_an_execution_input_names_the_producing_execution(tmp_path):
    dumps.write_dump(str(tmp_path), bad_from=99)
    run = _run(str(tmp_path))
    ex, inputs = first_bad.execution_inputs(run, run.fileset(), 0)
    assert [i["source"] for i in inputs] == [None] * len(ex["input_tensor_ids"])


def test_clean_run_has_no_first_bad_tensor(tmp_path):
    dumps.write_dump(str(tmp_path), bad_from=None)
    summary = analyze_run(_run(str(tmp_path)))
    assert summary["first_bad_tensor"] is None and summary["alerts"]["InfNan"] == 0


def test_library_paths_are_not_user_code():
    assert is_library("/usr/lib/python3.11/site-packages/tensorflow/python/ops/math_ops.py")
    assert is_library("/opt/venv/lib/python3.12/dist-packages/torch/nn/functional.py")
    assert is_library("/usr/lib/python3.11/contextlib.py")
    assert is_library("<frozen importlib._bootstrap>")
    assert not is_library("/home/me/project/train.py")
