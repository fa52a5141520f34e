"""The native per-op path (``torch/native.py``, ``_native.cpp``) against the dispatch mode.

The whole torch test-suite runs on the default path (the native hook) and
again with ``TB_NUMERICS_CAPTURE=python`` (``make test``); these tests
compare the two paths on one program, and check what
only the native hook can get wrong: Python objects it must not make, threads,
signals, Dynamo's stance, and a build that fails.
"""

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from torch import nn

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.demo import torch_mnist
from tb_numerics_plugin.reader import Logdir
from tb_numerics_plugin.torch import native, native_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(path):
    run = Logdir(str(path)).run(".")
    run.update()
    return run


def _capture(monkeypatch, path, tmp, train, mode="FULL_HEALTH"):
    """Runs ``train()`` under a capture on ``path``; returns the handle (closed)."""
    monkeypatch.setenv(native.ENV, path)
    with tbn.enable_dump_debug_info(str(tmp), mode, circular_buffer_size=-1) as handle:
        train()
    assert handle._session.errors == 0
    return handle


def _records(run):
    """What both paths must agree on: every trace with its values and its op's inputs, and
    every execution."""
    traces = []
    for t in run.graph_execution_trace_digests():
        op = run.op_info(t["graph_id"], t["op_name"])
        traces.append((t["graph_name"], t["op_name"], t["op_type"], t["output_slot"],
                       t["step"], t["health"], tuple(op["input_names"])))
    executions = [(e["op_type"], e["graph_id"], e["step"], tuple(e["output_tensor_ids"]))
                  for e in run.execution_digests()]
    return traces, executions


