"""The records the native hook (``torch/native.py``, ``_native.cpp``) writes.

The same program captured on both paths writes the same records; and the
tensors the hook names where no Python object carries a tag (an alias's view,
the gradients backward leaves for a step, the outputs autograd saved, an
operator made where a removed one was) are named by the ops that wrote them.
"""

import torch
from torch import nn

from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.demo import torch_mnist
from dumps import read_run
from native_programs import capture


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
            handle = capture(monkeypatch, path, tmp_path / name / path, train)
            assert handle.capture_path == path
            runs[path] = read_run(tmp_path / name / path)
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

    capture(monkeypatch, "native", tmp_path, train)  # FULL_HEALTH: values carry tensor ids
    run = read_run(tmp_path)
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
    capture(monkeypatch, "native", tmp_path, lambda: model(x).backward())
    run = read_run(tmp_path)
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
    capture(monkeypatch, "native", tmp_path, lambda: model(x).backward())
    run = read_run(tmp_path)
    [trace] = [t for t in run.graph_execution_trace_digests()
               if t["op_type"] == "aten._log_softmax.default"]
    [name] = run.op_info(trace["graph_id"], trace["op_name"])["input_names"]
    producer = run.op_info(trace["graph_id"], name.rsplit(":", 1)[0])
    assert producer["op_type"] == "aten.mm.default", name


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

    capture(monkeypatch, "native", tmp_path, train)
    op_types = [e["op_type"] for e in read_run(tmp_path).execution_digests()]
    ours = [op_type for op_type in op_types if op_type.startswith("tbn_")]
    assert ours == ["tbn_first.triple.default", "tbn_second.halve.default"]
