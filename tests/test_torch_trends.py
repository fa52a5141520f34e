"""Numerics over time in the PyTorch capture (``trends=``): real torch training loops written
into a temporary dump, the series file decoded with the format's own decoder and compared with
statistics torch computes directly.
"""

import collections
import glob
import math
import os

import pytest
import torch
from torch import nn
from torch.nn.modules import module as nn_module

from tb_numerics_plugin import records, series
from tb_numerics_plugin import torch as tbn
from dumps import read_run as read
from test_torch_steps import Mlp, steps_of, train

STATS = ("abs_max", "min", "max", "mean", "std", "nonfinite")


def read_series(dump):
    """``(steps, dtypes)``: steps {step: {(kind, stat, module): value}} in file order,
    dtypes {(kind, module): dtype} as last declared; None when there is no series file."""
    paths = glob.glob(os.path.join(str(dump), "*." + series.SUFFIX))
    if not paths:
        return None
    (path,) = paths
    steps, dtypes = collections.OrderedDict(), {}
    for _, payload in records.scan(path).records:
        step, _, values, descriptors = series.decode_event(payload)
        for kind, _, module, dtype in descriptors:
            dtypes[(kind, module)] = dtype
        if values:
            assert step not in steps, "step %d written twice" % step
            steps[step] = {(kind, stat, module): v for kind, stat, _, module, v in values}
    return steps, dtypes


def expected_stats(tensors):
    """The series stats of ``tensors`` taken together, computed with torch directly."""
    x = torch.cat([t.detach().double().reshape(-1) for t in tensors])
    fin = x[torch.isfinite(x)]
    return {"abs_max": fin.abs().max().item(), "min": fin.min().item(),
            "max": fin.max().item(), "mean": fin.mean().item(),
            "std": fin.std(unbiased=False).item(), "nonfinite": float((~torch.isfinite(x)).sum())}


def assert_stats(got, kind, module, tensors):
    for stat, want in expected_stats(tensors).items():
        assert got[(kind, stat, module)] == pytest.approx(want, rel=1e-5, abs=1e-7), (
            kind, module, stat)


class Recorder:
    """Every output and output gradient of each submodule, captured with module hooks of
    the test's own (outside the capture), keyed by the capture's module path."""

    def __init__(self, model, root):
        self.outputs = collections.defaultdict(list)
        self.grads = collections.defaultdict(list)
        for name, sub in model.named_modules():
            sub.register_forward_hook(self._hook(name or root))

    def _hook(self, path):
        def hook(module, args, out):
            self.outputs[path].append(out.detach().clone())
            if out.requires_grad:
                out.register_hook(lambda g: self.grads[path].append(g.clone()))
        return hook

    def clear(self):
        self.outputs.clear()
        self.grads.clear()


