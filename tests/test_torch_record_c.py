"""The per-op hot path in C (``_record.c``) against the same path in Python, on programs.

Ops inside modules and optimizer steps are recorded in C when ``_record`` is
built (the hooks' entries ``_record.record`` and ``_record.native_entry``);
``TB_NUMERICS_RECORD=python`` records them in ``Session.record`` and
``Session.on_op``. The rest of the torch suite runs on the C path; these tests
run real model code on both and compare every record byte for byte but the
wall times (the C code encodes graph traces and eager executions itself).
Op names, the C extension's state objects, session entries and encoding are
tested in the ``test_torch_record_c_*`` modules beside this one.
"""

import glob
import os
import time

import numpy as np
import pytest
import torch
from torch import nn

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.torch import capture, encoder, recorder
from dumps import read_run as read
from record_pairs import COMPARED, both, events

pytestmark = pytest.mark.skipif(recorder._c_record is None, reason="_record.c was not built")

transformers = pytest.importorskip("transformers")


def _gpt2_training(fault=False):
    """Two AdamW steps of a tiny random GPT-2 with a padded batch (an attention mask);
    ``fault``: one weight of layer 1's MLP is +inf."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97,
                                     n_positions=32, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    if fault:
        with torch.no_grad():
            model.transformer.h[1].mlp.c_fc.weight[0, 0] = float("inf")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 97, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0

    def train():
        for _ in range(2):
            loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return train


def _views_and_inplace():
    """Module ops on views, in-place writes through views, a tuple-returning op,
    a keyword tensor argument, and eager ops outside any module, more than one run holds."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 6)

        def forward(self, x):
            y = self.lin(x)
            y[:, :2].mul_(0.5)  # written through a view: the base is re-tagged
            top, index = y.topk(2, dim=1)  # two outputs: recorded in Python
            z = torch.where(y > 0, y, other=torch.zeros_like(y))
            logs = torch.log(z)  # -inf where z is 0
            nothing_finite = logs.new_full((3,), float("inf")) * logs.new_ones(1)
            deep = z.reshape(1, 1, 1, 2, 2, 1, 6).mul(2.0)  # rank 7: SHAPE keeps the last 6 dims
            return ((z.t() @ top.sum(1, keepdim=True).expand(-1, 6)).sum() + index.sum()
                    + logs.clamp(min=-1).sum() + nothing_finite.isinf().sum() + deep.sum())

    torch.manual_seed(1)
    net = Net()
    x = torch.randn(4, 6)

    def train():
        for _ in range(2):
            loss = net(x) * 2.0  # outside any module: eager ops
            (x * 3.0).sum()  # an eager op reading a tensor from outside: input id -1
            score = loss.detach()
            for _ in range(150):  # two steps' worth cross a run of 256 eager ops
                score = score * 0.5 + 1.0
            torch.stack([score, score * 2.0])  # eager inputs in a list, and as a keyword
            torch.clamp(score, min=x.mean())
            loss.backward()
    return train


@pytest.mark.parametrize("mode", ["FULL_HEALTH", "FULL_NUMERICS", "NO_TENSOR"])
def test_gpt2_training_records_are_the_same_in_c_and_python(tmp_path, monkeypatch, mode):
    c, py = both(tmp_path, mode, _gpt2_training, monkeypatch)
    for kind in COMPARED:
        assert len(c[kind]) == len(py[kind]), kind
        assert c[kind] == py[kind], kind
    # the run is real: attention ops inside the library's modules, with their lines
    traces = c["graph_execution_traces"]
    names = {e.graph_execution_trace.op_name for e in traces}
    assert any(n.startswith("transformer.h.0.attn/") for n in names)
    assert any(n.startswith("AdamW.step/") for n in names)
    files = {e.stack_frame_with_id.file_line_col.file_index for e in c["stack_frames"]}
    assert files


def test_a_faulty_gpt2_gives_the_same_records_and_the_same_first_bad_tensor(tmp_path,
                                                                            monkeypatch):
    c, py = both(tmp_path, "FULL_HEALTH", lambda: _gpt2_training(fault=True), monkeypatch)
    for kind in COMPARED:
        assert c[kind] == py[kind], kind
    first = analyze_run(read(tmp_path / "c"))["first_bad_tensor"]
    assert first["op_name"].startswith("transformer.h.1.mlp.c_fc/"), first["op_name"]
    # the model library's line (GPT-2's Conv1D), not the test's model(...) call
    assert first["source"]["file"].endswith("transformers/pytorch_utils.py"), first["source"]
    assert analyze_run(read(tmp_path / "python"))["first_bad_tensor"]["op_name"] == (
        first["op_name"])


@pytest.mark.parametrize("mode", ["FULL_HEALTH", "FULL_NUMERICS", "CURT_HEALTH",
                                  "CONCISE_HEALTH", "SHAPE", "FULL_TENSOR", "NO_TENSOR"])
