"""The PyTorch capture, checked through the project's reader and analysis.

Every test runs a real torch program into a temporary dump and reads it back
with ``tb_numerics_plugin.reader`` (TensorFlow's own reader is exercised in
test_torch_tf_reader.py).
"""

import inspect
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.demo import torch_mnist
from dumps import read_run as read


def traces(run, host=None):
    n = run.num_graph_execution_traces(host)
    return [run.graph_execution_trace(i, host) for i in range(n)]


def line_of(func, text):
    """Returns (file, line number) of the first line of ``func`` containing ``text``."""
    lines, start = inspect.getsourcelines(func)
    for k, line in enumerate(lines):
        if text in line:
            return inspect.getsourcefile(func), start + k
    raise AssertionError("%r not in %s" % (text, func))


def test_demo_first_bad_tensor_is_log_of_softmax_zeros_at_the_log_line(tmp_path):
    losses = torch_mnist.run(str(tmp_path), "FULL_HEALTH", steps=2)
    assert all(l != l for l in losses)  # NaN, the demo's point
    first = analyze_run(read(tmp_path))["first_bad_tensor"]
    assert first["op_type"] == "aten.log.default"
    assert first["health"]["neg_inf"] > 0
    (inp,) = first["inputs"]
    assert inp["op_type"] == "aten._softmax.default"
    assert inp["health"]["zero"] > 0 and not inp["health"]["any_inf_or_nan"]
    path, line = line_of(torch_mnist.Classifier.forward, "torch.log(probs)")
    assert os.path.samefile(first["source"]["file"], path)
    assert first["source"]["line"] == line
    assert "torch.log(probs)" in first["source"]["code"]


def test_demo_fix_leaves_no_bad_tensor_and_dump_is_small(tmp_path):
    losses = torch_mnist.run(str(tmp_path), "FULL_HEALTH", fix=True, steps=3)
    assert all(l == l for l in losses)
    run = read(tmp_path)
    assert analyze_run(run)["first_bad_tensor"] is None
    assert run.num_graph_execution_traces() > 0
    size = sum(os.path.getsize(tmp_path / f) for f in os.listdir(tmp_path))
    assert size < 4 << 20


@pytest.mark.parametrize("extension", ["missing", "stale"])
def test_without_the_record_extension_the_python_token_and_ids_record_the_demo(tmp_path,
                                                                               extension):
    """Where ``_record`` is not built, or is a build older than its shared state objects,
    the recording token and the tensor ids are their Python twins (``gate.PyToken``,
    ``tags.PyIds``) and every op is recorded in Python: the demo's story is the one the
    extension's run tells, tensor ids and all."""
    script = textwrap.dedent("""
        import sys, types
        if sys.argv[2] == "missing":  # as if never built
            sys.modules["tb_numerics_plugin.torch._record"] = None
        else:  # as if built before Token and Ids
            sys.modules["tb_numerics_plugin.torch._record"] = types.ModuleType("_record")
        from tb_numerics_plugin.demo import torch_mnist
        from tb_numerics_plugin.torch import capture, gate, recorder, tags
        assert recorder._c_record is None
        if sys.argv[2] == "stale":
            assert "stale build" in recorder._C_RECORD_FAILURE, recorder._C_RECORD_FAILURE
        assert gate.Token is gate.PyToken and tags.Ids is tags.PyIds
        errors = []
        started = capture.Session.start
        def start(self):
            errors.append(self)
            return started(self)
        capture.Session.start = start
        torch_mnist.run(sys.argv[1], "FULL_HEALTH", steps=2)
        print("errors", sum(session.errors for session in errors),
              type(errors[0].gate).__name__, type(errors[0].tensor_ids).__name__)
        """)
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "python"), extension],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-3:] == ["0", "PyToken", "PyIds"], proc.stdout
    torch_mnist.run(str(tmp_path / "c"), "FULL_HEALTH", steps=2)
    runs = [read(tmp_path / which) for which in ("python", "c")]
    firsts = [analyze_run(run)["first_bad_tensor"] for run in runs]
    assert firsts[0]["op_type"] == "aten.log.default"
    assert firsts[0]["inputs"][0]["op_type"] == "aten._softmax.default"
    for key in ("op_name", "index", "explanation", "path"):
        assert firsts[0][key] == firsts[1][key], key
    # the tensor ids handed out (PyIds there, _record.Ids here) name the same tensors
    executions = [[(e["op_type"], tuple(e["output_tensor_ids"]), e["health"])
                   for e in run.execution_digests()] for run in runs]
    assert executions[0] == executions[1] and len(executions[0]) > 4


