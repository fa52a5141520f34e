"""The C recorder's session entries (``_record.c``): executions switched, sessions bound.

``Session.switch`` (C) opens and finishes executions: it parses its arguments
as its Python stand-in does, and a finish that raised is counted without
leaving a segment open. The C recorder reads a session's attributes, op facts
and dtype filter when it binds it: a second session gets its own. The
``TB_NUMERICS_RECORD`` setting chooses the recorder.
"""

import glob
import os

import pytest
import torch

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.torch import recorder, segments
from record_pairs import events, mlp

pytestmark = pytest.mark.skipif(recorder._c_record is None, reason="_record.c was not built")


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

    net, x = mlp()
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
    assert [e.execution.op_type for e in events(path)] == [name]


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
    executions = [e.execution for e in events(path)]
    assert [(e.op_type, list(e.code_location.stack_frame_ids)) for e in executions] == [
        ("A.forward", ["f1", "f2"]), ("B.forward", ["f3"]), ("C.forward", [])]


def test_a_second_session_is_recorded_with_its_own_attributes(tmp_path, monkeypatch):
    # the C recorder reads a session's fixed attributes once (its devices among them):
    # the next session must get its own device records and executions, not the first's
    monkeypatch.setenv(recorder.RECORD_ENV, "c")
    net, x = mlp()
    for name in ("first", "second"):
        root = tmp_path / name
        with tbn.enable_dump_debug_info(str(root), "FULL_HEALTH",
                                        circular_buffer_size=-1) as handle:
            for _ in range(2):
                net(x).pow(2).sum().backward()
        assert handle._session.errors == 0
        (path,) = glob.glob(os.path.join(str(root), "**", "*.graphs"), recursive=True)
        devices = [e for e in events(path) if e.HasField("debugged_device")]
        cpu = "/job:localhost/replica:0/task:0/device:CPU:0"
        assert [d.debugged_device.device_name for d in devices] == [cpu]
        (path,) = glob.glob(os.path.join(str(root), "**", "*.graph_execution_traces"),
                            recursive=True)
        traces = events(path)
        assert len(traces) > 10
        assert {t.graph_execution_trace.device_name for t in traces} == {cpu}


def test_a_second_session_traces_the_ops_of_its_own_op_regex(tmp_path, monkeypatch):
    # the C recorder keeps the bound session's op facts by op (traced or not, from the
    # session's op_regex): the next session must not get the first's
    monkeypatch.setenv(recorder.RECORD_ENV, "c")
    net, x = mlp()
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
                        for t in events(path)}
    assert traced["mm"] == {"mm"}
    assert traced["all"] == traced["again"] and {"mm", "pow"} < traced["all"]


def test_a_second_session_traces_the_dtypes_of_its_own_filter(tmp_path, monkeypatch):
    # the C recorder keeps which dtypes the encoder's cache said it traces: the next
    # session's filter (a new cache) decides for it
    monkeypatch.setenv(recorder.RECORD_ENV, "c")
    net, x = mlp()
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
        counts.append(len(events(path)))
    assert counts[0] == counts[2] > 10 and counts[1] == 0, counts


def test_a_bad_recorder_setting_is_named(monkeypatch):
    monkeypatch.setenv(recorder.RECORD_ENV, "rust")
    with pytest.raises(ValueError, match="TB_NUMERICS_RECORD"):
        recorder.choose_recorder()
    monkeypatch.setenv(recorder.RECORD_ENV, "python")
    assert recorder.choose_recorder() is None
    monkeypatch.setenv(recorder.RECORD_ENV, "C")
    assert recorder.choose_recorder() is recorder._c_record