def test_views_inplace_and_eager_ops_are_the_same_in_c_and_python(tmp_path, monkeypatch, mode):
    c, py = both(tmp_path, mode, _views_and_inplace, monkeypatch)
    for kind in COMPARED:
        assert c[kind] == py[kind], kind
    graphs = [e.graph_op_creation for e in c["graphs"] if e.HasField("graph_op_creation")]
    by_name = {op.op_name: op for op in graphs}
    mul = next(op for name, op in by_name.items() if "/mul__" in name)
    assert mul.input_names[0] == "lin/addmm_0:0"  # written through a view of the Linear output
    assert any("/topk_" in name for name in by_name)
    eager = [e.execution.op_type for e in c["execution"]]
    assert eager.count("aten.add.Tensor") == 300 and eager.count("aten.mul.Tensor") >= 300
    assert any(list(e.execution.input_tensor_ids) == [-1] for e in c["execution"])
    if mode == "FULL_NUMERICS":  # the C encoding's branches: -inf counted, nothing finite
        values = {e.graph_execution_trace.op_name: np.frombuffer(
            e.graph_execution_trace.tensor_proto.tensor_content, "<f8")
            for e in c["graph_execution_traces"]}
        log = next(v for name, v in values.items() if "/log_" in name)
        assert log[5] > 0 and np.isfinite(log[11:13]).all()  # n_neg_inf; finite min, max
        inf = next(v for name, v in values.items() if "/mul_" in name and v[4] == 3 and v[6] == 3)
        assert np.isnan(inf[11]) and inf[13] == 0.0  # no finite element: min NaN, abs_min 0
    if mode == "SHAPE":
        shapes = [np.frombuffer(e.graph_execution_trace.tensor_proto.tensor_content, "<f8")
                  for e in c["graph_execution_traces"]]
        assert any(v[2] == 7 and list(v[4:10]) == [1, 1, 2, 2, 1, 6] for v in shapes)