class _MatmulNet(nn.Module):
    """A 3-D matmul (``mm`` then an ``_unsafe_view`` alias), a detach and a log(0)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4, generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        h = torch.matmul(x, self.w)  # 3-D @ 2-D: mm on a flat view, then _unsafe_view
        d = h.detach()  # an alias output: the hook keeps no Python object for it
        return (h.relu() * 0).log().sum() + d.exp().sum()


def test_the_native_hook_is_the_default_and_the_dispatch_mode_is_chosen_by_name(
        monkeypatch, tmp_path, caplog):
    monkeypatch.delenv(native.ENV, raising=False)
    assert native.load() is not None, native.failure()  # a compiler is here, and in CI
    with tbn.enable_dump_debug_info(str(tmp_path / "a"), "FULL_HEALTH") as handle:
        assert native.installed()
        torch.ones(3).exp()
    assert handle.capture_path == "native" and not native.installed()
    caplog.clear()  # (a first build's warning, in a fresh cache)
    with caplog.at_level(logging.INFO, logger="tb_numerics_plugin.torch"):
        handle = _capture(monkeypatch, "python", tmp_path / "b", lambda: torch.ones(3).exp())
    assert handle.capture_path == "python"
    # the dispatch mode by name is no fallback: no warning for it
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    for run in ("a", "b"):  # eager ops: one execution each, the same on both paths
        ops_run = [e["op_type"] for e in _read(tmp_path / run).execution_digests()]
        assert ops_run == ["aten.ones.default", "aten.exp.default"], (run, ops_run)


def test_both_paths_write_the_same_records_for_the_demo_and_a_matmul(monkeypatch, tmp_path):
    def demo():
        torch.manual_seed(0)
        model = torch_mnist.Classifier(fix=False)  # log(softmax) underflows to log(0)
        x, labels = torch_mnist.synthetic_batch(torch.Generator().manual_seed(0))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(2):
            optimizer.zero_grad()
            model(x, labels).backward()
            optimizer.step()

    def matmul():
        torch.manual_seed(0)
        net = _MatmulNet()
        net(torch.ones(2, 3, 4)).backward()

    for name, train in (("demo", demo), ("matmul", matmul)):
        runs = {}
        for path in ("python", "native"):
            handle = _capture(monkeypatch, path, tmp_path / name / path, train)
            assert handle.capture_path == path
            runs[path] = _read(tmp_path / name / path)
        assert _records(runs["native"]) == _records(runs["python"]), name
        first = {p: analyze_run(r)["first_bad_tensor"] for p, r in runs.items()}
        assert first["native"] is not None
        assert first["native"]["op_name"] == first["python"]["op_name"]
    # the matmul's consumers name the real producer through the alias, on both paths
    run = runs["native"]
    (graph_id,) = [g for g in run.graph_ids() if run.graph_info(g)["name"] == "_MatmulNet.forward"]
    exp_inputs = run.op_info(graph_id, "_MatmulNet/exp_0")["input_names"]
    assert exp_inputs == ["_MatmulNet/mm_0:0"]
    assert first["native"]["op_name"] == "_MatmulNet/log_0"


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's /proc")
def test_the_memory_of_dead_tensors_is_reused_under_the_hook(monkeypatch, tmp_path):
    # The hook remembers the storages of recorded outputs through weak references. One
    # kept from a dead storage stopped its memory from being reused: the demo's 1.5 MB
    # weight gradient was allocated anew every step, and the process grew by about that
    # much per step (120 MB over these 80 steps) until a sweep of its table.
    model = torch_mnist.Classifier(fix=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, labels = torch_mnist.synthetic_batch(torch.Generator().manual_seed(0))
    growth = []

    def train():
        for step in range(90):
            if step == 10:
                before = _rss_mb()
            optimizer.zero_grad()
            model(x, labels).backward()
            optimizer.step()
        growth.append(_rss_mb() - before)

    _capture(monkeypatch, "native", tmp_path, train, mode="NO_TENSOR")
    assert growth[0] < 30, "the process grew by %.0f MB over 80 steps" % growth[0]


def test_the_optimizer_step_reads_the_gradients_backward_made(monkeypatch, tmp_path):
    # Backward's gradients reach .grad through AccumulateGrad's `detach` of a view of the
    # memory a recorded op wrote (a weight's `t` of an `mm`, a bias's `view` of a `sum`):
    # the view carries no tag, its base does. Before the hook read the base, only its
    # table of written storages named weights' gradients (same sizes and strides as the
    # `mm`), never biases' (a `[1, n]` sum seen as `[n]`), and a table kept for outputs
    # that require grad only lost the weights' too: the analysis then took the demo's
    # NaN gradients for ones that never reached a step.
    model = torch_mnist.Classifier(fix=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, labels = torch_mnist.synthetic_batch(torch.Generator().manual_seed(0))

    def train():
        for _ in range(2):
            optimizer.zero_grad()
            model(x, labels).backward()
            optimizer.step()

    _capture(monkeypatch, "native", tmp_path, train)  # FULL_HEALTH: values carry tensor ids
    run = _read(tmp_path)
    made = {int(run.graph_execution_trace(t["index"])["debug_tensor_value"][0])
            for t in run.graph_execution_trace_digests() if t["graph_name"] == "autograd.backward"}
    steps = [run.execution(e["index"]) for e in run.execution_digests()
             if e["op_type"] == "SGD.step"]
    assert len(steps) == 2
    params = len(list(model.parameters()))
    for step in steps:  # every parameter's gradient, biases' included
        assert len(set(step["input_tensor_ids"]) & made) == params, step["input_tensor_ids"]


class _SavesOutputs(nn.Module):
    """Ops whose autograd nodes save their outputs (relu, softmax, exp, sigmoid, tanh),
    and ops whose nodes save their inputs only (addmm, add, sum)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        h = self.lin(x).relu()
        a = torch.softmax(h, -1) + torch.exp(h) + torch.sigmoid(h) + torch.tanh(h)
        return a.sum()


def test_backward_reads_the_outputs_autograd_saved_as_their_producers(monkeypatch, tmp_path):
    # Autograd keeps a saved output as another tensor over its memory, which backward
    # reads: the hook names it by that memory, keeping it for the outputs their node
    # saves only (by the node's Python type: `_saved_result`).
    model = _SavesOutputs()
    x = torch.randn(4, 6)
    _capture(monkeypatch, "native", tmp_path, lambda: model(x).backward())
    run = _read(tmp_path)
    ids = {}  # forward op type and slot -> tensor id
    for t in run.graph_execution_trace_digests():
        if t["graph_name"] == "_SavesOutputs.forward":
            value = run.graph_execution_trace(t["index"])["debug_tensor_value"]
            ids[(t["op_type"].split(".")[1], t["output_slot"])] = int(value[0])
    backward = [run.execution(e["index"]) for e in run.execution_digests()
                if e["op_type"] == "autograd.backward"]
    assert len(backward) == 1
    read = set(backward[0]["input_tensor_ids"])
    saved = [("relu", 0), ("_softmax", 0), ("exp", 0), ("sigmoid", 0), ("tanh", 0)]
    assert [ids[k] in read for k in saved] == [True] * len(saved), (ids, read)
    assert ids[("addmm", 0)] not in read  # its node saves its inputs, not its output


