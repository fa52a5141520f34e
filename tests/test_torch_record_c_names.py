"""Op names and op records made by the C recorder (``_record.c``).

Counted op names (past the digits the C recorder makes once, past the names it
keeps) and placeholder names that clash, compared with the Python recorder's;
the records and input-name tuples an execution like the last hands out again,
new ones where an op changed or its inputs swapped; and the records kept until
an execution ends, which the C recorder keeps out of the cyclic collector.
"""

import collections
import gc
import glob
import os

import pytest
import torch
from torch import nn

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.torch import recorder, segments
from record_pairs import events, mlp, same_ops

pytestmark = pytest.mark.skipif(recorder._c_record is None, reason="_record.c was not built")


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


def test_counted_names_and_placeholder_clashes_are_the_same_in_c_and_python(tmp_path,
                                                                          monkeypatch):
    ops = same_ops(tmp_path, _counted_and_clashing, monkeypatch)
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
    ops = same_ops(tmp_path, _past_the_kept_digits, monkeypatch)
    assert ops["Net/add_1024"] == ["Net/add_1023:0"]
    assert ops["Net/add_1029"] == ["Net/add_1028:0"]


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
    graph_ids = [e.execution.graph_id for e in events(path)
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
    graph_ids = [e.execution.graph_id for e in events(path)
                 if e.execution.op_type == "_Swapping.forward"]
    assert [g == graph_ids[0] for g in graph_ids] == [True, True, True, False, True]


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
    net, x = mlp()
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