class SqrtNoEpsilon(nn.Module):
    def forward(self, x):
        root = torch.sqrt(x)  # finite at 0, but its gradient 1/(2*sqrt(0)) is inf
        return (root * 2.0).sum()


def test_backward_inf_is_first_bad_and_points_at_the_forward_sqrt_line(tmp_path):
    x = torch.tensor([0.0, 1.0, 4.0], requires_grad=True)
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", circular_buffer_size=-1):
        SqrtNoEpsilon()(x).backward()
    assert torch.isinf(x.grad).any()
    run = read(tmp_path)
    summary = analyze_run(run)
    first = summary["first_bad_tensor"]
    assert first["op_name"].startswith("backward/SqrtNoEpsilon/sqrt_0/")
    assert first["graph_name"] == "autograd.backward"
    assert first["health"]["pos_inf"] == 1
    forward = [t for t in traces(run) if t["op_type"] == "aten.sqrt.default"]
    assert forward and not forward[0]["health"]["any_inf_or_nan"]
    _, line = line_of(SqrtNoEpsilon.forward, "torch.sqrt(x)")
    assert first["source"]["line"] == line


class FF(nn.Module):
    def __init__(self):
        super().__init__()
        self.wo = nn.Linear(8, 8)

    def forward(self, x):
        return self.wo(x) * 300.0 * 300.0  # overflows float16 (max 65504)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ff = FF()

    def forward(self, x):
        return x + self.ff(x)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for block in self.block:
            x = block(x)
        return x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()

    def forward(self, x):
        return self.encoder(x)


def test_fp16_overflow_in_nested_module_names_the_module_path(tmp_path):
    torch.manual_seed(0)
    net = Net().half()
    x = torch.ones(4, 8, dtype=torch.float16)
    with torch.no_grad(), tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1):
        out = net(x)
    assert torch.isinf(out).any()
    first = analyze_run(read(tmp_path))["first_bad_tensor"]
    assert first["op_name"].startswith("encoder.block.0.ff/mul_")
    assert first["health"]["dtype"] == "float16"


def test_compiled_model_keeps_the_user_module_paths(tmp_path):
    torch.manual_seed(0)
    net = torch.compile(Net())
    x = torch.ones(4, 8)
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1):
        net(x).sum().backward()
    run = read(tmp_path)
    names = [t["op_name"] for t in traces(run)]
    assert names, "no traces under torch.compile"
    assert not [n for n in names if "_orig_mod" in n]
    assert any(n.startswith("encoder.block.0.ff/") for n in names)
    assert any(n.startswith("backward/encoder.block.0.ff/") for n in names)
    calls = [run.execution(i)["op_type"] for i in range(run.num_executions())]
    assert "Net.forward" in calls


def _small_step(model, x):
    loss = torch.tanh(model(x)).sum()
    loss.backward()


def test_circular_buffer_keeps_exactly_the_last_n_traces(tmp_path):
    def dump(sub, size):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        x = torch.randn(2, 3)
        with tbn.enable_dump_debug_info(str(tmp_path / sub), "FULL_HEALTH", size):
            for _ in range(3):
                _small_step(model, x)
        return traces(read(tmp_path / sub))

    everything = dump("all", -1)
    last = dump("ring", 7)
    assert len(everything) > 7 and len(last) == 7
    strip = lambda t: (t["op_name"], t["output_slot"], t["debug_tensor_value"][1:])
    assert [strip(t) for t in last] == [strip(t) for t in everything[-7:]]


def test_op_regex_traces_only_matching_ops(tmp_path):
    torch_mnist.run(str(tmp_path), "CURT_HEALTH", steps=1, circular_buffer_size=-1)
    all_types = {t["op_type"] for t in traces(read(tmp_path))}
    sub = tmp_path / "filtered"
    regex = r"aten\.(log|_softmax)\.default$"
    with tbn.enable_dump_debug_info(str(sub), "CURT_HEALTH", -1, op_regex=regex):
        torch_mnist.train(1)
    run = read(sub)
    assert {t["op_type"] for t in traces(run)} == {"aten.log.default", "aten._softmax.default"}
    assert len(all_types) > 5
    # the graph still holds every op, so data flow stays whole
    log = [t for t in traces(run) if t["op_type"] == "aten.log.default"][0]
    info = run.op_info(log["graph_id"], log["op_name"])
    assert info["inputs"][0]["op_type"] == "aten._softmax.default"


