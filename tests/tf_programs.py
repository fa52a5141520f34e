"""Everything the tests need from TensorFlow, in one process (TF's import is slow).

Run as ``python tests/tf_programs.py OUT OURS``:

- OUT/<MODE>/ : the TF MNIST demo dumped by TF 2.21 in each tensor debug mode;
- OUT/tf_counts.json : what TF's DebugDataReader reads from each of those dumps;
- OUT/tf_reads_ours.json : what TF's DebugDataReader reads from OURS, a dump
  written by our FileSetWriter.

pytest's own process never imports TF.
"""

import json
import os
import sys

MODES = ("FULL_HEALTH", "CONCISE_HEALTH", "CURT_HEALTH", "SHAPE", "NO_TENSOR", "FULL_TENSOR")


def tf_counts(dump_root):
    """Counts and the first few trace digests as TF's own reader sees a dump."""
    from tensorflow.python.debug.lib import debug_events_reader

    with debug_events_reader.DebugDataReader(dump_root) as reader:
        reader.update()
        traces = reader.graph_execution_traces()
        return {
            "num_executions": reader.num_executions(),
            "num_graph_execution_traces": reader.num_graph_execution_traces(),
            "num_graphs": len(reader.outermost_graphs()) + sum(
                1 for g in reader._graph_by_id.values() if g.outer_graph_id),
            "num_graphs_by_id": len(reader._graph_by_id),
            "num_source_files": len(reader._host_name_file_path_to_offset),
            "num_stack_frames": len(reader._stack_frame_by_id),
            "trace_op_names": [t.op_name for t in traces],
            "trace_values": [
                None if t.debug_tensor_value is None else [float(v) for v in t.debug_tensor_value]
                for t in traces
            ],
            "execution_op_types": [e.op_type for e in reader.executions()],
        }


def main(out, ours):
    from tb_numerics_plugin.demo import tf_mnist

    counts = {}
    for mode in MODES:
        root = os.path.join(out, mode)
        tf_mnist.run(root, mode, steps=2)
        counts[mode] = tf_counts(root)
    with open(os.path.join(out, "tf_counts.json"), "w") as f:
        json.dump(counts, f)
    with open(os.path.join(out, "tf_reads_ours.json"), "w") as f:
        json.dump(tf_counts(ours), f)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main(sys.argv[1], sys.argv[2]))
