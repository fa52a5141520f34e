"""Fixtures of the browser tests: real dumps, a real ``tensorboard`` process, headless Chromium.

Dumps are made by running the real demos (PyTorch and TensorFlow MNIST whose loss takes
``log(probs)`` of underflowed probabilities), a real fp16 torch program, tiny real models of
``tests/models.py`` (T5 in float16 that overflows, a healthy causal ``nn.TransformerEncoder``, a
plain-function loss taking ``log`` eagerly), plus synthetic dumps
(a million traces, twenty thousand executions, two ranks) written with
:class:`tb_numerics_plugin.writer.FileSetWriter`. TensorBoard serves them on a free port; the
plugin's entry page (what the tab loads in its iframe) is opened at 1280×800.
"""

import contextlib
import os
import socket
import struct
import subprocess
import sys
import time

import pytest

from browser_helpers import (
    BIG_BAD_INDEX,
    BIG_TRACES,
    CHROMIUM,
    CHROMIUM_ARGS,
    MANY_EXECUTIONS,
    get_json,
)
from processes import stop

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_demo(module, dump_dir):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", module, "--dump_dir", dump_dir, "--dump_tensor_debug_mode", "FULL_HEALTH"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert proc.returncode == 0, "%s failed:\n%s" % (module, proc.stderr[-3000:])