@pytest.mark.parametrize("dtypes", [[torch.float16], ["float16"], ["torch.float16"]])
def test_tensor_dtypes_filter_accepts_dtypes_and_names(tmp_path, dtypes):
    model = nn.Linear(4, 4)
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1, tensor_dtypes=dtypes):
        with torch.no_grad():
            h = model(torch.ones(2, 4))
            model.half()(h.half())
    found = traces(read(tmp_path))
    assert found and {t["health"]["dtype"] for t in found} == {"float16"}


class InPlace(nn.Module):
    def forward(self, x):
        y = torch.exp(x)
        y.add_(1.0)
        row = y[0]
        row.mul_(2.0)  # written through a view: the base's version moves too
        temps = [torch.neg(x) for _ in range(50)]  # churn ids of dead tensors
        del temps
        return torch.sum(y)


def test_input_names_follow_in_place_writes_and_views(tmp_path):
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1):
        InPlace()(torch.ones(2, 3))
    run = read(tmp_path)
    by_type = {t["op_type"]: t for t in traces(run)}
    total = by_type["aten.sum.default"]
    info = run.op_info(total["graph_id"], total["op_name"])
    assert info["input_names"] == ["InPlace/mul__0:0"]
    add = run.op_info(total["graph_id"], "InPlace/add__0")
    assert add["input_names"][0] == "InPlace/exp_0:0"


def test_enable_twice_returns_the_same_handle_and_disable_twice_is_harmless(tmp_path):
    first = tbn.enable_dump_debug_info(str(tmp_path), "CURT_HEALTH")
    try:
        assert tbn.enable_dump_debug_info(str(tmp_path), "CURT_HEALTH") is first
        with pytest.raises(ValueError):
            tbn.enable_dump_debug_info(str(tmp_path / "other"), "CURT_HEALTH")
        torch.relu(torch.ones(2))
    finally:
        tbn.disable_dump_debug_info()
    tbn.disable_dump_debug_info()
    first.close()
    assert read(tmp_path).num_executions() >= 1


def test_closing_a_handle_lets_a_new_capture_start(tmp_path):
    first = tbn.enable_dump_debug_info(str(tmp_path / "a"), "FULL_HEALTH")
    first.close()
    second = tbn.enable_dump_debug_info(str(tmp_path / "b"), "CURT_HEALTH")
    try:
        assert second is not first and not second.closed
    finally:
        second.close()


def test_bad_arguments_raise_value_error(tmp_path):
    with pytest.raises(ValueError):
        tbn.enable_dump_debug_info(str(tmp_path), "NOT_A_MODE")
    with pytest.raises(ValueError):
        tbn.enable_dump_debug_info(str(tmp_path), "CURT_HEALTH", op_regex="(")
    with pytest.raises(ValueError):
        tbn.enable_dump_debug_info(str(tmp_path), "CURT_HEALTH", tensor_dtypes=["floaty"])


class _Broken:
    """A health batch whose every call fails: stands in for a capture bug."""

    def add(self, tensor, want_moments):
        raise RuntimeError("injected capture failure")

    def fetch(self):
        return []


def test_capture_errors_never_change_the_step_and_leave_a_readable_dump(tmp_path, caplog):
    expected = torch_mnist.train(2, fix=True)
    handle = tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1)
    handle._session.encoder.batch = _Broken()
    try:
        got = torch_mnist.train(2, fix=True)
    finally:
        tbn.disable_dump_debug_info()
    assert got == expected
    assert handle.errors > 0
    assert sum("injected capture failure" in r.getMessage() for r in caplog.records) == 1
    run = read(tmp_path)
    assert run.num_executions() > 0 and not run.warnings