def _foreach_adam():
    """An MLP trained by Adam's foreach ops: in-place ops returning nothing (their outputs
    are the lists they wrote)."""
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2, foreach=True)
    x = torch.randn(6, 5)

    def train():
        for _ in range(3):
            net(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    return train


def test_foreach_optimizer_ops_are_recorded_in_c_with_the_same_records(tmp_path, monkeypatch):
    # in-place foreach ops return nothing: their outputs are the lists they wrote, which
    # the C recording takes as Python does; at most the first row of each execution's
    # block (which registers it in the batch) is computed through Python
    calls, in_python = [], []
    payload, record_graph_op = encoder.Encoder.payload, capture.record_graph_op

    def counted(self, t, device):
        calls.append(self.c_record is not None)
        return payload(self, t, device)

    def python_op(session, seg, op_type, *rest):  # after on_op took the call site
        in_python.append((session.encoder.c_record is not None, op_type))
        return record_graph_op(session, seg, op_type, *rest)

    monkeypatch.setattr(encoder.Encoder, "payload", counted)
    monkeypatch.setattr(capture, "record_graph_op", python_op)
    c, py = both(tmp_path, "FULL_HEALTH", _foreach_adam, monkeypatch)
    by_c = [name for c_record, name in in_python if c_record and "_foreach_" in name]
    assert by_c and len(by_c) == len(set(by_c))  # each foreach op once: its facts unknown yet
    assert sum(not c_record and "_foreach_" in name for c_record, name in in_python) > 3 * 4
    for kind in COMPARED:
        assert c[kind] == py[kind], kind
    names = [e.graph_execution_trace.op_name for e in c["graph_execution_traces"]]
    foreach = [n for n in names if "/_foreach_" in n]
    assert len(foreach) >= 3 * 6 * 4  # 3 steps, 4 parameters, several foreach ops each
    executions = [e for e in c["execution"] if e.execution.op_type]
    assert 0 < calls.count(True) <= len(executions) < len(foreach)
    assert calls.count(False) >= len(names)  # the Python recorder: every row (eager ones too)


def _many_traced_and_transposed():
    """One module call tracing more tensors than a block of health rows holds (2048),
    some laid out transposed (dense, not contiguous: their rows are computed in
    Python), and +inf from an op past the first block's end."""

    class Net(nn.Module):
        def forward(self, x):
            t = x.t() * 1.0  # Net/mul_0, keeps the transposed strides
            for i in range(2100):
                x = x * (float("inf") if i == 2070 else 1.001)
                if i % 500 == 0:
                    t = t * 2.0
            return x.sum() + t.sum()

    net = Net()
    x = torch.linspace(0.5, 1.0, 12).reshape(3, 4)

    def train():
        net(x)
    return train


@pytest.mark.parametrize("mode", ["FULL_HEALTH", "CURT_HEALTH"])
def test_rows_past_a_block_and_transposed_outputs_are_the_same_in_c_and_python(
        tmp_path, monkeypatch, mode):
    c, py = both(tmp_path, mode, _many_traced_and_transposed, monkeypatch)
    for kind in COMPARED:
        assert c[kind] == py[kind], kind
    traces = [e.graph_execution_trace for e in c["graph_execution_traces"]]
    assert len(traces) > 2100
    values = {t.op_name: np.frombuffer(t.tensor_proto.tensor_content, "<f8") for t in traces}
    # 1 + 2070 of x's and 5 of t's muls before it; every element +inf
    first = analyze_run(read(tmp_path / "c"))["first_bad_tensor"]
    assert first["op_name"] == "Net/mul_2076"
    if mode == "FULL_HEALTH":  # [id, device, dtype, rank, size, -inf, +inf, nan, ...]
        assert list(values["Net/mul_2076"][4:8]) == [12.0, 0.0, 12.0, 0.0]
        assert list(values["Net/mul_2075"][4:8]) == [12.0, 0.0, 0.0, 0.0]
        assert values["Net/mul_2"][10] == 12.0  # t * 2.0 (transposed): 12 positive
    else:
        assert values["Net/mul_2076"][1] == 1.0 and values["Net/mul_2075"][1] == 0.0


def test_rows_filled_again_from_row_0_hold_each_execution_s_own_values(tmp_path):
    """The host rows keep the (block, row) tokens they hand out: after the first call's
    rows ran past a block (2048 rows) into the next, later calls fill block 0 from row 0
    again, and each trace's health is its own op's, not a row of an earlier call."""

    class Net(nn.Module):
        def forward(self, x, n, bad):
            for i in range(n):
                x = x * (float("inf") if i == bad else 1.0)
            return x

    net, x = Net(), torch.ones(4)
    calls = [(2100, 2090), (30, 5), (30, 20), (2100, 3)]
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", circular_buffer_size=-1):
        for n, bad in calls:
            net(x, n, bad)
    (path,) = glob.glob(str(tmp_path / "**" / "*.graph_execution_traces"), recursive=True)
    traces = [e.graph_execution_trace for e in events(path)]
    assert len(traces) == sum(n for n, _ in calls)
    start = 0
    for n, bad in calls:  # FULL_HEALTH: [id, device, dtype, rank, size, -inf, +inf, ...]
        positive_inf = [np.frombuffer(t.tensor_proto.tensor_content, "<f8")[6]
                        for t in traces[start:start + n]]
        assert positive_inf == [4.0 if i >= bad else 0.0 for i in range(n)], (n, bad)
        start += n


def test_forward_nodes_past_the_limit_are_forgotten_alike(tmp_path, monkeypatch):
    """Both recorders keep the forward nodes of the newest SEQ_MAP_MAX sequence numbers
    (read when a session starts, rounded up to a power of two, ``_record.ForwardOps``;
    older ones until a newer node takes their slot): backward ops of the last forward
    ops are still named after them, earlier ones only "backward", the same in both.
    Under the default limit more are named, those named under the low one alike."""
    monkeypatch.setattr(recorder, "SEQ_MAP_MAX", 40)
    c, py = both(tmp_path / "limited", "NO_TENSOR", _gpt2_training, monkeypatch)
    for kind in COMPARED:
        assert c[kind] == py[kind], kind
    named, forgotten = _backward_names(c)
    assert named and forgotten
    assert any("lm_head" in n for n in named)  # the last forward ops are remembered
    monkeypatch.undo()
    all_named, all_forgotten = _backward_names(
        both(tmp_path / "all", "NO_TENSOR", _gpt2_training, monkeypatch)[0])
    # (some backward ops have no recorded forward op: "backward/clone_0")
    assert len(all_named) + len(all_forgotten) == len(named) + len(forgotten)
    assert len(all_named) > len(named) and set(named) <= set(all_named)


def _backward_names(records):
    """The backward ops named after their forward op ("backward/<forward op>/mm_1"), and
    those named "backward/mm_1"."""
    names = [e.graph_execution_trace.op_name for e in records["graph_execution_traces"]]
    backward = [n for n in names if n.startswith("backward/")]
    return ([n for n in backward if n.count("/") > 1],
            [n for n in backward if n.count("/") == 1])


def test_recorded_wall_times_are_the_system_clock(tmp_path, monkeypatch):
    """The C recorder reads the wall clock itself (not through time.time): its traces'
    and eager executions' times lie within the run, as time.time reads it."""
    monkeypatch.setenv(recorder.RECORD_ENV, "c")
    train = _views_and_inplace()
    before = time.time()
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", circular_buffer_size=-1):
        train()
    after = time.time()
    times = []
    for kind in ("graph_execution_traces", "execution"):
        (path,) = glob.glob(os.path.join(str(tmp_path), "**", "*." + kind), recursive=True)
        times += [e.wall_time for e in events(path)]
    assert len(times) > 20
    assert all(before <= t <= after for t in times)
