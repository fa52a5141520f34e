"""TensorFlow's own tfdbg2 reader reads a torch dump (wire compatibility)."""

import os

import pytest

from tb_numerics_plugin.demo import torch_mnist

debug_events_reader = pytest.importorskip("tensorflow.python.debug.lib.debug_events_reader")


def test_tf_debug_data_reader_reads_the_torch_demo_dump(tmp_path):
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