def test_a_hook_that_fails_gives_the_token_back_and_later_steps_are_recorded(tmp_path, caplog):
    """The optimizer pre-hook failing where it asks for the step's call site: counted and
    logged, and the steps after it recorded as usual (the token was given back)."""
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1)
    session = handle._session
    real, failed = session.call_site, []

    def call_site():
        if sys._getframe(1).f_code.co_name == "_optimizer_pre" and not failed:
            failed.append(True)
            raise RuntimeError("injected call-site failure")
        return real()

    session.call_site = call_site
    try:
        for _ in range(3):
            opt.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
    finally:
        tbn.disable_dump_debug_info()
    assert failed and handle.errors == 1
    assert sum("injected call-site failure" in r.getMessage() for r in caplog.records) == 1
    kinds = [d["op_type"] for d in read(tmp_path).execution_digests()]
    assert kinds.count("Sequential.forward") == 3 and kinds.count("SGD.step") == 2


class Aliases(nn.Module):
    def forward(self, x):
        y = torch.exp(x)
        z = torch.ops.aten._unsafe_view(y, [6])  # shares y's storage, no _base
        return torch.sum(z)


def test_alias_ops_are_skipped_and_data_flow_reaches_the_real_producer(tmp_path):
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1):
        Aliases()(torch.ones(2, 3))
    run = read(tmp_path)
    found = traces(run)
    assert [t["op_type"] for t in found] == ["aten.exp.default", "aten.sum.default"]
    info = run.op_info(found[1]["graph_id"], found[1]["op_name"])
    assert info["input_names"] == ["Aliases/exp_0:0"]


def test_tensors_tagged_by_an_earlier_capture_are_outside_inputs_later(tmp_path):
    class Double(nn.Module):
        def forward(self, x):
            return torch.mul(x, 2.0)

    with tbn.enable_dump_debug_info(str(tmp_path / "a"), "FULL_HEALTH", -1):
        y = Double()(torch.ones(2))
    with tbn.enable_dump_debug_info(str(tmp_path / "b"), "FULL_HEALTH", -1):
        Double()(y)
    run = read(tmp_path / "b")
    (trace,) = traces(run)
    assert run.op_info(trace["graph_id"], trace["op_name"])["input_names"] == ["input_0:0"]


class MayRaise(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, fail=False):
        y = self.fc(x)
        if fail:
            raise ValueError("the batch is refused")
        return y.sum()


def test_a_forward_that_raises_ends_its_execution_and_later_calls_record_as_usual(tmp_path):
    import warnings

    torch.manual_seed(0)
    net = MayRaise()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1) as handle:
            with pytest.raises(ValueError):
                net(torch.randn(2, 4), fail=True)
            net(torch.randn(2, 4)).backward()
            torch.exp(torch.ones(3))
    assert handle.errors == 0
    # the capture's post-hook takes torch's exception-path call (module, args, result)
    assert not [w for w in caught if "always_call" in str(w.message)]
    run = read(tmp_path)
    kinds = [run.execution(i)["op_type"] for i in range(run.num_executions())]
    assert kinds == ["aten.randn.default", "MayRaise.forward", "aten.randn.default",
                     "MayRaise.forward", "aten.ones_like.default", "autograd.backward",
                     "aten.ones.default", "aten.exp.default"]
    by_graph = {}
    for t in traces(run):
        by_graph.setdefault(t["graph_id"], []).append(t["op_name"])
    failed, ok, backward = [run.execution(i)["graph_id"] for i in (1, 3, 5)]
    assert by_graph[failed] == ["fc/addmm_0"]  # what ran before the raise, nothing after
    assert by_graph[ok] == ["fc/addmm_0", "MayRaise/sum_0"]
    assert all(name.startswith("backward/") for name in by_graph[backward])
    assert run.execution(1)["output_tensor_ids"] == []


@pytest.mark.parametrize("mode", ["NO_TENSOR", "SHAPE", "FULL_TENSOR", "FULL_NUMERICS"])
def test_eager_ops_become_executions_in_every_mode_without_capture_errors(tmp_path, mode):
    with tbn.enable_dump_debug_info(str(tmp_path), mode, -1) as handle:
        x = torch.ones(2, 3)
        torch.log(torch.neg(x))
    assert handle.errors == 0
    run = read(tmp_path)
    ops = [run.execution(i) for i in range(run.num_executions())]
    assert [e["op_type"] for e in ops] == ["aten.ones.default", "aten.neg.default",
                                           "aten.log.default"]
    assert ops[2]["input_tensor_ids"] == ops[1]["output_tensor_ids"]
    assert ops[2]["output_tensor_device_ids"] == [0]  # the DebuggedDevice id of the CPU


