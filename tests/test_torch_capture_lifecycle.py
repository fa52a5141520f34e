"""The PyTorch capture's lifecycle around a training program: enabling, closing and
disabling it, bad arguments, errors of its own that must never reach the training step,
a forward that raises, the collector's freeze, and forked DataLoader workers.

Every test runs a real torch program into a temporary dump and reads it back
with ``tb_numerics_plugin.reader`` (what the capture records for a program is
checked in test_torch_capture.py).
"""

import os
import sys

import pytest
import torch
from torch import nn

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.demo import torch_mnist
from dumps import read_run as read, traces


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
