"""The per-op hot path in C (``_record.c``) against the same path in Python.

Ops inside modules and optimizer steps are recorded in C when ``_record`` is
built (the hooks' entries ``_record.record`` and ``_record.native_entry``);
``TB_NUMERICS_RECORD=python`` records them in ``Session.record`` and
``Session.on_op``. The rest of the torch suite runs on the C path; these tests
run real model code on both and compare every record byte for byte but the
wall times (the C code encodes graph traces and eager executions itself).
"""

import collections
import dataclasses
import gc
import glob
import os
import struct
import sys
import threading
import time
import types

import numpy as np
import pytest
import torch
from torch import nn

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.torch import capture, encoder, recorder, segments, tags
from dumps import read_run as read

pytestmark = pytest.mark.skipif(recorder._c_record is None, reason="_record.c was not built")

transformers = pytest.importorskip("transformers")

# the files whose records must agree (metadata carries a run id, source files are shared)
_COMPARED = ("execution", "graph_execution_traces", "graphs", "stack_frames")


class _Event:
    """One record: its bytes after the wall time (field 1, a double: protobuf writes it
    first), compared byte for byte, and the parsed DebugEvent."""

    def __init__(self, payload):
        assert payload[:1] == b"\x09"  # every event the capture writes carries a wall time
        self.rest = payload[9:]
        self.event = debug_event_pb2.DebugEvent.FromString(payload)

    def __eq__(self, other):
        return self.rest == other.rest

    def __repr__(self):
        return repr(self.event)

    def __getattr__(self, name):
        return getattr(self.event, name)


def _events(path):
    """The records of one TFRecord file."""
    with open(path, "rb") as f:
        data = f.read()
    events, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        events.append(_Event(data[pos + 12:pos + 12 + length]))
        pos += 12 + length + 4
    return events


def _both(tmp_path, mode, program, monkeypatch):
    """The records of ``program()``'s training run on each recorder, run from one line
    (call sites are part of the records)."""
    dumps = {}
    for which in ("c", "python"):
        monkeypatch.setenv(recorder.RECORD_ENV, which)
        root = tmp_path / which
        train = program()
        with tbn.enable_dump_debug_info(str(root), mode, circular_buffer_size=-1) as handle:
            train()
        assert handle._session.errors == 0
        dumps[which] = {}
        for kind in _COMPARED:
            (path,) = glob.glob(os.path.join(str(root), "**", "*." + kind), recursive=True)
            dumps[which][kind] = _events(path)
    return dumps["c"], dumps["python"]


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
    c, py = _both(tmp_path, mode, _gpt2_training, monkeypatch)
    for kind in _COMPARED:
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
    c, py = _both(tmp_path, "FULL_HEALTH", lambda: _gpt2_training(fault=True), monkeypatch)
    for kind in _COMPARED:
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
    c, py = _both(tmp_path, mode, _views_and_inplace, monkeypatch)
    for kind in _COMPARED:
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
    c, py = _both(tmp_path, "FULL_HEALTH", _foreach_adam, monkeypatch)
    by_c = [name for c_record, name in in_python if c_record and "_foreach_" in name]
    assert by_c and len(by_c) == len(set(by_c))  # each foreach op once: its facts unknown yet
    assert sum(not c_record and "_foreach_" in name for c_record, name in in_python) > 3 * 4
    for kind in _COMPARED:
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
    c, py = _both(tmp_path, mode, _many_traced_and_transposed, monkeypatch)
    for kind in _COMPARED:
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
    traces = [e.graph_execution_trace for e in _events(path)]
    assert len(traces) == sum(n for n, _ in calls)
    start = 0
    for n, bad in calls:  # FULL_HEALTH: [id, device, dtype, rank, size, -inf, +inf, ...]
        positive_inf = [np.frombuffer(t.tensor_proto.tensor_content, "<f8")[6]
                        for t in traces[start:start + n]]
        assert positive_inf == [4.0 if i >= bad else 0.0 for i in range(n)], (n, bad)
        start += n