# ---- values ---------------------------------------------------------------------------
def test_each_step_holds_every_module_output_with_the_stats_torch_computes(tmp_path):
    torch.manual_seed(0)
    model = Mlp()
    rec = Recorder(model, "Mlp")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = {}
    with tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR", trends=True) as h:
        assert h.trends is True
        for step in range(3):
            h.step()
            rec.clear()
            loss = model(torch.randn(5, 4)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            expected[step] = (dict(rec.outputs), dict(rec.grads))
    got, dtypes = read_series(tmp_path)
    assert list(got) == [0, 1, 2]
    for step, (outputs, grads) in expected.items():
        assert set(outputs) == {"Mlp", "fc1", "fc2"}
        for module, tensors in outputs.items():
            assert_stats(got[step], "output", module, tensors)
        for module, tensors in grads.items():
            assert_stats(got[step], "grad", module, tensors)
    assert {m for (k, _, m) in got[0] if k == "grad"} == {"Mlp", "fc1", "fc2"}
    assert dtypes[("output", "fc1")] == dtypes[("grad", "fc2")] == "float32"
    assert got[0][("output", "headroom_bits", "fc1")] == pytest.approx(
        math.log2(3.4028234663852886e38 / got[0][("output", "abs_max", "fc1")]), rel=1e-6)


def test_a_module_called_twice_in_a_step_gets_one_merged_summary(tmp_path):
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.shared = nn.Linear(4, 4)

        def forward(self, x):
            return self.shared(torch.tanh(self.shared(x)))

    torch.manual_seed(0)
    model = Twice()
    rec = Recorder(model, "Twice")
    with tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR", trends=True) as h:
        h.step()
        model(torch.randn(3, 4) * 10).sum().backward()
    got, _ = read_series(tmp_path)
    assert len(rec.outputs["shared"]) == 2 and len(rec.grads["shared"]) == 2
    assert_stats(got[0], "output", "shared", rec.outputs["shared"])
    assert_stats(got[0], "grad", "shared", rec.grads["shared"])


def test_batches_marked_with_the_same_step_merge_into_one_summary(tmp_path):
    # Gradient accumulation as Lightning marks it: every micro-batch calls step(n) again.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4))
    rec = Recorder(model, "Sequential")
    with tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR", trends=True) as h:
        for step in (0, 1):
            rec.clear()
            for micro in range(3):
                h.step(step)
                model(torch.randn(2, 4) * (micro + 1)).sum().backward()
    got, _ = read_series(tmp_path)
    assert list(got) == [0, 1]
    assert len(rec.outputs["0"]) == 3
    assert_stats(got[1], "output", "0", rec.outputs["0"])
    assert_stats(got[1], "grad", "0", rec.grads["0"])


def test_float16_layers_carry_their_dtype_and_headroom_to_65504(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)).half()
    with torch.no_grad():
        model[0].weight.mul_(300.0)
    with tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR", trends=True) as h:
        h.step()
        out = model(torch.randn(4, 8, dtype=torch.float16))
    got, dtypes = read_series(tmp_path)
    assert dtypes[("output", "0")] == "float16"
    abs_max = got[0][("output", "abs_max", "0")]
    assert abs_max > 100
    assert got[0][("output", "headroom_bits", "0")] == pytest.approx(
        math.log2(65504.0 / abs_max), rel=1e-6)
    assert got[0][("output", "abs_max", "Sequential")] == pytest.approx(
        out.abs().max().item(), rel=1e-6)


def test_nonfinite_elements_are_counted_and_left_out_of_the_other_stats(tmp_path):
    class Sqrt(nn.Module):
        def forward(self, x):
            return torch.sqrt(x)

    x = torch.tensor([-1.0, 4.0, 9.0, float("inf")])
    with tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR", trends=True) as h:
        h.step()
        Sqrt()(x)
    got, _ = read_series(tmp_path)
    assert got[0][("output", "nonfinite", "Sqrt")] == 2  # sqrt(-1) = NaN, sqrt(inf) = inf
    assert got[0][("output", "max", "Sqrt")] == 3 and got[0][("output", "mean", "Sqrt")] == 2.5


def test_transformers_gpt2_modules_are_named_as_the_capture_names_them(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                  attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    with tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR", trends=True) as h:
        for _ in range(2):
            h.step()
            out = model(input_ids=ids, labels=ids)
            optimizer.zero_grad()
            out.loss.backward()
            optimizer.step()
    got, dtypes = read_series(tmp_path)
    assert list(got) == [0, 1]
    modules = {m for (k, s, m) in got[1] if k == "output" and s == "abs_max"}
    assert {"GPT2LMHeadModel", "transformer", "transformer.h.0.mlp.c_fc", "transformer.h.1.attn",
            "lm_head"} <= modules
    # a ModelOutput's first value is the loss
    assert got[1][("output", "abs_max", "GPT2LMHeadModel")] == pytest.approx(
        out.loss.item(), rel=1e-5)
    assert ("grad", "abs_max", "transformer.h.1.mlp") in got[1]
    assert dtypes[("output", "lm_head")] == "float32"


# ---- steps ----------------------------------------------------------------------------
def test_trace_windows_leave_every_step_summarized_and_the_hooks_installed(tmp_path):
    before = len(nn_module._global_forward_hooks)
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", circular_buffer_size=-1,
                                    trace_steps=[999], trends=True) as h:
        train(h, Mlp(), 4)
        assert len(nn_module._global_forward_hooks) == before + 1  # the trends' post hook
    assert len(nn_module._global_forward_hooks) == before
    got, _ = read_series(tmp_path)
    assert list(got) == [0, 1, 2, 3]
    assert set(steps_of(tmp_path)["execution"]) == set()  # nothing traced outside the window