def _run_torch_program(name, dump_dir):
    """Runs one program of tests/torch_programs.py (a real torch program) into ``dump_dir``."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    script = os.path.join(TESTS, "torch_programs.py")
    proc = subprocess.run([sys.executable, script, name, dump_dir], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, "%s failed:\n%s" % (name, proc.stderr[-3000:])


def _health(tensor_id, size, neg_inf=0, nan=0):
    """A FULL_HEALTH TensorProto payload: float32, rank 1, all positive except the bad counts."""
    from tb_numerics_plugin.proto import tensor_pb2

    values = [tensor_id, -1, 1, 1, size, neg_inf, 0, nan, 0, 0, size - neg_inf - nan]
    proto = tensor_pb2.TensorProto(dtype=2, tensor_content=struct.pack("<11d", *values))
    proto.tensor_shape.dim.add().size = len(values)
    return proto


def write_big_dump(dump_dir, num_traces=BIG_TRACES, bad_index=BIG_BAD_INDEX, host_name="big", part=None):
    """Writes one file set with ``num_traces`` traces of a four-op graph, one of them bad.

    ``bad_index`` None writes no bad trace; ``part`` (``"rank1"``) names one rank's file set.

    Each op's trace is serialized once and its bytes reused: a million protobuf builds would
    take minutes, the framing alone takes seconds.
    """
    from tb_numerics_plugin.proto import debug_event_pb2 as pb
    from tb_numerics_plugin.writer import FileSetWriter

    ops = [("x", "Placeholder", []), ("matmul", "MatMul", ["x:0"]), ("relu", "Relu", ["matmul:0"]),
           ("log", "Log", ["relu:0"])]
    source = ["import numerics_demo as nd", "x = nd.input()", "h = nd.matmul(x, w)",
              "r = nd.relu(h)", "y = nd.log(r)  # the big dump's log"]
    with FileSetWriter(dump_dir, circular_buffer_size=-1, host_name=host_name, part=part) as writer:
        file_index = writer.add_source_file("/home/user/big_model.py", source)
        for i, (name, op_type, inputs) in enumerate(ops):
            frame = pb.DebugEvent(wall_time=1.0)
            frame.stack_frame_with_id.id = "f%d" % i
            loc = frame.stack_frame_with_id.file_line_col
            loc.file_index, loc.line, loc.func, loc.code = file_index, i + 2, "<module>", source[i + 1]
            writer.write_event(frame)
            op = pb.DebugEvent(wall_time=1.0)
            c = op.graph_op_creation
            c.op_type, c.op_name, c.graph_name, c.graph_id = op_type, name, "big_graph", "g1"
            c.input_names.extend(inputs)
            c.num_outputs = 1
            c.code_location.host_name = host_name
            c.code_location.stack_frame_ids.append("f%d" % i)
            writer.write_event(op)
        graph = pb.DebugEvent(wall_time=1.0)
        graph.debugged_graph.graph_id, graph.debugged_graph.graph_name = "g1", "big_graph"
        writer.write_event(graph)
        payloads = []
        for i, (name, _, _) in enumerate(ops):
            ev = pb.DebugEvent(wall_time=2.0)
            t = ev.graph_execution_trace
            t.tfdbg_context_id, t.op_name, t.output_slot = "g1", name, 0
            t.tensor_debug_mode = pb.FULL_HEALTH
            t.tensor_proto.CopyFrom(_health(i, 64))
            payloads.append(ev.SerializeToString())
        bad = pb.DebugEvent()
        bad.ParseFromString(payloads[3])
        bad.graph_execution_trace.tensor_proto.CopyFrom(_health(3, 64, neg_inf=5))
        bad_payload = bad.SerializeToString()
        assert bad_index is None or bad_index % 4 == 3, "the bad trace must be a log op"
        for i in range(num_traces):
            writer.write_serialized("graph_execution_traces", bad_payload if i == bad_index else payloads[i % 4])
        ex = pb.DebugEvent(wall_time=3.0)
        ex.execution.op_type, ex.execution.graph_id, ex.execution.num_outputs = "__inference_big_1", "g1", 1
        ex.execution.tensor_debug_mode = pb.FULL_HEALTH
        writer.write_event(ex)


def write_many_executions(dump_dir, num_executions=MANY_EXECUTIONS):
    """Writes a file set of ``num_executions`` eager executions named ``op_<index>``."""
    from tb_numerics_plugin.proto import debug_event_pb2 as pb
    from tb_numerics_plugin.writer import FileSetWriter

    with FileSetWriter(dump_dir, circular_buffer_size=-1, host_name="many") as writer:
        for i in range(num_executions):
            ev = pb.DebugEvent(wall_time=10.0 + i)
            ev.execution.op_type, ev.execution.num_outputs = "op_%d" % i, 1
            ev.execution.output_tensor_ids.append(i)
            ev.execution.tensor_debug_mode = pb.FULL_HEALTH
            ev.execution.tensor_protos.add().CopyFrom(_health(-1, 64))
            writer.write_event(ev)


# Runs of tests/models.py in the logdir: tiny random-init models trained a step or two on CPU.
MODEL_RUNS = ("t5_fp16_overflow", "transformer_encoder", "plain_function_loss")


def _run_models(root):
    """Dumps each program of ``MODEL_RUNS`` into ``root/<name>`` (about 3 s each)."""
    import models  # tests/models.py (on sys.path through tests/conftest.py); imports torch

    for name in MODEL_RUNS:
        getattr(models, name)(str(root / name))


def _free_port():
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("numerics_logdir")
    _run_demo("tb_numerics_plugin.demo.torch_mnist", str(root / "torch_mnist"))
    _run_demo("tb_numerics_plugin.demo.tf_mnist", str(root / "tf_mnist"))
    write_big_dump(str(root / "big"))
    _run_torch_program("fp16_overflow", str(root / "fp16_overflow"))
    write_many_executions(str(root / "many_executions"))
    _run_models(root)
    # Two ranks of one run: rank0 healthy, rank1 with one bad trace.
    write_big_dump(str(root / "ranks"), num_traces=8, bad_index=None, host_name="node", part="rank0")
    write_big_dump(str(root / "ranks"), num_traces=12, bad_index=7, host_name="node", part="rank1")
    return root


@contextlib.contextmanager
def _tensorboard(logdir, expected_runs, log_path):
    """Runs ``tensorboard`` on a free port until the plugin lists ``expected_runs``; yields its URL.

    The process is terminated (killed if it lingers) on the way out, whatever happened.
    """
    port = _free_port()
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
         "--port", str(port), "--reload_interval", "0"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    base = "http://127.0.0.1:%d" % port
    try:
        deadline = time.time() + 180
        while True:
            try:
                runs = get_json(base + "/data/plugin/numerics/runs")["runs"]
                if set(expected_runs) <= {r["run"] for r in runs}:
                    break
            except (OSError, ValueError, KeyError):
                pass
            assert proc.poll() is None, "tensorboard exited; see %s" % log_path
            assert time.time() < deadline, "tensorboard did not list the runs in time; see %s" % log_path
            time.sleep(0.5)
        yield base
    finally:
        stop(proc)
        log.close()


@pytest.fixture(scope="session")
def server(logdir):
    """Base URL of a tensorboard process serving the demo logdir."""
    with _tensorboard(logdir, {"torch_mnist", "tf_mnist", "big", "ranks", "fp16_overflow",
                                       "many_executions", *MODEL_RUNS},
                      os.path.join(str(logdir), "tensorboard.log")) as base:
        yield base


# A real torch program run as two ranks (RANK=0, RANK=1, no process group): only rank 1's input
# holds NaN, so only rank 1's dump has bad tensors.
RANKED_PROGRAM = """
import sys
import torch
from torch import nn
from tb_numerics_plugin import torch as tbn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
with tbn.enable_dump_debug_info(sys.argv[1], "FULL_HEALTH", circular_buffer_size=-1):
    x = torch.ones(3, 4)
    if sys.argv[2] == "1":
        x = torch.sqrt(x - 2.0)  # NaN: the first bad tensor, on rank 1 only
    model(x).sum().backward()