class _ViewOfAnAlias(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(6, 5, bias=False)

    def forward(self, x):  # a 3-D input: mm, then _unsafe_view (an alias op) to 3-D
        logits = self.head(x)
        return torch.log_softmax(logits.view(-1, 5), -1).sum()  # a view of the alias


def test_a_view_of_an_alias_output_names_the_op_that_wrote_it(monkeypatch, tmp_path):
    # Under the native hook an alias output carries no tag attribute (its producer is
    # kept in C++); a view of it read its base's attribute only, and so was an outside
    # value: GPT-2's loss read its logits as a Placeholder (T5 108 such inputs in two
    # training steps, Llama 32).
    model = _ViewOfAnAlias()
    x = torch.randn(2, 3, 6)
    _capture(monkeypatch, "native", tmp_path, lambda: model(x).backward())
    run = _read(tmp_path)
    [trace] = [t for t in run.graph_execution_trace_digests()
               if t["op_type"] == "aten._log_softmax.default"]
    [name] = run.op_info(trace["graph_id"], trace["op_name"])["input_names"]
    producer = run.op_info(trace["graph_id"], name.rsplit(":", 1)[0])
    assert producer["op_type"] == "aten.mm.default", name


def test_a_dead_temporarys_storage_is_let_go_by_the_next_recorded_ops(monkeypatch, tmp_path):
    # Until the hook lets go of a dead storage's StorageImpl (a small block among the
    # tensors' data), glibc carved the next blocks out of the freed tensor memory: a loop
    # of `y = y + 1` on 4 MB tensors wrote each output to fresh memory (13-18 addresses
    # for 20 ops, against 2-5 uninstrumented), often with page faults on every op. Each
    # recorded op lets go of the temporaries that died among the last few it kept; a
    # sweep every 16 entries, as before, let up to 16 linger. (The outputs require grad:
    # under no_grad, outside backward, the hook keeps none.)
    lingering = _lingering_in_a_chain(monkeypatch, tmp_path, torch.enable_grad)
    assert len(lingering) == 40
    assert max(lingering) <= 2, lingering


def test_outputs_that_do_not_require_grad_are_not_kept_by_the_hook(monkeypatch, tmp_path):
    # Autograd saves for backward only outputs that require grad; the hook keeps no
    # other output (ops under no_grad, inference), not even for the next op or two.
    lingering = _lingering_in_a_chain(monkeypatch, tmp_path, torch.no_grad)
    assert lingering == [0] * 40


def _lingering_in_a_chain(monkeypatch, tmp_path, grad_mode):
    """``lingering()`` after each of 40 recorded ``y = y + 1`` on 4 kB, under ``grad_mode``."""
    module = native.load()
    lingering = []

    class Chain(nn.Module):
        def forward(self, y):
            for _ in range(40):
                y = y + 1
                lingering.append(module.lingering())
            return y

    def train():
        with grad_mode():
            Chain()(torch.zeros(1000, requires_grad=True))

    _capture(monkeypatch, "native", tmp_path, train, mode="NO_TENSOR")
    return lingering


def test_parameters_and_subclasses_made_under_the_hook_work(monkeypatch, tmp_path):
    class Tagged(torch.Tensor):
        pass

    def build_and_train():
        layer = nn.Linear(4, 3)  # Parameter(torch.empty(...)) detaches in C++
        scale = nn.Parameter(torch.randn(3) * 2)  # the output of a recorded op, detached
        view = (torch.ones(3) + 1).as_subclass(Tagged)  # an alias made for a subclass
        assert type(scale) is nn.Parameter and type(view) is Tagged
        (layer(torch.ones(2, 4)) * scale).sum().backward()
        assert layer.weight.grad is not None and scale.grad is not None

    handle = _capture(monkeypatch, "native", tmp_path, build_and_train)
    assert handle.capture_path == "native"
    ops = {t["op_name"].split("/")[-1] for t in _read(tmp_path).graph_execution_trace_digests()}
    ops |= {e["op_type"] for e in _read(tmp_path).execution_digests()}
    assert "aten.mm.default" in ops or any("mm" in op or "addmm" in op for op in ops)


def test_ops_of_other_threads_are_not_recorded(monkeypatch, tmp_path):
    def train():
        worker = threading.Thread(target=lambda: torch.full((3,), 2.0).sin())
        worker.start()
        worker.join()
        torch.full((3,), 2.0).cos()

    _capture(monkeypatch, "native", tmp_path, train)
    op_types = [e["op_type"] for e in _read(tmp_path).execution_digests()]
    assert "aten.cos.default" in op_types
    assert "aten.sin.default" not in op_types


def test_an_op_that_raises_reaches_its_caller_and_later_ops_are_recorded(monkeypatch, tmp_path):
    """The op's own error goes through the hook to the program; the hook's key, excluded
    while the claimed op ran, is back for the next op."""
    def train():
        with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
            torch.ones(2, 3).mm(torch.ones(2, 3))
        torch.full((3,), 2.0).cos()

    _capture(monkeypatch, "native", tmp_path, train)
    op_types = [e["op_type"] for e in _read(tmp_path).execution_digests()]
    assert op_types[-1] == "aten.cos.default" and "aten.mm.default" not in op_types


def _library_op(namespace, op, kernel):
    """A library defining ``namespace::op(Tensor x) -> Tensor`` with ``kernel`` (Python)."""
    lib = torch.library.Library(namespace, "DEF")
    lib.define("%s(Tensor x) -> Tensor" % op)
    lib.impl(op, kernel, "CompositeExplicitAutograd")
    return lib


def test_an_operator_made_after_another_was_removed_is_recorded_as_itself(
        monkeypatch, tmp_path):
    """The hook keeps each thread's verdicts by the operator's entry in the dispatcher.
    A removed operator's entry may come back as the next one's: removing operators
    empties those caches, so the new operator is judged and recorded as itself, not as
    the one it replaced."""
    def train():
        first = _library_op("tbn_first", "triple", lambda x: x * 3)
        torch.ops.tbn_first.triple(torch.ones(3))
        first._destroy()  # its operator leaves the dispatcher
        second = _library_op("tbn_second", "halve", lambda x: x / 2)
        torch.ops.tbn_second.halve(torch.ones(3))
        second._destroy()

    _capture(monkeypatch, "native", tmp_path, train)
    op_types = [e["op_type"] for e in _read(tmp_path).execution_digests()]
    ours = [op_type for op_type in op_types if op_type.startswith("tbn_")]
    assert ours == ["tbn_first.triple.default", "tbn_second.halve.default"]


def _watching_compiles():
    from torch._dynamo import callback_handler

    callbacks = callback_handler.start_callbacks + callback_handler.end_callbacks
    return [cb.__qualname__ for cb in callbacks if cb.__module__ == native.__name__]


def test_compiled_code_stays_compiled_under_the_hook_unless_full_tensor(monkeypatch, tmp_path):
    """Health modes keep compiled regions compiled (no stance; the hook pauses while
    torch.compile compiles); FULL_TENSOR runs them eagerly, and both settings come back."""
    from torch._dynamo import eval_frame

    before = eval_frame._stance.stance
    seen = []

    def look():
        seen.append((eval_frame._stance.stance, _watching_compiles()))

    _capture(monkeypatch, "native", tmp_path / "health", look)
    _capture(monkeypatch, "native", tmp_path / "tensor", look, mode="FULL_TENSOR")
    watch = ["_watch_compiles.<locals>.started", "_watch_compiles.<locals>.ended"]
    assert seen == [(before, watch), ("force_eager", [])]
    assert eval_frame._stance.stance == before and _watching_compiles() == []


def test_without_torch_compiles_callbacks_compiled_code_runs_eagerly(monkeypatch, tmp_path):
    """A torch whose Dynamo lacks the compile callbacks: the hook cannot tell a compiler's
    ops from the program's, so compiled code runs eagerly; counted, and recording goes on."""
    from torch._dynamo import eval_frame

    def missing(module):
        raise AttributeError("module 'torch._dynamo' has no attribute 'callback_handler'")

    monkeypatch.setattr(native, "_watch_compiles", missing)
    monkeypatch.setenv(native.ENV, "native")
    seen = []
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", circular_buffer_size=-1) as h:
        seen.append(eval_frame._stance.stance)
        torch.full((3,), 0.0).log()
    assert seen == ["force_eager"] and h.capture_path == "native" and h._session.errors == 1
    assert "aten.log.default" in [e["op_type"] for e in _read(tmp_path).execution_digests()]


def test_a_bad_capture_path_names_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(native.ENV, "fast")
    with pytest.raises(ValueError, match="TB_NUMERICS_CAPTURE must be one of python, native, "
                                         "not 'fast'"):
        tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH")


FAILED_BUILD = textwrap.dedent('''
    import logging, sys, torch
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    from tb_numerics_plugin import torch as tbn
    with tbn.enable_dump_debug_info(sys.argv[1], "FULL_HEALTH") as handle:
        torch.full((3,), 0.0).log()
    print("path", handle.capture_path, "errors", handle._session.errors)
''')


def _build_env(tmp_path):
    """A fresh cache and no compiler: a build starts and fails at once."""
    env = dict(os.environ, TB_NUMERICS_CACHE=str(tmp_path / "c"),
               CXX=str(tmp_path / "no-such-compiler"), PYTHONPATH=ROOT)  # this checkout's name
    env.pop(native.ENV, None)
    return env


def test_a_failed_build_falls_back_to_the_dispatch_mode_and_is_not_tried_again(tmp_path):
    """The default path, where the hook cannot be built (no compiler): the build is
    announced (the program waits for it), and the dispatch mode records the run. The
    failure is noted in the cache: the next process says so without building, and
    ``tb-numerics build-native`` tries again."""
    script = tmp_path / "worker.py"
    script.write_text(FAILED_BUILD)
    env = _build_env(tmp_path)
    failed = tmp_path / "c" / "native" / native_build.build_name() / native_build.FAILED
    building = "WARNING tb-numerics: building the native capture hook for torch %s in %s" % (
        torch.__version__, failed.parent)
    fallback = "WARNING tb-numerics: per-op capture path: python (the native hook is unavailable"
    runs = []
    for dump in ("first", "second"):
        proc = subprocess.run([sys.executable, str(script), str(tmp_path / dump)], env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert "path python errors 0" in proc.stdout and fallback in proc.stderr
        first = analyze_run(_read(tmp_path / dump))["first_bad_tensor"]
        assert first is not None and first["op_type"] == "aten.log.default"
        runs.append(proc.stderr)
    assert building in runs[0] and "no-such-compiler" in runs[0]
    assert "no-such-compiler" in failed.read_text()
    assert building not in runs[1]
    assert "an earlier build failed and is not tried again (%s; `tb-numerics build-native` " \
           "tries again)" % failed in runs[1] and "no-such-compiler" in runs[1]
    proc = subprocess.run([sys.executable, "-m", "tb_numerics_plugin", "build-native"],
                          env=env, capture_output=True, text=True, timeout=300)
    # (the CLI leaves logging unconfigured: Python's last-resort handler, no level name)
    assert proc.returncode != 0 and building.replace("WARNING ", "") in proc.stderr, proc.stderr
    assert "earlier build" not in proc.stderr and failed.exists()


def test_a_build_lock_left_by_a_killed_build_is_removed_not_waited_on(tmp_path):
    """torch's build (up to 2.13) waits on its lock file for ever; one found while no
    process holds the builders' flock was left by a killed build, however recent.
    Removed with a warning naming it, the build runs (and here fails at once: no
    compiler), and the capture goes on on the dispatch mode. torch 2.14 holds an OS lock
    of that file instead: the file is left alone, and does not block the build."""
    script = tmp_path / "worker.py"
    script.write_text(FAILED_BUILD)
    lock = tmp_path / "c" / "native" / native_build.build_name() / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()  # as a build killed a moment ago leaves it
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "dump")],
                          env=_build_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "path python errors 0" in proc.stdout
    assert "building the native capture hook for torch" in proc.stderr
    removed = "WARNING tb-numerics: removing %s, a build lock left" % lock
    if native_build.lock_file_blocks():
        assert removed in proc.stderr and not lock.exists()
    else:
        assert "removing" not in proc.stderr


