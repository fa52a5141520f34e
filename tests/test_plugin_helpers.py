"""Shared pieces of the plugin tests (no tests here): dumps, a TensorBoard app, JSON GETs.

Demo dumps are made by running the real demo programs in a subprocess,
once per test session (cached here, since several test modules use them).
Small hand-made dumps for growth/rank/discovery tests are written with
the project's FileSetWriter, which writes TF's file format.
"""

import argparse
import functools
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys

from tensorboard.backend import application
from werkzeug import test as werkzeug_test

from tb_numerics_plugin import filenames
from tb_numerics_plugin import writer as writer_lib
from tb_numerics_plugin.plugin import NumericsPlugin
from tb_numerics_plugin.proto import debug_event_pb2

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "/data/plugin/numerics/"
TF_DEMO = "tb_numerics_plugin.demo.tf_mnist"
TORCH_DEMO = "tb_numerics_plugin.demo.torch_mnist"
FULL_HEALTH = 4
DT_DOUBLE = 2
DT_FLOAT = 1


def demo_available(module):
    """Returns whether a demo module exists in this checkout."""
    return importlib.util.find_spec(module) is not None


def run_demo(module, dump_dir, mode="FULL_HEALTH"):
    """Runs a demo program in a subprocess, writing a dump into ``dump_dir``."""
    subprocess.run(
        [sys.executable, "-m", module, "--dump_dir", dump_dir, "--dump_tensor_debug_mode", mode],
        check=True,
        capture_output=True,
        timeout=900,
    )


@functools.lru_cache(maxsize=None)
def demo_logdir(root):
    """Returns a logdir under ``root`` holding the TF demo (and the torch demo when present).

    Cached per root, so a session-scoped fixture in several modules runs the
    demos once.
    """
    logdir = os.path.join(root, "logdir")
    if not all(importlib.util.find_spec(m) for m in ("tensorflow", "torch")):
        # `make test-compat` has neither: serve the committed dumps, which TF 2.21 and our
        # torch capture wrote (`make demo-logdir`).
        shutil.copytree(os.path.join(REPO, "demo_logdir"), logdir)
        return logdir
    run_demo(TF_DEMO, os.path.join(logdir, "tf_mnist"))
    if demo_available(TORCH_DEMO):
        run_demo(TORCH_DEMO, os.path.join(logdir, "torch_mnist"))
    return logdir


def make_client(logdir, path_prefix=""):
    """Returns a werkzeug test client for a TensorBoard app serving only our plugin."""
    flags = argparse.Namespace(
        logdir=logdir, path_prefix=path_prefix, samples_per_plugin={}, window_title=""
    )
    app = application.TensorBoardWSGIApp(flags, [NumericsPlugin], data_provider=None)
    return werkzeug_test.Client(app)


def get(client, route, **params):
    """GETs ``/data/plugin/numerics/<route>``; returns (status code, parsed JSON body).

    JSON is parsed strictly: a bare NaN/Infinity in the body fails the test.
    """
    response = client.get(PREFIX + route, query_string=params)
    return response.status_code, strict_json(response.get_data(as_text=True))


def strict_json(text):
    """Parses JSON, refusing the non-standard NaN/Infinity tokens browsers reject."""

    def refuse(token):
        raise AssertionError("bare %s in JSON" % token)

    return json.loads(text, parse_constant=refuse)


def _health(tensor_id, size, neg_inf=0, pos_inf=0, nan=0):
    """A FULL_HEALTH TensorProto: float64 little-endian values, as TF writes them."""
    finite = size - neg_inf - pos_inf - nan
    values = [tensor_id, -1, DT_FLOAT, 1, size, neg_inf, pos_inf, nan, 0, 0, finite]
    event = debug_event_pb2.DebugEvent()
    proto = event.graph_execution_trace.tensor_proto
    proto.dtype = DT_DOUBLE
    proto.tensor_shape.dim.add().size = len(values)
    proto.tensor_content = struct.pack("<%dd" % len(values), *values)
    return proto


class SyntheticDump:
    """A small dump written with FileSetWriter: one graph ``g1`` of ``x -> Log``, traces on demand.

    Args:
      dump_dir: directory to write the file set into.
      part: file-name part (e.g. ``"rank1"``) so several ranks share a dir.
      host_name: host name of the file set.
    """

    def __init__(self, dump_dir, part=None, host_name="testhost"):
        self.writer = writer_lib.FileSetWriter(
            dump_dir, circular_buffer_size=-1, host_name=host_name, part=part,
            flush_interval_s=0.0,
        )
        self.host = host_name + ("." + part if part else "")
        graph = debug_event_pb2.DebugEvent()
        graph.debugged_graph.graph_id = "g1"
        graph.debugged_graph.graph_name = "loss"
        self.writer.write_event(graph)
        for op_type, op_name, inputs in (("Placeholder", "x", []), ("Log", "Log", ["x:0"])):
            op = debug_event_pb2.DebugEvent()
            creation = op.graph_op_creation
            creation.op_type, creation.op_name, creation.graph_id = op_type, op_name, "g1"
            creation.graph_name = "loss"
            creation.input_names.extend(inputs)
            creation.num_outputs = 1
            self.writer.write_event(op)
        self.writer.flush()

    def add_traces(self, count, bad_every=0):
        """Appends ``count`` traces of ``Log:0`` (every ``bad_every``-th holds -inf) and flushes."""
        for i in range(count):
            event = debug_event_pb2.DebugEvent()
            trace = event.graph_execution_trace
            trace.tfdbg_context_id, trace.op_name, trace.output_slot = "g1", "Log", 0
            trace.tensor_debug_mode = FULL_HEALTH
            bad = bad_every and i % bad_every == bad_every - 1
            trace.tensor_proto.CopyFrom(_health(i, 10, neg_inf=3 if bad else 0))
            self.writer.write_event(event)
        self.writer.flush()

    def close(self):
        self.writer.close()


STATUS_BYTES = 4096


def write_status_sidecar(prefix, **fields):
    """Writes ``<prefix>.writer_status.json`` as the writer-status contract has it.

    A closed streaming writer that lost nothing, updated by ``fields``; the JSON
    is padded with spaces to exactly 4096 bytes and written in place.

    Returns:
      str: the sidecar's path.
    """
    status = {
        "version": 1, "pid": 1, "tfdbg_run_id": "test", "circular_buffer_size": -1,
        "state": "closed", "updated_wall_time": 1.0,
        "written": {"execution": 0, "graph_execution_traces": 0, "graphs": 0,
                    "stack_frames": 0, "source_files": 0},
        "evicted": {"execution": 0, "graph_execution_traces": 0},
        "lost": {}, "first_error": None,
    }
    status.update(fields)
    text = json.dumps(status).encode()
    assert len(text) <= STATUS_BYTES
    path = "%s.%s" % (prefix, filenames.STATUS_SUFFIX)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, text.ljust(STATUS_BYTES, b" "), 0)
    finally:
        os.close(fd)
    return path
