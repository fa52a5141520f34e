"""Compiled regions under the capture: they stay compiled and their graphs carry the health.

Each test compiles a small real program with ``torch.compile`` (inductor, CPU)
under ``enable_dump_debug_info`` and reads the dump back with the project's
reader. The Llama fault inside a compiled model is in test_root_cause_models.py.
"""

import inspect

import pytest
import torch
from torch import nn

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.torch.compiled import custom_ops
from dumps import read_run as read, traces
from torch_programs import SqrtWeight


def executions(run):
    return [run.execution(i) for i in range(run.num_executions())]


def bad_log(x, w):
    return torch.log(x @ w).sum(dim=1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(torch.relu(self.fc(x))).sum()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def test_compiled_function_records_its_ops_with_health_from_inside_the_graph(tmp_path):
    f = torch.compile(bad_log)
    x = torch.tensor([[1.0, 0.0], [-1.0, 2.0]])
    w = torch.eye(2)
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1):
        out = f(x, w)
        graphs = len(custom_ops.State.graphs)
        again = f(x, w)  # the second call runs the same compiled code
        assert len(custom_ops.State.graphs) == graphs
    assert torch.equal(out.isnan(), bad_log(x, w).isnan()) and torch.equal(out, again) is False
    run = read(tmp_path)
    calls = [e for e in executions(run) if e["op_type"] == "compiled.call"]
    assert len(calls) == 2
    found = [t for t in traces(run) if t["graph_id"] == calls[0]["graph_id"]]
    by_type = {t["op_type"]: t for t in found}
    assert set(by_type) == {"matmul", "log", "sum"}  # torch-level ops: it ran compiled
    log = by_type["log"]["health"]
    assert (log["neg_inf"], log["nan"], log["zero"], log["size"]) == (1, 1, 1, 4)
    info = run.op_info(by_type["log"]["graph_id"], by_type["log"]["op_name"])
    assert info["inputs"][0]["op_type"] == "matmul"
    mm = run.op_info(by_type["matmul"]["graph_id"], by_type["matmul"]["op_name"])
    assert mm["input_names"] == ["x:0", "w:0"]
    # inductor's extern kernel for the matmul was not recorded as an op of its own
    assert not any(e["op_type"].startswith("aten.") for e in executions(run))
    # the graph's lines are the function's own
    first = analyze_run(run)["first_bad_tensor"]
    assert first["op_type"] == "log"
    lines, start = inspect.getsourcelines(bad_log)
    assert first["source"]["line"] == start + 1 and "torch.log(x @ w)" in first["source"]["code"]


def test_module_compiled_in_place_trains_compiled_with_module_paths(tmp_path):
    torch.manual_seed(0)
    net = Net()
    net.compile()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    with tbn.enable_dump_debug_info(str(tmp_path), "CONCISE_HEALTH", -1):
        for _ in range(2):
            opt.zero_grad()
            net(x).backward()
            opt.step()
    run = read(tmp_path)
    forwards = [e for e in executions(run) if e["op_type"] == "Net.forward"]
    assert len(forwards) == 2
    names = {t["op_name"] for t in traces(run) if t["graph_id"] == forwards[0]["graph_id"]}
    assert {"fc/linear_0", "Net/relu_0", "norm/layer_norm_0", "Net/sum_0"} <= names, names
    # the compiled backward's kernels are not recorded op by op
    kinds = {t["op_type"] for t in traces(run)}
    assert not any(k.endswith(".out") for k in kinds), kinds
    assert {e["op_type"] for e in executions(run)} >= {"SGD.step"}
    assert all(t["health"]["size"] > 0 for t in traces(run) if t["health"])