def _counted_and_clashing():
    """A module whose op names count past one digit, with two untagged inputs and a
    parameter whose name one of them took first."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_1 = nn.Parameter(torch.ones(3))

        def forward(self, x, y):
            for _ in range(105):
                x = x + 1.0
            return (x * y * self.input_1).sum()

    net = Net()
    x, y = torch.zeros(3), torch.full((3,), 2.0)

    def train():
        net(x, y).backward()
    return train


def _same_ops(tmp_path, program, monkeypatch):
    """The NO_TENSOR records of ``program`` on each recorder, checked equal: the input
    names of each op, by op name."""
    c, py = _both(tmp_path, "NO_TENSOR", program, monkeypatch)
    for kind in _COMPARED:
        assert c[kind] == py[kind], kind
    return {e.graph_op_creation.op_name: list(e.graph_op_creation.input_names)
            for e in c["graphs"] if e.HasField("graph_op_creation")}


def test_counted_names_and_placeholder_clashes_are_the_same_in_c_and_python(tmp_path,
                                                                          monkeypatch):
    ops = _same_ops(tmp_path, _counted_and_clashing, monkeypatch)
    assert ops["Net/add_0"] == ["input_0:0"]
    assert ops["Net/add_104"] == ["Net/add_103:0"]
    assert ops["Net/mul_0"] == ["Net/add_104:0", "input_1:0"]
    # the parameter "input_1" comes after the untagged y took that name
    assert ops["Net/mul_1"] == ["Net/mul_0:0", "input_1_2:0"]


def _past_the_kept_digits():
    """A module whose op names count past 1024 (the C recorder makes small counters'
    digits once, larger ones each time)."""

    class Net(nn.Module):
        def forward(self, x):
            for _ in range(1030):
                x = x + 1.0
            return x.sum()

    net, x = Net(), torch.zeros(2)

    def train():
        net(x)
    return train


def test_names_past_the_kept_digits_are_the_same_in_c_and_python(tmp_path, monkeypatch):
    ops = _same_ops(tmp_path, _past_the_kept_digits, monkeypatch)
    assert ops["Net/add_1024"] == ["Net/add_1023:0"]
    assert ops["Net/add_1029"] == ["Net/add_1028:0"]


def test_forward_nodes_past_the_limit_are_forgotten_alike(tmp_path, monkeypatch):
    """Both recorders keep the forward nodes of the newest SEQ_MAP_MAX sequence numbers
    (read when a session starts, rounded up to a power of two, ``_record.ForwardOps``;
    older ones until a newer node takes their slot): backward ops of the last forward
    ops are still named after them, earlier ones only "backward", the same in both.
    Under the default limit more are named, those named under the low one alike."""
    monkeypatch.setattr(recorder, "SEQ_MAP_MAX", 40)
    c, py = _both(tmp_path / "limited", "NO_TENSOR", _gpt2_training, monkeypatch)
    for kind in _COMPARED:
        assert c[kind] == py[kind], kind
    named, forgotten = _backward_names(c)
    assert named and forgotten
    assert any("lm_head" in n for n in named)  # the last forward ops are remembered
    monkeypatch.undo()
    all_named, all_forgotten = _backward_names(
        _both(tmp_path / "all", "NO_TENSOR", _gpt2_training, monkeypatch)[0])
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
        times += [e.wall_time for e in _events(path)]
    assert len(times) > 20
    assert all(before <= t <= after for t in times)


def _mlp():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2)), torch.randn(3, 4)


def test_records_kept_until_an_execution_ends_are_out_of_the_cyclic_collector(tmp_path,
                                                                              monkeypatch):
    # records, tags and health tokens hold only numbers, strings and such tuples: the C
    # recorder untracks them, so the collector's young passes do not walk them
    monkeypatch.setenv(recorder.RECORD_ENV, "c")
    tracked = []
    finish = segments.Segment.finish

    def spy(self, rows):
        tracked.append([gc.is_tracked(r) for r in self.ops + self.traces])
        return finish(self, rows)

    monkeypatch.setattr(segments.Segment, "finish", spy)
    net, x = _mlp()
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", circular_buffer_size=-1):
        for step in range(4):
            if step == 3:
                tracked.clear()
            out = net(x)
            out.pow(2).sum().backward()
            assert not gc.is_tracked(out._tbn_tag)
            # a collection untracks the tuples Python made (the call sites' frame ids,
            # a block's first health token), as it does at its first pass over them
            gc.collect()
    runs = [t for t in tracked if t]
    assert len(runs) >= 3  # the forward, its eager ops and the backward pass
    # all but an execution's first health token, which Encoder.payload makes in Python
    # (its torch.Size kept): that call registers the execution's block of rows
    assert all(sum(t) <= 1 for t in runs) and sum(map(len, runs)) > 10 * len(runs), tracked


class _Branching(nn.Module):
    """Linear, Tanh, Linear, with one more op after the Tanh while ``extra`` is set."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.first, self.act, self.last = nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2)
        self.extra = False

    def forward(self, x):
        h = self.act(self.first(x))
        if self.extra:
            h = h * 2.0
        return self.last(h)