def test_a_build_in_progress_in_another_process_is_waited_for(tmp_path):
    """Another process holding the builders' flock is building: a second one says so and
    waits (its torch lock stays), then goes on when the flock is released."""
    import fcntl

    script = tmp_path / "worker.py"
    script.write_text(FAILED_BUILD)
    directory = tmp_path / "c" / "native" / native_build.build_name()
    directory.mkdir(parents=True)
    (directory / "lock").touch()  # the live builder's torch lock
    stderr = tmp_path / "stderr.txt"
    with open(directory / native_build.BUILD_LOCK, "a") as held, open(stderr, "w") as err:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "dump")],
                                env=_build_env(tmp_path), stdout=subprocess.PIPE, stderr=err,
                                text=True)
        try:
            deadline = time.time() + 120
            while "waiting for it" not in stderr.read_text() and time.time() < deadline:
                assert proc.poll() is None, stderr.read_text()
                time.sleep(0.2)
            time.sleep(1)
            assert proc.poll() is None and (directory / "lock").exists(), stderr.read_text()
            (directory / "lock").unlink()  # the live build ends: its lock goes, then the flock
        finally:
            fcntl.flock(held.fileno(), fcntl.LOCK_UN)
        out, _ = proc.communicate(timeout=120)
    text = stderr.read_text()
    assert proc.returncode == 0, text
    assert "another process is building the native capture hook in %s; waiting for it" % (
        directory) in text
    assert "removing" not in text and "path python errors 0" in out
    assert text.index("waiting for it") < text.index("building the native capture hook for")