@pytest.mark.parametrize("mode", ["NO_TENSOR", "SHAPE"])
def test_modes_without_health_record_forward_and_backward_ops(tmp_path, mode):
    f = torch.compile(bad_log)
    x = torch.ones(2, 2, requires_grad=True)
    with tbn.enable_dump_debug_info(str(tmp_path), mode, -1) as handle:
        f(x, torch.ones(2, 2)).sum().backward()
    assert handle.errors == 0
    found = traces(read(tmp_path))
    assert {"matmul", "log", "sum"} <= {t["op_type"] for t in found}
    assert any(t["op_name"].startswith("backward/") and t["op_type"].startswith("aten.")
               for t in found)
    if mode == "NO_TENSOR":
        assert all(not t["debug_tensor_value"] for t in found)
    else:  # SHAPE: dtype, rank, size and shape of each value
        log = next(t for t in found if t["op_type"] == "log")
        assert log["debug_tensor_value"][1:6] == [1.0, 2.0, 4.0, 2.0, 2.0]


def test_full_tensor_runs_compiled_code_eagerly(tmp_path):
    f = torch.compile(bad_log)
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_TENSOR", -1):
        f(torch.ones(2, 2), torch.ones(2, 2))
    kinds = {e["op_type"] for e in executions(read(tmp_path))}
    assert "aten.log.default" in kinds and "log" not in kinds


class CountingPass:
    """A user's own pre-grad pass: it must keep running, and come back on disable."""

    def __init__(self):
        self.calls = 0

    def __call__(self, graph):
        self.calls += 1

    def uuid(self):
        return None


def test_disable_restores_the_users_pass_and_compiles_again_without_health(tmp_path):
    from torch._inductor import config

    theirs = CountingPass()
    before = config.pre_grad_custom_pass
    config.pre_grad_custom_pass = theirs
    try:
        f = torch.compile(bad_log)
        x = torch.ones(2, 2)
        f(x, x)  # compiled before the capture: dropped when it starts
        assert theirs.calls == 1
        with tbn.enable_dump_debug_info(str(tmp_path), "CURT_HEALTH", -1):
            f(x, x)
            assert theirs.calls == 2 and config.pre_grad_custom_pass[0] is theirs
        assert config.pre_grad_custom_pass is theirs
        graphs = len(custom_ops.State.graphs)
        f(x, x)
        assert theirs.calls == 3 and len(custom_ops.State.graphs) == graphs
    finally:
        config.pre_grad_custom_pass = before
    assert [e["op_type"] for e in executions(read(tmp_path))] == ["compiled.call"]


class Root(nn.Module):
    def forward(self, x):
        return torch.sqrt(x).sum()  # d/dx at 0 is +inf: born in the compiled backward


@pytest.mark.parametrize("mode", ["FULL_HEALTH", "FULL_NUMERICS"])
def test_an_inf_born_in_the_compiled_backward_points_at_the_forward_line(tmp_path, mode):
    model = torch.compile(Root())
    x = torch.tensor([0.0, 1.0, 4.0], requires_grad=True)
    with tbn.enable_dump_debug_info(str(tmp_path), mode, -1):
        model(x).backward()
    assert torch.isinf(x.grad[0])
    run = read(tmp_path)
    back = [t for t in traces(run) if t["op_name"].startswith("backward/")]
    assert back and all(t["op_type"].startswith("aten.") for t in back)
    assert any(t["health"]["pos_inf"] == 1 for t in back)
    first = analyze_run(run)["first_bad_tensor"]
    assert first["op_name"].startswith("backward/Root/"), first["op_name"]
    assert first["health"]["pos_inf"] == 1
    assert "torch.sqrt(x)" in first["source"]["code"]
    if mode == "FULL_NUMERICS":  # extrema and moments come from the same kernel
        row = next(t for t in traces(run) if t["op_type"] == "sqrt")["debug_tensor_value"]
        assert row[-6:-2] == [0.0, 2.0, 1.0, 2.0]  # min, max, abs min nonzero, abs max


class LogNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.log(self.fc(x)).sum()