def test_an_execution_like_the_last_hands_out_its_records_again(tmp_path, monkeypatch):
    # an op whose record would hold the very objects of the last execution's record at its
    # place gets that record (no tuple made per op; the registry compares addresses); a
    # changed op and those after it get new ones, and the execution another graph id
    monkeypatch.setenv(recorder.RECORD_ENV, "c")
    finished = collections.defaultdict(list)  # execution name -> [(ops, prior ops)]
    finish = segments.Segment.finish

    def spy(self, rows):
        if self.is_graph:
            finished[self.name].append((list(self.ops), self.prior_ops))
        return finish(self, rows)

    monkeypatch.setattr(segments.Segment, "finish", spy)
    net, x = _Branching(), torch.randn(3, 4)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH",
                                    circular_buffer_size=-1) as handle:
        for step in range(6):
            net.extra = step == 3
            optimizer.zero_grad()
            net(x).pow(2).sum().backward()
            optimizer.step()
    assert handle._session.errors == 0

    def reused(ops, prior):
        return [a is b for a, b in zip(ops, prior)]

    assert set(finished) == {"_Branching.forward", "autograd.backward", "SGD.step"}
    for name, runs in finished.items():
        assert len(runs) == 6
        for step in (2, 5):  # like the step before (the first step's first ops were Python's)
            ops, prior = runs[step]
            assert len(ops) == len(prior) > 3 and all(reused(ops, prior)), (name, step)
    forward = finished["_Branching.forward"]
    # step 3: the placeholders, the first Linear's op and the Tanh's, then the new mul
    ops, prior = forward[3]
    names = [op[1] for op in ops]
    at = names.index("_Branching/mul_0")
    assert at > 2 and all(reused(ops, prior)[:at]) and not any(reused(ops, prior)[at:])
    ops, prior = forward[4]  # the step after: no mul, the ops after the Tanh new again
    assert len(ops) == len(prior) - 1 and all(reused(ops, prior)[:at])
    assert not any(reused(ops, prior)[at:])
    (path,) = glob.glob(os.path.join(str(tmp_path), "**", "*.execution"), recursive=True)
    graph_ids = [e.execution.graph_id for e in _events(path)
                 if e.execution.op_type == "_Branching.forward"]
    assert len(graph_ids) == 6 and len(set(graph_ids)) == 2
    assert [g == graph_ids[0] for g in graph_ids] == [True, True, True, False, True, True]