def test_the_hooks_dispatch_key_is_on_the_thread_only_while_capturing(monkeypatch, tmp_path):
    """The hook adds its key to the thread's dispatch keys for the capture and takes it
    away after; higher-order operators (Python-dispatched) fall through it meanwhile."""
    include_set = torch._C._dispatch_tls_local_include_set
    before = include_set()
    during = []

    twice = _twice()

    def train():
        during.append(include_set())
        during.append(twice(torch.exp, torch.zeros(2)))  # dispatched in Python by the keys

    _capture(monkeypatch, "native", tmp_path, train)
    assert during[0] != before and include_set() == before
    assert during[1].tolist() == pytest.approx([torch.e, torch.e])
    ops = [e["op_type"] for e in _read(tmp_path).execution_digests()]
    assert ops.count("aten.exp.default") == 2


def test_a_forked_child_runs_its_ops_below_the_hook(monkeypatch, tmp_path):
    """A forked child (a DataLoader worker) inherits the hook's key on the forking thread
    but not the capture's writer: the hook is taken off in the child, whose ops run
    below it without crossing into Python, while the parent goes on capturing."""
    include_set = torch._C._dispatch_tls_local_include_set
    outside = include_set()
    seen = {}

    def train():
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: answers through the pipe, never returns into pytest
            try:
                ok = (not native.installed() and include_set() == outside
                      and torch.full((2,), 0.0).exp().tolist() == [1.0, 1.0])
                os.write(write_end, b"1" if ok else b"0")
            finally:
                os._exit(0)
        os.close(write_end)
        seen["child"] = os.read(read_end, 1)
        os.close(read_end)
        os.waitpid(pid, 0)
        seen["parent"] = (native.installed(), include_set() != outside)
        torch.full((3,), 2.0).cos()

    _capture(monkeypatch, "native", tmp_path, train)
    assert seen == {"child": b"1", "parent": (True, True)}
    op_types = [e["op_type"] for e in _read(tmp_path).execution_digests()]
    assert "aten.cos.default" in op_types and "aten.exp.default" not in op_types


def _twice():
    """A higher-order operator with a CPU kernel (fn applied twice), made before the
    capture: without its fall-through, its dispatch finds no kernel for the hook's key."""
    from torch._C import DispatchKey
    from torch._ops import HigherOrderOperator

    class Twice(HigherOrderOperator):
        def __init__(self):
            super().__init__("tbn_test_twice")

        def __call__(self, fn, x):
            return super().__call__(fn, x)

    op = Twice()
    op.fallthrough(DispatchKey.AutogradCPU)
    op.py_impl(DispatchKey.CPU)(lambda fn, x: fn(fn(x)))
    return op


def test_the_choice_is_logged_once(monkeypatch, tmp_path, caplog):
    native._State.logged.clear()
    with caplog.at_level(logging.INFO, logger="tb_numerics_plugin.torch"):
        for i in range(2):
            _capture(monkeypatch, "native", tmp_path / str(i), lambda: torch.ones(2).exp())
    said = [r.getMessage() for r in caplog.records if "per-op capture path" in r.getMessage()]
    assert said == ["tb-numerics: per-op capture path: native (C++ dispatch-key hook)"]
