"""The native hook (``torch/native.py``, ``_native.cpp``) inside the process it records.

What only the native hook can get wrong in the program around it: memory it
holds (dead tensors' storages, outputs kept for autograd), Python objects it
must not make, an op's own error, other threads, forked children, the thread's
dispatch keys, and Dynamo's stance over compiled code.
"""

import os
import threading

import pytest
import torch
from torch import nn

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.demo import torch_mnist
from tb_numerics_plugin.torch import native
from dumps import read_run
from native_programs import capture


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

    capture(monkeypatch, "native", tmp_path, train, mode="NO_TENSOR")
    assert growth[0] < 30, "the process grew by %.0f MB over 80 steps" % growth[0]


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

    capture(monkeypatch, "native", tmp_path, train, mode="NO_TENSOR")
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

    handle = capture(monkeypatch, "native", tmp_path, build_and_train)
    assert handle.capture_path == "native"
    ops = {t["op_name"].split("/")[-1] for t in read_run(tmp_path).graph_execution_trace_digests()}
    ops |= {e["op_type"] for e in read_run(tmp_path).execution_digests()}
    assert "aten.mm.default" in ops or any("mm" in op or "addmm" in op for op in ops)


def test_ops_of_other_threads_are_not_recorded(monkeypatch, tmp_path):
    def train():
        worker = threading.Thread(target=lambda: torch.full((3,), 2.0).sin())
        worker.start()
        worker.join()
        torch.full((3,), 2.0).cos()

    capture(monkeypatch, "native", tmp_path, train)
    op_types = [e["op_type"] for e in read_run(tmp_path).execution_digests()]
    assert "aten.cos.default" in op_types
    assert "aten.sin.default" not in op_types


def test_an_op_that_raises_reaches_its_caller_and_later_ops_are_recorded(monkeypatch, tmp_path):
    """The op's own error goes through the hook to the program; the hook's key, excluded
    while the claimed op ran, is back for the next op."""
    def train():
        with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
            torch.ones(2, 3).mm(torch.ones(2, 3))
        torch.full((3,), 2.0).cos()

    capture(monkeypatch, "native", tmp_path, train)
    op_types = [e["op_type"] for e in read_run(tmp_path).execution_digests()]
    assert op_types[-1] == "aten.cos.default" and "aten.mm.default" not in op_types


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

    capture(monkeypatch, "native", tmp_path / "health", look)
    capture(monkeypatch, "native", tmp_path / "tensor", look, mode="FULL_TENSOR")
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
    assert "aten.log.default" in [e["op_type"] for e in read_run(tmp_path).execution_digests()]


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

    capture(monkeypatch, "native", tmp_path, train)
    assert during[0] != before and include_set() == before
    assert during[1].tolist() == pytest.approx([torch.e, torch.e])
    ops = [e["op_type"] for e in read_run(tmp_path).execution_digests()]
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

    capture(monkeypatch, "native", tmp_path, train)
    assert seen == {"child": b"1", "parent": (True, True)}
    op_types = [e["op_type"] for e in read_run(tmp_path).execution_digests()]
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
