"""TensorFlow side of the root-cause bench; run by ``bench/root_cause.py`` in a subprocess.

For each TF case (the MNIST demo ``tb_numerics_plugin/demo/tf_mnist.py``,
with and without its fix) it

- runs the demo under tfdbg2 (``FULL_HEALTH``, unbounded buffer) into
  ``WORKDIR/<case>/dump``, which the parent then reads with tb-numerics;
- reads that dump with TF's ``DebugDataReader`` and an ``InfNanMonitor``
  attached (what TensorBoard's debugger-v2 runs): its earliest alert by wall
  time gives the op, and the op's creation stack the source line;
- trains the same model and loss again under ``tf.debugging.enable_check_numerics``
  (not together with the dump: the two op callbacks clash), which raises on
  the first op that outputs inf/NaN: its message names the op and marks the
  user frames of the op's creation stack ("->"), the innermost of which is
  taken as the line.

    python bench/root_cause_tf.py WORKDIR OUT_JSON CASE:FIX [CASE:FIX ...]

(FIX: 1 runs the demo with its fix, 0 without) writes
``{case: {"losses", "dump", "seconds", "tools": {tool: prediction}}}`` where a
prediction is ``{"alarm", "op", "file", "line", "detail", "seconds"}``.
"""

import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from tb_numerics_plugin.demo import tf_mnist  # noqa: E402

_STEPS = 3
_USER_FRAME = re.compile(r"^\s*\+ (.+?) \(L(\d+)\) \S+\s*$")


def _outside(path, framework_dir):
    return not (path.startswith(framework_dir) or path.startswith("<")
                or path.startswith(os.path.dirname(os.__file__)))


def _innermost_outside(frames, framework_dir):
    """``(basename, line)`` of the innermost frame not in TF or the stdlib, or (None, None)."""
    for path, line, _ in reversed(frames):
        if _outside(path, framework_dir):
            return os.path.basename(path), int(line)
    return None, None


def _monitor(tf, dump):
    """InfNanMonitor over the dump: the earliest alert's op and its creation stack's line."""
    from tensorflow.python.debug.lib import debug_events_monitors, debug_events_reader

    framework_dir = os.path.dirname(tf.__file__)
    with debug_events_reader.DebugDataReader(dump) as reader:
        monitor = debug_events_monitors.InfNanMonitor(reader)
        reader.update()
        alerts = monitor.alerts()
        if not alerts:
            return {"alarm": False, "op": None, "file": None, "line": None, "detail": "0 alerts"}
        first = min(alerts, key=lambda a: a.wall_time)  # min keeps the monitor's order on ties
        if first.graph_execution_trace_index is not None:
            trace = reader.graph_execution_traces(digest=True)[first.graph_execution_trace_index]
            op = reader.graph_by_id(trace.graph_id).get_op_creation_digest(trace.op_name)
            _, frames = reader.read_graph_op_creation_stack_trace(op)
        else:
            execution = reader.read_execution(reader.executions(digest=True)[first.execution_index])
            _, frames = reader.read_execution_stack_trace(execution)
        path, line = _innermost_outside(frames, framework_dir)
        return {"alarm": True, "op": first.op_type, "file": path, "line": line,
                "detail": "%d alerts" % len(alerts)}


def _check_numerics(tf, fix):
    """Trains the demo's model under enable_check_numerics; parses the error it raises."""
    tf.debugging.enable_check_numerics()
    try:
        # the demo's own model and loss (its run() always dumps, which clashes with this)
        model, loss, variables = tf_mnist._build(tf, fix)
        for x, labels in tf_mnist._data(tf, _STEPS):
            with tf.GradientTape() as tape:
                value = loss(model(x), labels)
            for var, grad in zip(variables, tape.gradient(value, variables)):
                var.assign_sub(0.05 * grad)
    except tf.errors.InvalidArgumentError as e:
        text = e.message
        op = re.search(r'of (?:graph|eager) op "([^"]+)"', text)
        lines = text.splitlines()
        marked = [_USER_FRAME.match(lines[i]) for i in range(len(lines) - 1)
                  if lines[i + 1].lstrip().startswith("->")]
        marked = [m for m in marked if m]
        return {"alarm": True, "op": op.group(1) if op else None,
                "file": os.path.basename(marked[-1].group(1)) if marked else None,
                "line": int(marked[-1].group(2)) if marked else None,
                "detail": next((l.strip() for l in lines if "Detected Infinity" in l), "")[:200]}
    finally:
        tf.debugging.disable_check_numerics()
    return {"alarm": False, "op": None, "file": None, "line": None, "detail": "no error"}


def main(argv):
    workdir, out_path = argv[1], argv[2]
    import tensorflow as tf

    results = {}
    for arg in argv[3:]:
        name, fix = arg.rsplit(":", 1)
        fix = fix == "1"
        dump = os.path.join(workdir, name, "dump")
        start = time.perf_counter()
        losses = tf_mnist.run(dump, "FULL_HEALTH", fix=fix, steps=_STEPS)
        seconds = time.perf_counter() - start
        tools = {}
        start = time.perf_counter()
        tools["TF InfNanMonitor"] = dict(_monitor(tf, dump), seconds=time.perf_counter() - start)
        start = time.perf_counter()
        tools["TF check_numerics"] = dict(_check_numerics(tf, fix),
                                          seconds=time.perf_counter() - start)
        results[name] = {"losses": losses, "dump": dump, "seconds": seconds, "tools": tools}
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
