"""Readers other than the capture tests' own: TensorFlow's DebugDataReader and the report CLI."""

import os

import pytest

from tb_numerics_plugin.demo import torch_mnist


def test_tf_debug_data_reader_reads_the_torch_demo_dump(tmp_path):
    debug_events_reader = pytest.importorskip("tensorflow.python.debug.lib.debug_events_reader")
    torch_mnist.run(str(tmp_path), "FULL_HEALTH", steps=2)
    with debug_events_reader.DebugDataReader(str(tmp_path)) as reader:
        reader.update()
        op_types = [e.op_type for e in reader.executions()]
        assert op_types.count("Classifier.forward") == 2
        assert op_types.count("autograd.backward") == 2 and op_types.count("SGD.step") == 2
        traces = reader.graph_execution_traces()
        logs = [t for t in traces if t.op_type == "aten.log.default"]
        assert len(logs) == 2
        values = reader.graph_execution_trace_to_tensor_value(logs[0])
        assert len(values) == 11 and values[5] > 0  # FULL_HEALTH, some -inf
        graph = reader.graph_by_id(logs[0].graph_id)
        op = graph.get_op_creation_digest(logs[0].op_name)
        (producer,) = op.input_names
        assert graph.get_op_creation_digest(producer.split(":")[0]).op_type == (
            "aten._softmax.default")
        host, frames = reader.read_graph_op_creation_stack_trace(op)
        path, line, func = frames[-1]
        assert os.path.basename(path) == "torch_mnist.py" and func == "forward"
        assert "torch.log(probs)" in reader.source_lines(host, path)[line - 1]


def test_report_cli_json_tells_the_demo_story(tmp_path):
    import json
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "tb_numerics_plugin.demo.torch_mnist", "--dump_dir",
                    str(tmp_path), "--dump_tensor_debug_mode", "CONCISE_HEALTH", "--steps", "1"],
                   check=True, capture_output=True, timeout=120)
    out = subprocess.run([sys.executable, "-m", "tb_numerics_plugin.cli", "report", str(tmp_path),
                          "--json"], capture_output=True, text=True, timeout=120)
    (run,) = json.loads(out.stdout)["runs"]
    first = run["first_bad_tensor"]
    assert first["op_type"] == "aten.log.default"
    assert first["source"]["code"].startswith("log_probs = torch.log(probs)")