class _Swapping(nn.Module):
    """Two Linears whose outputs one sub takes, in the other order while ``swap`` is set."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(6)
        self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 3)
        self.swap = False

    def forward(self, x):
        p, q = self.a(x), self.b(x)
        return torch.sub(q, p) if self.swap else torch.sub(p, q)


def test_an_op_whose_inputs_swap_gets_its_own_input_names(tmp_path, monkeypatch):
    # the last execution's input-name tuple is handed out again only when it holds the same
    # names: the same op at the same place, its two inputs swapped, names them in its order
    monkeypatch.setenv(recorder.RECORD_ENV, "c")
    subs = []  # per step: (the sub's record, the last execution's record at its place)
    finish = segments.Segment.finish

    def spy(self, rows):
        if self.name == "_Swapping.forward":
            at = [op[0] for op in self.ops].index("aten.sub.Tensor")
            subs.append((self.ops[at], self.prior_ops[at] if self.prior_ops else None))
        return finish(self, rows)

    monkeypatch.setattr(segments.Segment, "finish", spy)
    net, x = _Swapping(), torch.randn(2, 4)
    with tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR",
                                    circular_buffer_size=-1) as handle:
        for step in range(5):
            net.swap = step == 3
            net(x).sum().backward()
    assert handle._session.errors == 0 and len(subs) == 5
    first, second = subs[2][0][2]  # "<module path>/addmm_k:0" of the Linears a and b
    assert first.startswith("a/") and second.startswith("b/")
    assert subs[2][0] is subs[2][1] and subs[2][0][2] is subs[1][0][2]  # a steady step
    swapped, prior = subs[3]
    assert swapped[2] == (second, first) and swapped is not prior
    back, prior = subs[4]
    assert back[2] == (first, second) and back[2] is not prior[2]
    (path,) = glob.glob(os.path.join(str(tmp_path), "**", "*.execution"), recursive=True)
    graph_ids = [e.execution.graph_id for e in _events(path)
                 if e.execution.op_type == "_Swapping.forward"]
    assert [g == graph_ids[0] for g in graph_ids] == [True, True, True, False, True]


class _LongRun(nn.Module):
    """More ops of one name prefix than the C recorder keeps names for (1 << 17)."""

    def forward(self, y):
        for _ in range((1 << 17) + 40):
            y = y + 1
        return y


def test_names_past_the_kept_ones_stay_right(tmp_path, monkeypatch):
    # the C recorder keeps each name and its first output's ("...:0") up to 1 << 17 of
    # them, then starts again: the ops past that point, in this step and the next, still
    # name their input after the op before
    monkeypatch.setenv(recorder.RECORD_ENV, "c")
    runs = []
    finish = segments.Segment.finish

    def spy(self, rows):
        if self.name == "_LongRun.forward":
            runs.append([op[:3] for op in self.ops if op[0] != "Placeholder"])
        return finish(self, rows)

    monkeypatch.setattr(segments.Segment, "finish", spy)
    net, x = _LongRun(), torch.zeros(2)
    with tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR",
                                    circular_buffer_size=10) as handle:
        for _ in range(2):
            net(x)
    assert handle._session.errors == 0 and len(runs) == 2
    for ops in runs:
        assert len(ops) == (1 << 17) + 40
        for k in (1, 2, 1 << 16, (1 << 17) - 1, 1 << 17, (1 << 17) + 1, (1 << 17) + 39):
            assert ops[k][1] == "_LongRun/add_%d" % k
            assert ops[k][2] == ("_LongRun/add_%d:0" % (k - 1),), k


def test_scope_state_takes_a_submodule_call_and_declines_the_rest():
    # the module hooks' common case in C: a submodule's call inside a root call, on the
    # capturing thread, its path known, the token free; anything else is the Python hooks'
    from tb_numerics_plugin.torch import _record, gate
    from tb_numerics_plugin.torch.tags import WeakIdMap

    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    known = WeakIdMap()
    known.set(net[0], "0")
    scopes = _record.ScopeState()
    token = gate.Token()
    scopes.thread, scopes.gate, scopes.stack = threading.get_ident(), token, ["Sequential"]
    scopes.depth = 0
    assert not scopes.enter_sub(net[0])  # outside a root call: the root's own hook
    scopes.depth, scopes.paths = 1, known.table
    assert not scopes.enter_sub(net[1])  # a module the root's paths lack
    token.take()
    assert not scopes.enter_sub(net[0])  # the token held (by the flush thread, say)
    token.give()
    scopes.thread = threading.get_ident() + 1
    assert not scopes.enter_sub(net[0])  # another thread's module
    scopes.thread = threading.get_ident()
    assert scopes.enter_sub(net[0]) and scopes.depth == 2 and scopes.stack == ["Sequential", "0"]
    assert scopes.leave_sub() and scopes.depth == 1 and scopes.stack == ["Sequential"]
    assert not scopes.leave_sub() and scopes.depth == 1  # the root call's end: Python's


def test_a_scope_state_build_without_the_fast_paths_gets_the_declining_twin(monkeypatch):
    from tb_numerics_plugin.torch import state

    class OldScopeState:  # a build from before enter_sub and leave_sub
        pass

    old = types.SimpleNamespace(ScopeState=OldScopeState)
    monkeypatch.setitem(sys.modules, "tb_numerics_plugin.torch._record", old)
    monkeypatch.setattr(tbn, "_record", old)  # what `from ... import _record` finds first
    base = state.c_base("ScopeState")
    assert issubclass(base, OldScopeState)
    assert base().enter_sub(object()) is False and base().leave_sub() is False


def test_a_segments_op_name_counters_read_and_write_as_the_dict_they_replace():
    # _record.Counts counts op names in place for the C recorder; Segment.op_name (the
    # Python recorder's, on the same segment) reads and writes it as a dict of ints
    counts, plain = recorder._c_record.Counts(), {}
    assert counts == plain and len(counts) == 0 and counts.get("a/mul_") is None
    prefixes = ["Net/layer%d/mul_" % (i % 37) for i in range(500)] + ["x" * 300]
    for prefix in prefixes:  # past many growths of the table, with repeats
        for table in (counts, plain):
            table[prefix] = table.get(prefix, 0) + 1
    assert counts == plain and not counts != plain and len(counts) == len(plain) == 38
    assert counts["Net/layer3/mul_"] == plain["Net/layer3/mul_"] == 14
    assert sorted(counts.items()) == sorted(plain.items())
    plain["Net/layer3/mul_"] = 0
    assert counts != plain
    with pytest.raises(KeyError):
        counts["Net/mul_"]
    with pytest.raises(ValueError, match="must be 0 or more, not -1"):
        counts["Net/mul_"] = -1
    with pytest.raises(TypeError, match="a prefix is a str, not int"):
        counts[7] = 1
    assert counts.get(7, 0) == 0 and "Net/mul_" not in dict(counts.items())


def test_a_segment_made_in_c_has_the_fields_the_python_stand_in_makes(tmp_path, monkeypatch):
    # Segment's fields are made by its C base (_record.SegmentState); _SegmentFields, the
    # stand-in where the extension is missing, makes the same from the same session
    monkeypatch.setenv(recorder.RECORD_ENV, "c")
    net, x = _mlp()
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH",
                                    circular_buffer_size=-1) as handle:
        handle.step(3)
        net(x).sum().backward()
        session = handle._session
        name = type(net).__name__ + ".forward"
        before = time.time()
        made = [segments.Segment(session, 41, name, (5, 6)),
                segments._SegmentFields(session, 41, name, (5, 6)),
                segments.Segment(session, 42, None),
                segments._SegmentFields(session, 42, None)]
    assert isinstance(made[0], recorder._c_record.SegmentState)
    last = session.registry.last_ops(name)
    assert len(last) > 3 and made[0].prior_ops is last and made[1].prior_ops is last
    fields = ("session", "serial", "name", "is_graph", "stack_ids", "step", "ops", "traces",
              "eager", "input_ids", "output_ids", "arg_ids", "_counters", "_placeholders",
              "_placeholder_names", "prior_ops")
    for c, py in (made[0:2], made[2:4]):
        assert {f: getattr(c, f) for f in fields} == {f: getattr(py, f) for f in fields}
        assert before <= c.wall_time <= py.wall_time <= time.time()
    assert (made[0].step, made[0].is_graph, made[2].is_graph, made[2].prior_ops) == (3, True,
                                                                                    False, ())


def test_an_execution_whose_finish_raised_is_counted_and_the_next_is_written(tmp_path,
                                                                            monkeypatch):
    # Session.switch (C) calls a Segment class's own finish; when it raises, the error is
    # counted by the hook that switched, no segment is left open, and the next root call
    # opens and writes its execution
    monkeypatch.setenv(recorder.RECORD_ENV, "c")
    calls = []

    class Failing(segments.Segment):
        def finish(self, rows):
            calls.append(self.name)
            if len(calls) == 1:
                raise RuntimeError("finish failed")
            return super().finish(rows)

    net, x = _mlp()
    with tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR",
                                    circular_buffer_size=-1) as handle:
        session = handle._session
        session.segment_class = Failing
        with torch.no_grad():
            for _ in range(2):
                net(x)
                assert session._segment is None
    name = type(net).__name__ + ".forward"
    assert calls == [name, name] and session.errors == 1
    (path,) = glob.glob(os.path.join(str(tmp_path), "**", "*.execution"), recursive=True)
    assert [e.execution.op_type for e in _events(path)] == [name]


def test_switch_takes_its_arguments_by_place_or_keyword_and_names_a_wrong_call(tmp_path,
                                                                               monkeypatch):
    # Session.switch (C) parses its own arguments: the signature of the Python stand-in,
    # segments.SessionSwitch.switch(name, stack_ids=(), open_new=True)
    monkeypatch.setenv(recorder.RECORD_ENV, "c")
    with tbn.enable_dump_debug_info(str(tmp_path), "NO_TENSOR",
                                    circular_buffer_size=-1) as handle:
        session = handle._session
        opened = [session.switch("A.forward", ("f1", "f2")),
                  session.switch(stack_ids=("f3",), name="B.forward"),
                  session.switch("C.forward", open_new=1)]
        assert [(s.name, s.stack_ids) for s in opened] == [
            ("A.forward", ("f1", "f2")), ("B.forward", ("f3",)), ("C.forward", ())]
        for args, kwargs in [((), {}), (("x",), {"name": "y"}), (("x", (), True, 4), {}),
                             (("x",), {"bogus": 1}), ((), {"stack_ids": ()})]:
            with pytest.raises(TypeError, match=r"switch\(name, stack_ids=\(\), open_new=True\)"):
                session.switch(*args, **kwargs)
        assert session._segment is opened[2]  # a wrong call finished nothing
        assert session.switch(None, (), False) is None and session._segment is None
    (path,) = glob.glob(os.path.join(str(tmp_path), "**", "*.execution"), recursive=True)
    executions = [e.execution for e in _events(path)]
    assert [(e.op_type, list(e.code_location.stack_frame_ids)) for e in executions] == [
        ("A.forward", ["f1", "f2"]), ("B.forward", ["f3"]), ("C.forward", [])]


def test_a_second_session_is_recorded_with_its_own_attributes(tmp_path, monkeypatch):
    # the C recorder reads a session's fixed attributes once (its devices among them):
    # the next session must get its own device records and executions, not the first's
    monkeypatch.setenv(recorder.RECORD_ENV, "c")
    net, x = _mlp()
    for name in ("first", "second"):
        root = tmp_path / name
        with tbn.enable_dump_debug_info(str(root), "FULL_HEALTH",
                                        circular_buffer_size=-1) as handle:
            for _ in range(2):
                net(x).pow(2).sum().backward()
        assert handle._session.errors == 0
        (path,) = glob.glob(os.path.join(str(root), "**", "*.graphs"), recursive=True)
        devices = [e for e in _events(path) if e.HasField("debugged_device")]
        cpu = "/job:localhost/replica:0/task:0/device:CPU:0"
        assert [d.debugged_device.device_name for d in devices] == [cpu]
        (path,) = glob.glob(os.path.join(str(root), "**", "*.graph_execution_traces"),
                            recursive=True)
        traces = _events(path)
        assert len(traces) > 10
        assert {t.graph_execution_trace.device_name for t in traces} == {cpu}


def test_a_second_session_traces_the_ops_of_its_own_op_regex(tmp_path, monkeypatch):
    # the C recorder keeps the bound session's op facts by op (traced or not, from the
    # session's op_regex): the next session must not get the first's
    monkeypatch.setenv(recorder.RECORD_ENV, "c")
    net, x = _mlp()
    traced = {}
    for name, op_regex in (("all", None), ("mm", r"aten\.mm\b"), ("again", None)):
        root = tmp_path / name
        with tbn.enable_dump_debug_info(str(root), "NO_TENSOR", circular_buffer_size=-1,
                                        op_regex=op_regex) as handle:
            for _ in range(2):
                net(x).pow(2).sum().backward()
        assert handle._session.errors == 0
        (path,) = glob.glob(os.path.join(str(root), "**", "*.graph_execution_traces"),
                            recursive=True)
        traced[name] = {t.graph_execution_trace.op_name.split("/")[-1].rsplit("_", 1)[0]
                        for t in _events(path)}
    assert traced["mm"] == {"mm"}
    assert traced["all"] == traced["again"] and {"mm", "pow"} < traced["all"]


def test_a_second_session_traces_the_dtypes_of_its_own_filter(tmp_path, monkeypatch):
    # the C recorder keeps which dtypes the encoder's cache said it traces: the next
    # session's filter (a new cache) decides for it
    monkeypatch.setenv(recorder.RECORD_ENV, "c")
    net, x = _mlp()
    counts = []
    for name, dtypes in (("all", None), ("doubles", [torch.float64]), ("again", None)):
        root = tmp_path / name
        with tbn.enable_dump_debug_info(str(root), "FULL_HEALTH", circular_buffer_size=-1,
                                        tensor_dtypes=dtypes) as handle:
            net.zero_grad()  # each backward makes the gradients anew (no accumulating add_)
            net(x).pow(2).sum().backward()
        assert handle._session.errors == 0
        (path,) = glob.glob(os.path.join(str(root), "**", "*.graph_execution_traces"),
                            recursive=True)
        counts.append(len(_events(path)))
    assert counts[0] == counts[2] > 10 and counts[1] == 0, counts


def test_a_bad_recorder_setting_is_named(monkeypatch):
    monkeypatch.setenv(recorder.RECORD_ENV, "rust")
    with pytest.raises(ValueError, match="TB_NUMERICS_RECORD"):
        recorder.choose_recorder()
    monkeypatch.setenv(recorder.RECORD_ENV, "python")
    assert recorder.choose_recorder() is None
    monkeypatch.setenv(recorder.RECORD_ENV, "C")
    assert recorder.choose_recorder() is recorder._c_record


def test_the_c_encoding_reads_rows_in_place_and_names_bad_ones():
    encode = recorder._c_record.encode_traces
    row = [0, 1, 2, 3, 0, 5, -1.0, 9.0, 1.0, 9.0, 20.0, 4.0]  # 1 +inf, 2 NaN, 8 finite
    rows = [np.zeros((1, 12)), np.array([row] * 2) * [[0], [1]]]
    trace = ("Net/mul_0", 0, 7, (1, 1), (1, torch.Size([2, 5]), -1), "/cpu:0", 1.5)

    def run(blocks, payload=(1, 1)):
        item = trace[:3] + (payload,) + trace[4:]
        return encode([item], blocks, "g1", "FULL_HEALTH", b"", {}, {},
                      lambda *key: (b"", b""))

    (event,) = run(rows)
    values = np.frombuffer(debug_event_pb2.DebugEvent.FromString(event)
                           .graph_execution_trace.tensor_proto.tensor_content, "<f8")
    # [id, device, dtype, rank, size, -inf, +inf, nan, neg, zero, pos]
    assert list(values) == [7, -1, 1, 2, 10, 0, 1, 2, 3, 0, 5]
    with pytest.raises(IndexError, match=r"health payload \(1, 2\) is past the fetched rows"):
        run(rows, (1, 2))
    with pytest.raises(TypeError, match=r"health rows block 1 is not float64 \[n, 12\]"):
        run([rows[0], rows[1][:, :6].copy()])
    with pytest.raises(TypeError, match="bytes-like"):  # lists are the Python encoding's
        run([r.tolist() for r in rows])


@pytest.mark.parametrize("step", [None, 0, 7, -3])
def test_a_graph_execution_is_encoded_in_c_as_protobuf_writes_it(step):
    c_encoder, py_encoder = encoder.Encoder("FULL_HEALTH"), encoder.Encoder("FULL_HEALTH")
    c_encoder.c_record = recorder._c_record
    assert py_encoder.c_record is None  # the protobuf build the C one must match
    cases = [
        ("Net.forward", "g0", [3, 4, -1, 2 ** 40], [9], "host-1", ("f1", "f2"), 1.5e9),
        ("Adam.step", "g12", [], [], "", (), 0.0),  # nothing read or returned, no host
        ("Модель.forward", "g3", [-1], [5, 6, 7], "h", ["f" * 300], 2.25),  # non-ASCII, long
        # past the encoder's stack storage: ids, a code location and a message of kilobytes
        ("Net.forward", "g4", list(range(-3, 600)), list(range(300)), "h" * 200,
         ["%x" % i * 40 for i in range(12)], 3.5),
    ]
    for op_type, graph_id, in_ids, out_ids, host, stack_ids, wall in cases:
        args = (op_type, graph_id, in_ids, out_ids, host, stack_ids, wall, step)
        made = c_encoder.graph_execution_event(*args)
        assert made == py_encoder.graph_execution_event(*args)
        ex = debug_event_pb2.DebugEvent.FromString(made).execution
        assert (ex.op_type, ex.graph_id, list(ex.input_tensor_ids), ex.num_outputs) == (
            op_type, graph_id, in_ids, len(out_ids))
        assert ex.step == (step or 0) and ex.tensor_debug_mode == py_encoder.mode_enum
    with pytest.raises(TypeError, match="integer"):
        c_encoder.graph_execution_event("Net.forward", "g0", ["x"], [], "h", (), 1.0, None)


def test_trace_prefixes_are_told_apart_by_slot_and_device_in_the_c_table():
    c_encoder, py_encoder = encoder.Encoder("NO_TENSOR"), encoder.Encoder("NO_TENSOR")
    c_encoder.c_record = recorder._c_record
    # one op name on two devices and two slots, and the same name in another graph
    traces = [("Net/split_0", slot, 10 + i, None, None, device, 1.0 + i)
              for i, (slot, device) in enumerate([(0, "/cpu:0"), (1, "/cpu:0"),
                                                  (0, "/gpu:0"), (1, "/gpu:0"), (0, "")])]
    for graph_id in ("g0", "g1", "g0"):  # the second "g0" answered from the table
        made = c_encoder.trace_events(traces, graph_id, [], b"")
        assert made == py_encoder.trace_events(traces, graph_id, [], b"")
        parsed = [debug_event_pb2.DebugEvent.FromString(e).graph_execution_trace for e in made]
        assert [(t.tfdbg_context_id, t.output_slot, t.device_name) for t in parsed] == [
            (graph_id, 0, "/cpu:0"), (graph_id, 1, "/cpu:0"), (graph_id, 0, "/gpu:0"),
            (graph_id, 1, "/gpu:0"), (graph_id, 0, "")]
    assert set(c_encoder._trace_places) == {"g0", "g1"}


@pytest.mark.parametrize("twins", [("Token", "PyToken"), ("Ids", "PyIds")])
def test_the_shared_state_objects_behave_as_their_python_twins(twins):
    """The recording token and the tensor ids, whose fields the C entries read and move
    without a Python call, answer Python as their twins (used where _record is
    missing) do."""
    from tb_numerics_plugin.torch import gate, tags

    c_type = getattr(recorder._c_record, twins[0])
    py_type = getattr(gate, twins[1], None) or getattr(tags, twins[1])
    assert gate.Token is recorder._c_record.Token and tags.Ids is recorder._c_record.Ids
    if twins[0] == "Token":
        script = ["take", "take", "give", "give", "take", "take", "clear", "give", "clear",
                  "take"]
    else:
        script = ["peek", "take", "take", "peek", "take", "peek"]
    seen = []
    for made in (c_type(), py_type()):
        seen.append([getattr(made, step)() for step in script])
    assert seen[0] == seen[1]
    expected = ([True, False, None, None, True, False, None, None, None, False]
                if twins[0] == "Token" else [0, 0, 1, 2, 2, 3])
    assert seen[0] == expected
    with pytest.raises(TypeError, match=r"\.%s\(\) takes no arguments" % twins[0]):
        c_type(1)



def test_forward_ops_keep_the_newest_sequence_numbers_and_the_first_op_of_each():
    """A session's forward ops by autograd node (``_record.ForwardOps``): the first op
    remembered for a node stays; every node among the newest ``limit`` sequence numbers
    (rounded up to a power of two) is kept while the table grows to that size; past
    it a node gives its slot to the newer one that needs it. Numbers beyond a long long
    (AccumulateGrad's nodes carry 2**64 - 1) have none. Its Python twin (where _record
    is missing) keeps what the dict holds, the newest half once past the limit."""
    ops = recorder._c_record.ForwardOps(3000)  # a table of up to 4096 slots
    for seq in range(5000):
        ops.remember(seq, "op_%d" % seq, (seq,), seq * 10)
    ops.remember(4999, "later", (), 0)  # the node's first op stays
    assert ops.get(4999) == ("op_4999", (4999,), 49990)
    kept = [seq for seq in range(5000) if ops.get(seq) is not None]
    assert kept == list(range(5000 - 4096, 5000))  # the newest 4096 numbers
    assert ops.get(2 ** 64 - 1) is None and ops.get(-1) is None
    ops.remember(2 ** 64 - 1, "accumulate", (), 0)  # no slot for it, nothing replaced
    assert ops.get(4999) is not None
    # sparse numbers: an older node keeps its slot until a newer one takes it
    sparse = recorder._c_record.ForwardOps(1024)
    for seq in range(0, 4096, 3):
        sparse.remember(seq, "op", (), seq)
    assert sparse.get(4095) is not None and sparse.get(3072) is not None
    assert sparse.get(0) is None  # its slot went to 3072
    assert sparse.get(1023) is None  # its slot went to 4095
    assert sparse.get(1026) is not None  # older than the newest 1024, its slot not needed
    ops.clear()
    assert ops.get(4999) is None
    twin = recorder.PyForwardOps(4)
    for seq in range(6):
        twin.remember(seq, "op_%d" % seq, (), seq)
    twin.remember(5, "later", (), 0)
    assert [twin.get(seq) for seq in range(6)] == [None] * 3 + [
        ("op_3", (), 3), ("op_4", (), 4), ("op_5", (), 5)]
    with pytest.raises(ValueError, match="limit must be at least 1"):
        recorder._c_record.ForwardOps(0)


@pytest.mark.parametrize("base, field", [("SessionState", "_segment"), ("ScopeState", "stack"),
                                         ("EncoderState", "dtype_ok")])
def test_the_state_bases_fields_are_seen_by_the_cyclic_collector(base, field):
    """A session dropped with its segment open is a cycle through the session's C field
    (Segment.session): the collector must see the object fields of the C bases to free it."""
    import weakref

    class Owner(getattr(recorder._c_record, base)):
        pass

    owner = Owner()
    setattr(owner, field, types.SimpleNamespace(owner=owner))
    gone = weakref.ref(owner)
    del owner
    gc.collect()
    assert gone() is None


@dataclasses.dataclass
class _CallOutput:  # a dataclass return value (transformers' ModelOutput is one, and a dict)
    logits: object
    loss: object = None


class _OrderedOutput(collections.OrderedDict):
    pass


def test_the_tensors_a_call_read_and_returned_are_found_alike_in_c_and_python():
    """``Segment.set_arguments`` and ``set_outputs`` take their tensor ids from
    ``_record.producer_ids`` with the C recorder, from ``segments.producer_ids``
    without: the same ids, in the same order, through the same containers."""
    a, b, c, untagged = (torch.ones(3, 2) for _ in range(4))
    tags.mark(a, 5, "Net/mm_0", 0, 11)
    tags.mark(b, 5, "Net/relu_0", 0, 12)
    tags.mark(c, 7, "Other/add_0", 0, 13)
    view = b[1]  # untagged itself: its base names the producer
    deep = ((((a,),),),)  # a tensor five containers down is past the walk
    value = ([a, {"k": b, "s": "text", "n": None}], _CallOutput(logits=c, loss=view),
             _OrderedOutput(x=b, y=3), untagged, deep, "text", 2.5)
    c_ids = recorder._c_record.producer_ids
    for serial, expected in ((None, [11, 12, 13, 12, 12]), (5, [11, 12, 12, 12]),
                             (2 ** 70, [])):
        assert c_ids(value, serial) == segments.producer_ids(value, serial) == expected
    assert c_ids(value) == segments.producer_ids(value) == [11, 12, 13, 12, 12]
    assert c_ids(a) == [11] and c_ids(untagged) == [] and c_ids(deep[0][0][0]) == [11]
    with pytest.raises(TypeError, match="producer_ids"):
        c_ids()