@pytest.mark.parametrize("in_place", [False, True])
def test_stop_on_nonfinite_raises_at_a_compiled_models_output(tmp_path, in_place):
    torch.manual_seed(0)
    net = LogNet()
    if in_place:
        net.compile()  # no root module hook runs: the compiled call ends its execution
    else:
        net = torch.compile(net)
    with pytest.raises(tbn.NonFiniteError) as caught:
        with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1,
                                        stop_on_nonfinite=True):
            net(torch.randn(3, 4)).backward()
    assert "output of LogNet.forward" in str(caught.value)
    first = caught.value.report["first_bad_tensor"]
    assert first["op_type"] == "log" and first["op_name"] == "LogNet/log_0"


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) * 1e3  # finite, but exp of it is not


def test_an_eager_op_after_a_compiled_call_names_the_compiled_op_as_its_input(tmp_path):
    torch.manual_seed(0)
    net = Scaled()
    net.compile()
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1) as handle:
        logits = net(torch.randn(3, 4))
        torch.exp(logits).sum()
    assert handle.errors == 0
    run = read(tmp_path)
    calls = {e["op_type"]: e for e in executions(run)}
    assert calls["aten.exp.default"]["input_tensor_ids"] == calls["Scaled.forward"][
        "output_tensor_ids"]
    first = analyze_run(run)["first_bad_tensor"]
    assert first["op_type"] == "aten.exp.default"
    (source,) = first["inputs"]
    assert source["name"] == "Scaled/mul_0:0" and source["op_type"] == "mul"
    assert not source["health"]["any_inf_or_nan"] and source["health"]["size"] == 12
    assert "was finite" in first["explanation"]


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        return torch.log(self.b(h) * 0).sum()  # log(0) in the graph after the break


def test_graph_breaks_and_recompiles_keep_names_lines_and_data_flow(tmp_path):
    torch.manual_seed(0)
    net = Broken()
    net.compile()
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1) as handle:
        for batch in (3, 5, 7):  # the second size recompiles (dynamic batch)
            net(torch.randn(batch, 4)).backward()
    assert handle.errors == 0
    run = read(tmp_path)
    forwards = [e for e in executions(run) if e["op_type"] == "Broken.forward"]
    assert len(forwards) == 6  # one execution per compiled graph per call
    for before, after in zip(forwards[::2], forwards[1::2]):
        # the graph after the break reads what the graph before it returned
        assert before["output_tensor_ids"] and (
            after["input_tensor_ids"][0] == before["output_tensor_ids"][0])
    found = traces(run)
    for before, after in zip(forwards[::2], forwards[1::2]):  # (a graph's traces, all calls)
        assert {t["op_name"] for t in found if t["graph_id"] == before["graph_id"]} == {
            "a/linear_0", "Broken/relu_0"}
        assert {t["op_name"] for t in found if t["graph_id"] == after["graph_id"]} == {
            "b/linear_0", "Broken/mul_0", "Broken/log_0", "Broken/sum_0"}
    sizes = [t["health"]["neg_inf"] for t in found if t["op_type"] == "log"]
    assert sizes == [12, 20, 28]  # every element is log(0): -inf, per batch of 4 features
    first = analyze_run(run)["first_bad_tensor"]
    assert first["op_type"] == "log"
    assert first["source"]["code"].strip().startswith("return torch.log(self.b(h) * 0)")


def test_a_compiled_gpt2s_logits_name_lm_head_as_their_producer_in_eager_code(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2,
                                       n_head=4, attn_implementation="eager"))
    model.compile()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1) as handle:
        logits = model(input_ids=ids).logits
        # AOTAutograd hands back another tensor object over the graph's output memory
        torch.log(logits)  # NaN where a logit is negative
    assert handle.errors == 0
    run = read(tmp_path)
    first = analyze_run(run)["first_bad_tensor"]
    assert first["op_type"] == "aten.log.default" and first["health"]["nan"] > 0
    (source,) = first["inputs"]
    assert source["name"] == "lm_head/linear_0:0" and source["op_type"] == "linear"
    assert source["health"]["size"] == 2 * 8 * 64 and not source["health"]["any_inf_or_nan"]