"""


def _run_ranks(dump_dir, script):
    for rank in ("0", "1"):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", RANK=rank, MASTER_ADDR="127.0.0.1",
                   MASTER_PORT="29999")
        proc = subprocess.run([sys.executable, str(script), dump_dir, rank], capture_output=True,
                              text=True, timeout=600, env=env)
        assert proc.returncode == 0, "rank %s failed:\n%s" % (rank, proc.stderr[-3000:])


def _write_ring_with_status(dump_dir):
    """A ring-buffered dump whose writer-status sidecar (written here, per the contract) says
    that the ring dropped earlier traces and that 12 records were lost to a full disk."""
    from test_plugin_helpers import write_status_sidecar

    write_big_dump(dump_dir, num_traces=40, bad_index=None, host_name="ringhost")
    (prefix,) = {p.rsplit(".", 1)[0] for p in os.listdir(dump_dir) if p.endswith(".metadata")}
    write_status_sidecar(
        os.path.join(dump_dir, prefix), circular_buffer_size=40,
        written={"execution": 1, "graph_execution_traces": 1000},
        evicted={"execution": 0, "graph_execution_traces": 960},
        lost={"ENOSPC": 12}, first_error="%s.graph_execution_traces: [Errno 28] ENOSPC" % prefix)


@pytest.fixture(scope="module")
def hosts_server(tmp_path_factory):
    """Base URL of a tensorboard process serving two small runs: ``ranks_torch`` (a real torch
    program as two ranks, NaN on rank 1 only) and ``ring_status`` (a writer status with notes)."""
    root = tmp_path_factory.mktemp("hosts_logdir")
    script = root / "ranked.py"
    script.write_text(RANKED_PROGRAM)
    logdir = root / "logdir"
    _run_ranks(str(logdir / "ranks_torch"), script)
    _write_ring_with_status(str(logdir / "ring_status"))
    with _tensorboard(logdir, {"ranks_torch", "ring_status"}, str(root / "tensorboard.log")) as base:
        yield base


@pytest.fixture(scope="module")
def steps_server(tmp_path_factory):
    """Base URL of a tensorboard process serving ``marked``: the miniature model of
    tests/dumps.py with real Execution/GraphExecutionTrace protos carrying ``step`` (steps 10 to
    14 after one unmarked iteration; Log goes -inf from step 13), and ``unmarked`` (no steps)."""
    import dumps
    from test_steps_reader import write_step_dump

    root = tmp_path_factory.mktemp("steps_logdir")
    logdir = root / "logdir"
    write_step_dump(str(logdir / "marked"))
    dumps.write_dump(str(logdir / "unmarked"))
    with _tensorboard(logdir, {"marked", "unmarked"}, str(root / "tensorboard.log")) as base:
        yield base


@pytest.fixture
def empty_server(tmp_path):
    """Base URL of a tensorboard process whose logdir holds no dump."""
    (tmp_path / "logdir").mkdir()
    with _tensorboard(tmp_path / "logdir", set(), str(tmp_path / "tensorboard.log")) as base:
        yield base


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = context.new_page()
    errors = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    try:
        yield pg
        assert not errors, "uncaught errors in the page: %s" % errors
    finally:
        context.close()


