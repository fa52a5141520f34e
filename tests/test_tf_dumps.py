"""Real TF 2.21 dumps of the demo, read by our reader and analysed; round trips with TF's reader."""

import json
import os

import pytest

from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.reader import Logdir

HEALTH_MODES = ("FULL_HEALTH", "CONCISE_HEALTH", "CURT_HEALTH", "FULL_TENSOR")
NO_HEALTH_MODES = ("SHAPE", "NO_TENSOR")


def _run(tf_dumps, mode):
    run = Logdir(tf_dumps).run(mode)
    run.update()
    return run


def _tf_counts(tf_dumps, name="tf_counts.json"):
    with open(os.path.join(tf_dumps, name)) as f:
        return json.load(f)


@pytest.mark.parametrize("mode", HEALTH_MODES)
def test_first_bad_tensor_is_log_in_graph_loss(tf_dumps, mode):
    fb = analyze_run(_run(tf_dumps, mode))["first_bad_tensor"]
    assert (fb["op_type"], fb["op_name"], fb["graph_name"]) == ("Log", "Log", "loss")


@pytest.mark.parametrize("mode", HEALTH_MODES)
def test_first_bad_tensor_input_is_probs(tf_dumps, mode):
    fb = analyze_run(_run(tf_dumps, mode))["first_bad_tensor"]
    assert [i["name"] for i in fb["inputs"]] == ["probs:0"]
    assert fb["inputs"][0]["health"]["any_inf_or_nan"] is False


@pytest.mark.parametrize("mode", HEALTH_MODES)
def test_placeholder_input_names_the_execution_that_produced_its_value(tf_dumps, mode):
    run = _run(tf_dumps, mode)
    fb = analyze_run(run)["first_bad_tensor"]
    source = fb["inputs"][0]["source"]
    assert set(source) == {"kind", "index", "output_slot", "op_type"}
    assert source["kind"] == "execution"
    producer = run.execution(source["index"])
    assert source["op_type"] == producer["op_type"] and "model" in producer["op_type"]
    assert source["output_slot"] < producer["num_outputs"]
    # The value is the one the loss call consumed: one of the calling execution's inputs.
    call = run.execution_digests(source["index"] + 1, run.num_executions())
    consumer = next(d for d in call if "loss" in d["op_type"])
    tensor_id = producer["output_tensor_ids"][source["output_slot"]]
    assert tensor_id in run.execution(consumer["index"])["input_tensor_ids"]


@pytest.mark.parametrize("mode", HEALTH_MODES)
def test_source_line_is_the_tf_math_log_line(tf_dumps, mode):
    src = analyze_run(_run(tf_dumps, mode))["first_bad_tensor"]["source"]
    assert src["file"].endswith("tb_numerics_plugin/demo/tf_mnist.py")
    assert src["code"].startswith("log_probs = tf.math.log(probs)")
    with open(src["file"]) as f:
        assert "tf.math.log(probs)" in f.read().splitlines()[src["line"] - 1]


@pytest.mark.parametrize("mode", ("FULL_HEALTH", "FULL_TENSOR"))
def test_explanation_names_producer_and_zeros_of_its_input(tf_dumps, mode):
    fb = analyze_run(_run(tf_dumps, mode))["first_bad_tensor"]
    h = fb["health"]
    assert h["neg_inf"] > 0 and h["size"] == 1000
    assert fb["explanation"].startswith("Log (graph loss) produced %d -inf of 1000" % h["neg_inf"])
    zeros = fb["inputs"][0]["health"]["zero"]
    assert zeros == h["neg_inf"]  # log(0) = -inf: one -inf per zero probability
    assert "its only input probs:0 was finite and held %d zeros" % zeros in fb["explanation"]


def test_curt_health_explanation_says_it_has_no_counts(tf_dumps):
    fb = analyze_run(_run(tf_dumps, "CURT_HEALTH"))["first_bad_tensor"]
    assert "CURT_HEALTH records no counts" in fb["explanation"]
    assert "nan" not in fb["health"]


@pytest.mark.parametrize("mode", NO_HEALTH_MODES)
def test_modes_without_health_say_so_instead_of_alerting(tf_dumps, mode):
    summary = analyze_run(_run(tf_dumps, mode))
    assert summary["first_bad_tensor"] is None
    assert summary["alerts"]["InfNan"] == 0
    assert summary["health_available"] is False
    assert any("%s records no inf/NaN information" % mode in w for w in summary["warnings"])


def test_shape_mode_digests_carry_shapes(tf_dumps):
    run = _run(tf_dumps, "SHAPE")
    idx = run.find_graph_execution_traces(op_type="Log")
    health = run.graph_execution_trace_digests(idx[0], idx[0] + 1)[0]["health"]
    assert health["shape"] == [100, 10] and health["size"] == 1000


def test_full_tensor_trace_value_is_the_tensor_with_non_finite_strings(tf_dumps):
    run = _run(tf_dumps, "FULL_TENSOR")
    idx = run.find_graph_execution_traces(op_type="Log")
    value = run.graph_execution_trace(int(idx[0]))["debug_tensor_value"]
    assert len(value) == 100 and len(value[0]) == 10
    flat = [v for row in value for v in row]
    assert flat.count("-Infinity") == run.graph_execution_trace(int(idx[0]))["health"]["neg_inf"]


@pytest.mark.parametrize("mode", HEALTH_MODES + NO_HEALTH_MODES)
def test_our_reader_counts_what_tf_reader_counts(tf_dumps, mode):
    tf = _tf_counts(tf_dumps)[mode]
    run = _run(tf_dumps, mode)
    assert run.num_executions() == tf["num_executions"]
    assert run.num_graph_execution_traces() == tf["num_graph_execution_traces"]
    assert len(run.graph_ids()) == tf["num_graphs_by_id"]
    assert len(run.source_files()) == tf["num_source_files"]
    assert run.warnings == []


@pytest.mark.parametrize("mode", ("FULL_HEALTH", "CONCISE_HEALTH", "SHAPE"))
def test_our_trace_values_equal_tf_reader_values(tf_dumps, mode):
    tf = _tf_counts(tf_dumps)[mode]
    run = _run(tf_dumps, mode)
    ours = [run.graph_execution_trace(i) for i in range(run.num_graph_execution_traces())]
    assert [t["op_name"] for t in ours] == tf["trace_op_names"]
    assert [t["debug_tensor_value"] for t in ours] == tf["trace_values"]


def test_tf_reader_reads_our_writer_dump(tf_dumps, ours_dump):
    tf = _tf_counts(tf_dumps, "tf_reads_ours.json")
    run = Logdir(ours_dump).run(".")
    run.update()
    assert tf["num_graph_execution_traces"] == run.num_graph_execution_traces() == 10
    assert tf["num_executions"] == run.num_executions() == 1
    assert tf["num_stack_frames"] == 3 and tf["num_source_files"] == len(run.source_files())
    ours = [run.graph_execution_trace(i)["debug_tensor_value"] for i in range(10)]
    assert tf["trace_values"] == ours