def test_trends_every_n_summarizes_the_steps_divisible_by_n(tmp_path):
    with tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR", trends=2) as h:
        train(h, Mlp(), 5)
    got, _ = read_series(tmp_path)
    assert list(got) == [0, 2, 4]


def test_trends_false_writes_no_series_file(tmp_path):
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH") as h:
        train(h, Mlp(), 2)
    assert h.trends is False
    assert read_series(tmp_path) is None


def test_without_marks_each_optimizer_step_ends_an_implicit_step(tmp_path):
    model = Mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with tbn.enable_dump_debug_info(str(tmp_path), "CURT_HEALTH", circular_buffer_size=-1,
                                    trends=True):
        for _ in range(3):
            loss = model(torch.randn(3, 4)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    got, _ = read_series(tmp_path)
    assert list(got) == [0, 1, 2]
    assert set(steps_of(tmp_path)["execution"]) == {None}  # the tfdbg records carry no step


def test_close_writes_the_last_step_and_a_second_enable_appends_to_the_same_file(tmp_path):
    model = Mlp()
    for cycle in range(2):
        with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", circular_buffer_size=-1,
                                        trends=True) as h:
            train(h, model, 2)
        got, _ = read_series(tmp_path)
        assert list(got) == list(range(2 * cycle + 2))  # the last step without a next mark
    assert len(glob.glob(str(tmp_path / ("*." + series.SUFFIX)))) == 1


def test_the_trends_own_ops_add_no_record_to_the_dump(tmp_path):
    counts = {}
    for trends in (False, True):
        torch.manual_seed(0)
        dump = tmp_path / str(trends)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
        with tbn.enable_dump_debug_info(str(dump), "FULL_HEALTH", circular_buffer_size=-1,
                                        trends=trends) as h:
            # transposed outputs: their health needs a contiguous copy (an aten op)
            train(h, nn.Sequential(model, Transpose()), 2)
            assert h.errors == 0
        counts[trends] = steps_of(dump)
    assert counts[True] == counts[False]
    assert list(read_series(tmp_path / "True")[0]) == [0, 1]
    # the project's reader reads the file set beside the series file as before
    assert read(tmp_path / "True").num_executions() == read(tmp_path / "False").num_executions()


class Transpose(nn.Module):
    def forward(self, x):
        return x.t()[:, ::2]


@pytest.mark.parametrize("bad", [0, -2, 1.5, "yes", None])
def test_bad_trends_raise_a_value_error_naming_the_parameter(tmp_path, bad):
    with pytest.raises(ValueError, match="trends"):
        tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR", trends=bad)
    assert not os.listdir(tmp_path)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_writes_nothing_to_the_series(tmp_path):
    model = Mlp()
    with tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR", trends=True) as h:
        train(h, model, 1)
        pid = os.fork()
        if pid == 0:  # the child trains and closes; none of it may reach the parent's file
            try:
                train(h, model, 3)
                h.close()
            finally:
                os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        train(h, model, 1)
    got, _ = read_series(tmp_path)
    assert list(got) == [0, 1]


@pytest.mark.filterwarnings("ignore:Using `torch.compile:UserWarning")  # torch's global-hook note
def test_a_compiled_model_is_summarized_at_its_root_without_graph_breaks(tmp_path):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    compiled = torch.compile(model, backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR", trace_steps=[99],
                                    trends=True) as h:
        for _ in range(2):
            h.step()
            loss = compiled(torch.randn(3, 4)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        assert h.errors == 0
    assert not counters["graph_break"]
    got, _ = read_series(tmp_path)
    assert list(got) == [0, 1]
    assert {("output", "abs_max", "Sequential"), ("grad", "abs_max", "Sequential")} <= set(got[1])
