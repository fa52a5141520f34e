"""A capture survives the ways a program stops: SIGTERM/SIGINT (circular-buffer mode keeps a
readable dump) and stalls (the flush thread writes what an open execution recorded)."""

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time

import torch

from tb_numerics_plugin import torch as tbn

from tb_numerics_plugin.reader import Logdir

WORKER = textwrap.dedent('''
    import signal, sys, torch
    from tb_numerics_plugin import torch as tbn
    from tb_numerics_plugin.demo import torch_mnist

    if sys.argv[2] == "chain":
        def on_int(signum, frame):
            print("user handler ran", flush=True)
            sys.exit(7)
        signal.signal(signal.SIGINT, on_int)
    tbn.enable_dump_debug_info(sys.argv[1], "CURT_HEALTH", circular_buffer_size=50)
    model = torch_mnist.Classifier(fix=True)
    x, labels = torch_mnist.synthetic_batch(torch.Generator().manual_seed(0))
    step = 0
    while True:
        model(x, labels).backward()
        step += 1
        if step == 5:  # the ring (50 traces) is full well before this
            print("ready", flush=True)
''')


def _run_until_ready(tmp_path, mode):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "dump"), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _communicate(proc, timeout=60):
    """The worker's output once it exits; one still running after ``timeout`` is killed (and
    the test fails) rather than left spinning on the machine."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise


def _sidecar(tmp_path):
    (path,) = (tmp_path / "dump").glob("*.writer_status.json")
    return json.loads(path.read_text())


def _read(tmp_path):
    run = Logdir(str(tmp_path / "dump")).run(".")
    run.update()
    return run


def test_sigterm_flushes_the_ring_and_still_terminates(tmp_path):
    proc = _run_until_ready(tmp_path, "plain")
    proc.send_signal(signal.SIGTERM)
    out = _communicate(proc)
    assert proc.returncode == -signal.SIGTERM, out
    run = _read(tmp_path)
    assert run.num_graph_execution_traces() == 50
    # the only warnings say what the ring dropped; nothing lost, no damage
    assert run.num_executions() > 0 and run.warnings
    assert all("ring buffer of 50 kept the last" in w for w in run.warnings), run.warnings
    status = _sidecar(tmp_path)
    assert status["evicted"]["graph_execution_traces"] == (
        status["written"]["graph_execution_traces"] - 50) > 0
    assert status["lost"] == {} and status["first_error"] is None


def test_sigint_flushes_then_calls_the_previous_handler(tmp_path):
    proc = _run_until_ready(tmp_path, "chain")
    proc.send_signal(signal.SIGINT)
    out = _communicate(proc)
    assert proc.returncode == 7 and "user handler ran" in out
    assert _read(tmp_path).num_graph_execution_traces() == 50


EXIT_WORKER = textwrap.dedent('''
    import sys, torch
    from tb_numerics_plugin import torch as tbn
    tbn.enable_dump_debug_info(sys.argv[1], "FULL_HEALTH", circular_buffer_size=20)
    x = torch.ones(3)
    for _ in range(30):
        x = torch.mul(x, 2.0)
    torch.log(-x)  # the last op: its eager execution is still open at exit
''')


def test_exit_without_disable_writes_the_open_execution(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(EXIT_WORKER)
    subprocess.run([sys.executable, str(script), str(tmp_path / "dump")], check=True, timeout=60)
    run = _read(tmp_path)
    assert run.num_executions() == 20
    last = run.execution(19)
    assert last["op_type"] == "aten.log.default" and last["health"]["nan"] == 3


class _Blocking(torch.nn.Module):
    """A forward that blocks half-way (a hung collective, say) until ``release`` is set."""

    def __init__(self):
        super().__init__()
        self.reached = threading.Event()
        self.release = threading.Event()

    def forward(self, x):
        y = torch.log(x)  # -inf where x == 0
        self.reached.set()
        self.release.wait(timeout=120)
        return torch.exp(y)


def test_a_forward_stalled_half_way_is_written_as_far_as_it_got(tmp_path):
    model = _Blocking()
    done = []

    def program():  # the capture sees the thread that enabled it: here, this one
        x = torch.zeros(4)
        with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1, flush_interval_s=0.1):
            model(x)
        done.append(True)

    worker = threading.Thread(target=program)
    worker.start()
    try:
        assert model.reached.wait(timeout=120)
        deadline = time.monotonic() + 60  # a bound for a loaded machine, not a speed claim
        while True:
            run = Logdir(str(tmp_path)).run(".")
            run.update()
            if run.num_graph_execution_traces():
                break
            assert time.monotonic() < deadline, "the stalled forward never reached the disk"
            time.sleep(0.1)
        assert not done  # read while the forward is still blocked
        (trace,) = run.graph_execution_trace_digests(0, 1)
        assert trace["op_type"] == "aten.log.default" and trace["health"]["neg_inf"] == 4
    finally:
        model.release.set()
        worker.join(timeout=120)
    run = Logdir(str(tmp_path)).run(".")
    run.update()
    # the rest of the call became a second execution of the same name
    assert [e["op_type"] for e in run.execution_digests(0, run.num_executions())] == [
        "_Blocking.forward", "_Blocking.forward"]
    assert [t["op_type"] for t in run.graph_execution_trace_digests(0, 2)] == [
        "aten.log.default", "aten.exp.default"]


# A signal whose handler runs while the recording's own Python runs (here: sent from inside it,
# at the first op, which opens an execution) and ends the program; the op is called at module
# level, where nothing catches what the handler raised (Python 3.11 then exits 0 for an exception
# left unnormalized, as one raised asynchronously by class is)
IN_RECORDING_WORKER = textwrap.dedent('''
    import os, signal, sys, torch
    from tb_numerics_plugin import torch as tbn
    from tb_numerics_plugin.torch import capture

    def on_int(signum, frame):
        print("user handler ran", flush=True)
        sys.exit(7)
    if sys.argv[2] == "exit":
        signal.signal(signal.SIGINT, on_int)
    else:  # Python's own: a parent that ignores SIGINT (as the test run may, by then) has
        # its children start with it ignored, and Python leaves it so
        signal.signal(signal.SIGINT, signal.default_int_handler)
    segment_for_op = capture.Session._segment_for_op
    def sent_first(self, node):  # the first op opens an execution: the signal comes then
        capture.Session._segment_for_op = segment_for_op
        os.kill(os.getpid(), signal.SIGINT)
        return segment_for_op(self, node)
    capture.Session._segment_for_op = sent_first
    tbn.enable_dump_debug_info(sys.argv[1], "FULL_HEALTH")
    if sys.argv[2] == "exit":
        y = torch.mul(torch.ones(3), 2.0)
    else:
        try:
            y = torch.mul(torch.ones(3), 2.0)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    print("went on", flush=True)
''')


def _run_in_recording_worker(tmp_path, handler):
    script = tmp_path / "worker.py"
    script.write_text(IN_RECORDING_WORKER)
    return subprocess.run([sys.executable, str(script), str(tmp_path / "dump"), handler],
                          capture_output=True, text=True, timeout=120)


def test_an_exit_raised_by_a_signal_handler_during_the_recording_keeps_its_code(tmp_path):
    proc = _run_in_recording_worker(tmp_path, "exit")
    assert proc.stdout == "user handler ran\n", proc.stdout + proc.stderr
    assert proc.returncode == 7, proc.stderr


def test_an_interrupt_during_the_recording_reaches_the_users_except_clause(tmp_path):
    proc = _run_in_recording_worker(tmp_path, "default")
    assert proc.stdout == "interrupted\nwent on\n", proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stderr
