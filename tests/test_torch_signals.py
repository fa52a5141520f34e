"""A capture in circular-buffer mode survives SIGTERM/SIGINT with a readable dump."""

import signal
import subprocess
import sys
import textwrap

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


def _read(tmp_path):
    run = Logdir(str(tmp_path / "dump")).run(".")
    run.update()
    return run


def test_sigterm_flushes_the_ring_and_still_terminates(tmp_path):
    proc = _run_until_ready(tmp_path, "plain")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, out
    run = _read(tmp_path)
    assert run.num_graph_execution_traces() == 50
    assert run.num_executions() > 0 and not run.warnings


def test_sigint_flushes_then_calls_the_previous_handler(tmp_path):
    proc = _run_until_ready(tmp_path, "chain")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
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