def test_tags_found_by_memory_match_the_layout_and_die_with_the_storage():
    import gc

    from tb_numerics_plugin.torch import tags

    by_memory = tags.StorageTags()
    t = torch.arange(6.0)
    by_memory.remember(t, ("the tag",))
    assert by_memory(t.view(6)) == ("the tag",)  # another object over the same memory
    assert by_memory(t[1:]) is None and by_memory(t.view(2, 3)) is None
    assert by_memory(torch.arange(6.0)) is None
    del t
    gc.collect()
    assert not by_memory._by_storage.table  # the entry went with the memory


def test_torch_compile_called_while_the_capture_is_on_compiles_with_health(tmp_path):
    torch.manual_seed(0)
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1) as handle:
        f = torch.compile(bad_log)  # inductor copies its config, the capture's passes in it
        net = LogNet()
        net.compile()
        f(torch.eye(2), torch.eye(2))  # log(0) off the diagonal
        net(torch.randn(3, 4))
    assert handle.errors == 0
    kinds = {e["op_type"] for e in executions(read(tmp_path))}
    assert {"compiled.call", "LogNet.forward"} <= kinds, kinds
    found = {t["op_name"]: t for t in traces(read(tmp_path))}
    assert found["compiled/log_0"]["health"]["neg_inf"] == 2
    assert found["fc/linear_0"]["op_type"] == "linear"  # compiled: torch-level ops


def _with_compiled_step():
    """SqrtWeight, its SGD optimizer and a compiled function running the optimizer's step."""
    net = SqrtWeight()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    @torch.compile
    def step():
        opt.step()

    return net, opt, step


def test_a_compiled_optimizer_step_is_the_optimizers_step_and_the_grads_sink(tmp_path):
    net, opt, step = _with_compiled_step()
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1) as handle:
        for _ in range(2):
            opt.zero_grad()
            net(torch.ones(3)).backward()
            step()
    assert handle.errors == 0
    run = read(tmp_path)
    steps = [e for e in executions(run) if e["op_type"] == "SGD.step"]
    assert len(steps) == 2
    names = {t["op_name"] for t in traces(run) if t["graph_id"] == steps[0]["graph_id"]}
    assert names and all(name.startswith("SGD.step/") for name in names), names
    # the inf gradient born in backward flows into the compiled step (its producer's id)
    first = analyze_run(run)["first_bad_tensor"]
    assert first["op_name"].startswith("backward/SqrtWeight/sqrt_0/")
    assert first["sink"] == "optimizer step", first["explanation"]


def test_stop_on_nonfinite_raises_after_a_compiled_step_that_read_an_inf_gradient(tmp_path):
    net, opt, step = _with_compiled_step()
    with pytest.raises(tbn.NonFiniteError) as caught:
        with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1,
                                        stop_on_nonfinite=True):
            net(torch.ones(3)).backward()  # the loss is finite, its gradient is not
            step()
    assert "the gradient w read by SGD.step" in str(caught.value)
    assert torch.isinf(net.w.grad[0])


def test_gradients_from_a_compiled_backward_reach_the_eager_optimizer_step(tmp_path):
    net = SqrtWeight()
    net.compile()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1) as handle:
        net(torch.ones(3)).backward()
        opt.step()
    assert handle.errors == 0
    run = read(tmp_path)
    first = analyze_run(run)["first_bad_tensor"]
    # born in the compiled backward, not in the step that read it
    assert first["op_name"] == "backward/SqrtWeight/div_0" and first["health"]["pos_inf"] == 1
    assert first["sink"] == "optimizer step", first["explanation"]
    step = next(e for e in executions(run) if e["op_type"] == "SGD.step")
    tensor_id = run.graph_execution_trace(first["index"])["debug_tensor_value"][0]
    assert tensor_id in step["input_tensor_ids"]  # the step read the gradient by its id