def test_the_capture_freezes_the_collectors_objects_until_disable(tmp_path):
    import gc

    assert gc.get_freeze_count() == 0
    keep = [object() for _ in range(10)]
    with tbn.enable_dump_debug_info(str(tmp_path / "a"), "NO_TENSOR", -1):
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # torch, the test process: everything of before the start
        torch.relu(torch.ones(2))
    assert gc.get_freeze_count() == 0
    # a program that froze objects itself keeps its own setting
    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        with tbn.enable_dump_debug_info(str(tmp_path / "b"), "NO_TENSOR", -1):
            stuff = [[i] for i in range(5000)]  # would be frozen by a second freeze
            assert gc.get_freeze_count() <= mine  # (frozen objects can still be freed)
        assert 0 < gc.get_freeze_count() <= mine
        del stuff
    finally:
        gc.unfreeze()
    del keep


def test_alternating_structures_each_keep_their_graph(tmp_path):
    # GraphRegistry answers a repeat of the last structure of a name by comparing it
    # with that one; any other structure is looked up whole: a root call that switches
    # between two op sequences gets back the graph of each, never a third.
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, deep):
            y = self.lin(x).relu()
            return y.exp() if deep else y.sigmoid()  # as many ops, others

    net, x = Net(), torch.ones(2, 4)
    pattern = [False, True, False, False, True, True]
    with tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR", circular_buffer_size=-1):
        for deep in pattern:
            net(x, deep)
    run = read(tmp_path)
    digests = run.execution_digests()
    ids = [d["graph_id"] for d in digests if d["op_type"] == "Net.forward"]
    assert len(ids) == len(pattern)
    assert [ids.index(g) for g in ids] == [0, 1, 0, 0, 1, 1]
    assert len(run.graph_ids()) == 2


def test_a_later_enable_with_framework_frames_walks_the_same_line_again(tmp_path):
    # The same line recorded by two enables of one dump root, three calls each (a
    # session records an op type's first call in Python, later ones in C): each call
    # of the second takes torch's frames too (the call sites the first walked are
    # not handed out again).
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return torch.relu(self.lin(x))

    net, x = Net(), torch.ones(2, 4)
    for framework in (False, True):
        with tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR", circular_buffer_size=-1,
                                        include_framework_frames=framework):
            for _ in range(3):
                net(x)
    run = read(tmp_path)
    graphs = [d["graph_id"] for d in run.execution_digests() if d["op_type"] == "Net.forward"]
    assert len(graphs) == 6
    frames = [run.stack_frames(run.op_info(g, "Net/relu_0")["stack_frame_ids"]) for g in graphs]
    lines = [[f["code"] for f in site if f["file_path"] == __file__] for site in frames]
    assert all(site == ["net(x)", "return torch.relu(self.lin(x))"] for site in lines)
    module_py = os.path.join("torch", "nn", "modules", "module.py")
    with_torch = [any(f["file_path"].endswith(module_py) for f in site) for site in frames]
    assert with_torch == [False] * 3 + [True] * 3


class _WorkerMade(torch.utils.data.Dataset):
    """Items made by ops in a DataLoader worker: exp and log of a seeded random vector."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        x = torch.randn(8, generator=torch.Generator().manual_seed(i))
        return x.exp().log(), i % 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_dataloader_workers_ops_stay_out_of_the_dump_and_the_training_is_in_it(tmp_path):
    """Forked workers inherit the capture (the dispatch mode, or the hook's dispatch key and
    entry) but not its writer: their ops, not the training's, reach no file, and the
    workers run under it without failing; the training around them is recorded."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(_WorkerMade(), batch_size=8, num_workers=2,
                                         multiprocessing_context="fork")
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH",
                                    circular_buffer_size=-1) as handle:
        batches = 0
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            batches += 1
    assert batches == 4 and handle._session.errors == 0
    run = read(tmp_path)
    executions = [e["op_type"] for e in run.execution_digests()]
    assert executions.count("Sequential.forward") == 4 and executions.count("SGD.step") == 4
    op_types = set(executions) | {t["op_type"] for t in run.graph_execution_trace_digests()}
    assert "aten.addmm.default" in op_types
    assert not op_types & {"aten.randn.default", "aten.exp.default", "aten.log.default"}
