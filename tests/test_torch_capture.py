"""What the PyTorch capture records for a program, checked through the project's reader
and analysis: its executions and traces, the names of ops and their inputs, the source lines
and stacks they point at, and what the dump options (ring buffer, op and dtype filters) keep.

Every test runs a real torch program into a temporary dump and reads it back
with ``tb_numerics_plugin.reader`` (TensorFlow's own reader is exercised in
test_torch_readers.py; the capture's lifecycle in test_torch_capture_lifecycle.py).
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
from dumps import read_run as read, traces


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
