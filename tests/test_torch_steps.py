"""Training steps in the PyTorch capture: step marks, trace windows, repeated enables, and
``stop_on_nonfinite``; each on a real torch training loop written into a temporary dump.

Steps are read from the raw records (extension field 101), so these tests do not
depend on how the reader presents them.
"""

import collections
import glob
import json
import os
import time

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from tb_numerics_plugin import records
from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.torch import native, stop
from tb_numerics_plugin.proto import debug_event_pb2
from dumps import read_run as read
from torch_programs import SqrtWeight


def raw_events(dump, suffix):
    """Every DebugEvent of the files ``*.<suffix>`` of ``dump``."""
    out = []
    for path in sorted(glob.glob(os.path.join(str(dump), "*." + suffix))):
        out += [debug_event_pb2.DebugEvent.FromString(p) for _, p in records.scan(path).records]
    return out


def steps_of(dump):
    """{"execution": Counter(step), "trace": Counter(step)}; None counts unmarked records."""
    def step(msg):
        return msg.step if msg.HasField("step") else None

    return {
        "execution": collections.Counter(step(e.execution) for e in raw_events(dump, "execution")),
        "trace": collections.Counter(step(e.graph_execution_trace)
                                     for e in raw_events(dump, "graph_execution_traces")),
    }


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 1)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def train(handle, model, steps, start=None, batch=None):
    """SGD on squared outputs; marks each step on ``handle``."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(steps):
        handle.step(None if start is None else start + i)
        x = torch.randn(3, 4) if batch is None else batch(i)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


# ---- steps ---------------------------------------------------------------------
def test_every_record_after_a_mark_carries_its_step_and_none_before(tmp_path):
    torch.manual_seed(0)
    model = Mlp()
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", circular_buffer_size=-1) as h:
        assert h.current_step is None
        model(torch.randn(2, 4)).sum()  # before any mark
        train(h, model, 3)
        assert h.current_step == 2
    got = steps_of(tmp_path)
    assert set(got["execution"]) == {None, 0, 1, 2}
    assert set(got["trace"]) == {None, 0, 1, 2}
    # each step: forward, the eager loss ops, backward, zero_grad's ops, the optimizer step
    assert got["execution"][0] == got["execution"][1] == got["execution"][2] >= 3
    assert got["trace"][0] == got["trace"][1] == got["trace"][2] > 0


def test_explicit_step_numbers_are_recorded_as_given(tmp_path):
    model = Mlp()
    with tbn.enable_dump_debug_info(str(tmp_path), "CURT_HEALTH", circular_buffer_size=-1) as h:
        train(h, model, 2, start=100)
        assert h.current_step == 101
    assert set(steps_of(tmp_path)["execution"]) == {100, 101}


@pytest.mark.parametrize("step", [0, 1, 300, 2 ** 40])
def test_hand_encoded_step_field_matches_protobuf_byte_for_byte(step):
    from tb_numerics_plugin.torch import health, wire

    values = [3.0, -1.0, 1.0, 2.0, 12.0, 2.0, 1.0, 1.0, 2.0, 2.0, 4.0]
    expected = debug_event_pb2.DebugEvent(wall_time=7.5)
    trace = expected.graph_execution_trace
    trace.tfdbg_context_id, trace.op_name, trace.device_name = "g1", "fc/mul_0", "d"
    trace.tensor_debug_mode = 4
    trace.tensor_proto.CopyFrom(health.values_proto(values))
    trace.step = step
    prefix = wire.trace_prefix("g1", "fc/mul_0", 0, 4, "d")
    encoded = wire.trace_event(7.5, prefix, wire.values_tensor_proto(values), wire.step_field(step))
    assert encoded == expected.SerializeToString()
    assert wire.step_field(None) == b""


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_step_rejects_anything_but_a_non_negative_int(tmp_path, bad):
    with tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR") as h:
        with pytest.raises(ValueError, match="step"):
            h.step(bad)


def test_tensorflow_reader_reads_a_dump_with_steps(tmp_path):
    debug_events_reader = pytest.importorskip("tensorflow.python.debug.lib.debug_events_reader")
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", circular_buffer_size=-1) as h:
        train(h, Mlp(), 2)
    assert set(steps_of(tmp_path)["trace"]) == {0, 1}
    with debug_events_reader.DebugDataReader(str(tmp_path)) as reader:
        reader.update()
        op_types = [e.op_type for e in reader.executions()]
        assert op_types.count("Mlp.forward") == 2 and op_types.count("SGD.step") == 2
        traces = reader.graph_execution_traces()
        assert len(traces) == sum(steps_of(tmp_path)["trace"].values())
        assert len(reader.graph_execution_trace_to_tensor_value(traces[0])) == 11


# ---- windows ---------------------------------------------------------------------
def test_trace_steps_2_and_5_keep_both_windows_in_one_run_and_one_host(tmp_path):
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", circular_buffer_size=-1,
                                    trace_steps=[2, 5]) as h:
        train(h, Mlp(), 7)
    got = steps_of(tmp_path)
    assert set(got["execution"]) == {2, 5} and set(got["trace"]) == {2, 5}
    assert got["execution"][2] == got["execution"][5]
    run = read(tmp_path)
    assert len(run.hosts) == 1
    assert run.num_executions() == sum(got["execution"].values())


@pytest.mark.parametrize("spec, traced", [
    ("2,5,10-12", {2, 5, 10, 11, 12}),
    ("every:4", {0, 4, 8, 12}),
    ([1, range(6, 8)], {1, 6, 7}),
    (range(3, 14, 5), {3, 8, 13}),
    (9, {9}),
])
def test_trace_steps_forms_select_those_steps(tmp_path, spec, traced):
    with tbn.enable_dump_debug_info(str(tmp_path), "CURT_HEALTH", circular_buffer_size=-1,
                                    trace_steps=spec) as h:
        train(h, Mlp(), 14)
    assert set(steps_of(tmp_path)["execution"]) == traced


@pytest.mark.parametrize("bad", ["2,x", "every:0", "5-2", [-1], [], [2.5], object(), range(0)])
def test_bad_trace_steps_raise_a_value_error_naming_the_parameter(tmp_path, bad):
    with pytest.raises(ValueError, match="trace_steps"):
        tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR", trace_steps=bad)
    assert not os.listdir(tmp_path)  # nothing was started


def test_outside_a_window_the_dispatch_mode_and_module_hooks_are_gone(tmp_path):
    from torch.nn.modules import module as nn_module

    hooks_before = len(nn_module._global_forward_hooks)
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", trace_steps=[1]) as h:
        h.step()
        assert not _hooked()
        assert len(nn_module._global_forward_hooks) == hooks_before
        h.step()
        assert _hooked()
        assert len(nn_module._global_forward_hooks) == hooks_before + 1
        h.step()
        assert not _hooked()
    assert not _hooked()


def _hooked():
    """Whether the capture sees ops: its dispatch mode, or its native hook."""
    return _get_current_dispatch_mode() is not None or native.installed()


def test_two_enable_disable_cycles_in_one_second_append_to_one_file_set(tmp_path):
    model = Mlp()
    start = time.time()
    for cycle in range(2):
        with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH",
                                        circular_buffer_size=-1) as h:
            train(h, model, 2, start=2 * cycle)
    assert int(time.time()) - int(start) <= 1  # the case that used to make a second set
    assert set(steps_of(tmp_path)["execution"]) == {0, 1, 2, 3}
    assert len(glob.glob(str(tmp_path / "*.metadata"))) == 1
    run = read(tmp_path)
    assert len(run.hosts) == 1
    assert [e["op_type"] for e in run.execution_digests()].count("Mlp.forward") == 4
    # the second cycle reused the graphs of the first instead of writing new ids over them
    assert run.num_graph_execution_traces() == sum(steps_of(tmp_path)["trace"].values())
    (status_path,) = glob.glob(str(tmp_path / "*.writer_status.json"))
    with open(status_path) as f:
        status = json.load(f)
    assert status["state"] == "closed"
    assert status["written"]["execution"] == run.num_executions()


def test_a_different_mode_in_the_same_dump_root_gets_its_own_file_set(tmp_path):
    for mode in ("CURT_HEALTH", "FULL_HEALTH"):
        with tbn.enable_dump_debug_info(str(tmp_path), mode, circular_buffer_size=-1) as h:
            train(h, Mlp(), 1)
    assert len(glob.glob(str(tmp_path / "*.metadata"))) == 2


# ---- stop_on_nonfinite ---------------------------------------------------------------
class SqrtNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.sqrt(x).sum(1) + self.fc(x).sum(1)


def positive_batch_but_at(k):
    def batch(i):
        x = torch.rand(3, 4) + 0.1
        if i == k:
            x[0, 0] = -1.0  # sqrt -> NaN at step k
        return x
    return batch


def test_stop_on_nonfinite_raises_at_the_nan_step_naming_the_first_bad_op(tmp_path, capfd):
    torch.manual_seed(0)
    model = SqrtNet()
    with pytest.raises(tbn.NonFiniteError) as info:
        with tbn.enable_dump_debug_info(str(tmp_path), "FULL_NUMERICS", circular_buffer_size=-1,
                                        stop_on_nonfinite=True) as h:
            train(h, model, 6, batch=positive_batch_but_at(3))
    err = info.value
    assert isinstance(err, RuntimeError) and err.step == 3
    assert "aten.sqrt.default" in str(err)
    first = err.report["first_bad_tensor"]
    assert first["op_type"] == "aten.sqrt.default" and first["module"] == "SqrtNet"
    assert "torch.sqrt(x)" in first["source"]["code"]
    assert max(steps_of(tmp_path)["execution"]) == 3  # nothing ran after the NaN step
    printed = capfd.readouterr().err
    assert "First bad tensor: aten.sqrt.default" in printed and "torch.sqrt(x)" in printed
    assert "abs max" in printed and "fc/addmm_0" in printed  # the frames before it


def test_a_nan_loss_outside_the_model_stops_before_the_optimizer_step(tmp_path):
    torch.manual_seed(0)
    model = Mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(tbn.NonFiniteError) as info:
        with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", circular_buffer_size=-1,
                                        stop_on_nonfinite=True) as h:
            for i in range(4):
                h.step()
                out = model(torch.randn(3, 4))
                loss = torch.log(out.abs().mean() - (10.0 if i == 2 else 0.0))  # NaN at step 2
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    assert info.value.step == 2
    assert info.value.report["first_bad_tensor"]["op_type"] == "aten.log.default"
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the step never ran


def test_an_inf_gradient_with_a_finite_loss_stops_before_the_optimizer_step_reads_it(tmp_path):
    model = SqrtWeight()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(tbn.NonFiniteError) as info:
        with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", circular_buffer_size=-1,
                                        stop_on_nonfinite=True) as h:
            for _ in range(3):
                h.step()
                optimizer.zero_grad()
                model(torch.ones(3)).backward()
                optimizer.step()
    err = info.value
    assert err.step == 0 and "the gradient w read by SGD.step" in str(err)
    first = err.report["first_bad_tensor"]
    assert first["op_name"].startswith("backward/SqrtWeight/sqrt_0/"), first["op_name"]
    assert first["sink"] == "optimizer step", first["explanation"]
    assert torch.equal(model.w.detach(), torch.tensor([0.0, 1.0, 4.0]))  # the step never ran
    assert max(steps_of(tmp_path)["execution"]) == 0


def test_a_trigger_decided_masked_leaves_the_step_and_the_forward_their_executions(
        tmp_path, monkeypatch):
    # The lineage rule decides "masked" here, whatever the dump says: what is checked is
    # what the capture does after going on (the decision closes the open execution).
    monkeypatch.setattr(stop.NonFiniteWatch, "_analyze_dump", lambda self: (None, False))
    model = SqrtWeight()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", circular_buffer_size=-1,
                                    stop_on_nonfinite=True) as h:
        for _ in range(2):
            h.step()
            optimizer.zero_grad()
            model(torch.ones(3)).backward()  # an inf gradient: the step's pre-hook fires
            optimizer.step()
    assert h.errors == 0 and not torch.isfinite(model.w.detach()[0])  # both steps ran
    run = read(tmp_path)
    kinds = [e["op_type"] for e in run.execution_digests()]
    assert kinds.count("SqrtWeight.forward") == 2 and kinds.count("SGD.step") >= 2, kinds
    eager = {k for k in kinds if k.startswith("aten.")}  # no op fell out of its call:
    assert eager == {"aten.ones.default", "aten.ones_like.default"}, kinds  # the loop's own
    step_ops = {t["op_name"] for t in run.graph_execution_trace_digests()
                if t["graph_name"] == "SGD.step"}
    assert any(name.startswith("SGD.step/add_") for name in step_ops), step_ops


def test_a_causal_transformer_with_a_masked_minus_inf_trains_on(tmp_path):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    optimizer = torch.optim.Adam(encoder.parameters(), 1e-3)
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", circular_buffer_size=-1,
                                    stop_on_nonfinite=True) as h:
        for _ in range(3):
            h.step()
            mask = nn.Transformer.generate_square_subsequent_mask(8)
            loss = encoder(torch.randn(2, 8, 16), mask=mask, is_causal=True).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert h.current_step == 2
    summary = analyze_run(read(tmp_path))
    assert summary["alerts"]["MaskedNonFinite"] > 0  # the -inf was there, and masked
    assert summary["first_bad_tensor"] is None


def test_stop_on_nonfinite_needs_a_mode_that_records_inf_and_nan(tmp_path):
    for mode in ("NO_TENSOR", "SHAPE"):
        with pytest.raises(ValueError, match="stop_on_nonfinite"):
            tbn.enable_dump_debug_info(str(tmp_path), mode, stop_on_nonfinite=True)
    with pytest.raises(ValueError, match="stop_on_nonfinite"):
        tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", stop_on_nonfinite="yes")
