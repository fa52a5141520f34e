"""Training steps (``step``, field 101) through the reader, the report, the CLI and the routes.

The dumps are written with our FileSetWriter on real Execution/GraphExecutionTrace protos
carrying ``step``: the miniature model of tests/dumps.py, one call (an Execution) and two
traces (``Log``, ``mul``) per training step, the first iteration before any step mark.
"""

import json
import os

import numpy as np
import pytest

import dumps
from test_plugin_helpers import get, make_client
from tb_numerics_plugin import cli
from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.writer import FileSetWriter
from dumps import read_run as _read

# One entry per iteration: its step mark (None: written before the first mark).
MARKED = (None, 10, 11, 12, 13, 14)
BAD_STEP = 13


def _execution(wall_time, step, bad):
    ev = debug_event_pb2.DebugEvent(wall_time=wall_time)
    ex = ev.execution
    ex.op_type, ex.graph_id, ex.num_outputs = "__inference_loss_1", dumps.GRAPH_ID, 1
    ex.output_tensor_ids.append(7)
    ex.tensor_debug_mode = dumps.FULL_HEALTH
    proto = ex.tensor_protos.add()
    proto.dtype = 2
    proto.tensor_shape.dim.add().size = 11
    proto.tensor_content = np.asarray(dumps.MUL_BAD if bad else dumps.GOOD, "<f8").tobytes()
    if step is not None:
        ex.step = step
    return ev


def write_step_dump(root, marked=MARKED, bad_step=BAD_STEP, host="steps"):
    """Writes the miniature model with step marks; returns nothing.

    Per iteration ``i``: traces ``Log`` and ``mul`` at wall times ``1000 + i + 0.1/0.2``, then
    the call's Execution at ``1000 + i + 0.5`` (TF stamps a call at its end), each carrying
    ``marked[i]`` as its step; from ``bad_step`` on, Log holds -inf and mul NaN.
    """
    writer = FileSetWriter(root, circular_buffer_size=-1, host_name=host)
    dumps.write_structure(writer)
    for i, step in enumerate(marked):
        bad = step is not None and bad_step is not None and step >= bad_step
        for k, (name, vals) in enumerate((("Log", dumps.LOG_BAD), ("mul", dumps.MUL_BAD))):
            ev = debug_event_pb2.DebugEvent.FromString(
                dumps.trace_payload(name, vals if bad else dumps.GOOD, 1000 + i + 0.1 * (k + 1)))
            if step is not None:
                ev.graph_execution_trace.step = step
            writer.write_serialized("graph_execution_traces", ev.SerializeToString())
        writer.write_event(_execution(1000 + i + 0.5, step, bad))
    writer.close()


@pytest.fixture(scope="module")
def step_dump(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("step_dump"))
    write_step_dump(root)
    return root


@pytest.fixture(scope="module")
def run(step_dump):
    return _read(step_dump)


# -- reader -------------------------------------------------------------------------------------


def test_trace_digests_carry_the_step_of_their_record(run):
    steps = [d["step"] for d in run.graph_execution_trace_digests()]
    assert steps == [s for s in MARKED for _ in range(2)]


def test_execution_digests_carry_the_step_of_their_record(run):
    assert [d["step"] for d in run.execution_digests()] == list(MARKED)


def test_records_before_the_first_mark_have_step_none(run):
    assert run.graph_execution_trace_digests(0, 2)[0]["step"] is None
    assert run.execution(0)["step"] is None


def test_full_trace_and_execution_carry_the_step(run):
    assert run.graph_execution_trace(6)["step"] == 12
    assert run.execution(4)["step"] == 13


def test_steps_lists_the_distinct_marked_steps_sorted(run):
    assert run.steps() == [10, 11, 12, 13, 14]


def test_dump_without_steps_has_no_steps_and_none_everywhere(ours_dump):
    run = _read(ours_dump)
    assert run.steps() == []
    assert {d["step"] for d in run.graph_execution_trace_digests()} == {None}
    assert run.execution(0)["step"] is None
    assert run.first_at_step(0) is None
    assert analyze_run(run)["steps"] == {"count": 0, "first": None, "last": None}


def test_first_at_step_finds_the_first_record_of_that_step(run):
    assert run.first_at_step(12, "graph_execution_trace") == (12, 6)
    assert run.first_at_step(12, "execution") == (12, 3)


def test_first_at_step_moves_on_to_the_next_marked_step(tmp_path):
    write_step_dump(str(tmp_path), marked=(1, 2, 7, 9), bad_step=None)
    run = _read(str(tmp_path))
    assert run.first_at_step(3, "graph_execution_trace") == (7, 4)
    assert run.first_at_step(-100, "execution") == (1, 0)
    assert run.first_at_step(10, "execution") is None


def test_first_at_step_of_a_kind_skips_steps_only_the_other_kind_holds(tmp_path):
    # Executions marked at every step, traces only in the window of steps 5 and 6.
    writer = FileSetWriter(str(tmp_path), circular_buffer_size=-1, host_name="w")
    dumps.write_structure(writer)
    for step in range(8):
        writer.write_event(_execution(100.0 + step, step, False))
        if step in (5, 6):
            ev = debug_event_pb2.DebugEvent.FromString(
                dumps.trace_payload("Log", dumps.GOOD, 100.5 + step))
            ev.graph_execution_trace.step = step
            writer.write_serialized("graph_execution_traces", ev.SerializeToString())
    writer.close()
    run = _read(str(tmp_path))
    assert run.first_at_step(2, "graph_execution_trace") == (5, 0)
    assert run.first_at_step(2, "execution") == (2, 2)
    rows = run.step_index().rows(0, 8)
    assert [(r["step"], r["num_executions"], r["num_graph_execution_traces"]) for r in rows] == [
        (s, 1, 1 if s in (5, 6) else 0) for s in range(8)]
    assert rows[5]["first_graph_execution_trace"] == 0 and rows[4]["first_graph_execution_trace"] is None


def test_negative_and_large_steps_round_trip(tmp_path):
    write_step_dump(str(tmp_path), marked=(-3, 0, 2**40, 2**62), bad_step=None)
    run = _read(str(tmp_path))
    assert run.steps() == [-3, 0, 2**40, 2**62]
    assert [d["step"] for d in run.execution_digests()] == [-3, 0, 2**40, 2**62]
    assert [d["step"] for d in run.graph_execution_trace_digests()][::2] == [-3, 0, 2**40, 2**62]


def test_many_steps_do_not_multiply_the_trace_keys(tmp_path):
    write_step_dump(str(tmp_path), marked=tuple(range(300)), bad_step=None)
    run = _read(str(tmp_path))
    assert len(run.fileset().traces.keys) == 2
    assert run.steps() == list(range(300))
    assert run.dataflow().writer is not None


def _varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_a_step_field_written_first_is_read_and_keys_stay_shared(tmp_path):
    # Protobuf accepts fields in any order: a writer may put the step before the op name.
    writer = FileSetWriter(str(tmp_path), circular_buffer_size=-1, host_name="odd")
    dumps.write_structure(writer)
    for step in range(3):
        ev = debug_event_pb2.DebugEvent.FromString(
            dumps.trace_payload("Log", dumps.GOOD, 10.0 + step))
        body = b"\xa8\x06" + _varint(step) + ev.graph_execution_trace.SerializeToString()
        payload = b"\x09" + ev.SerializeToString()[1:9] + b"\x52" + _varint(len(body)) + body
        assert debug_event_pb2.DebugEvent.FromString(payload).graph_execution_trace.step == step
        writer.write_serialized("graph_execution_traces", payload)
    writer.close()
    run = _read(str(tmp_path))
    digests = run.graph_execution_trace_digests()
    assert [(d["op_name"], d["step"], d["wall_time"]) for d in digests] == [
        ("Log", 0, 10.0), ("Log", 1, 11.0), ("Log", 2, 12.0)]
    assert digests[0]["health"]["size"] == 10
    assert len(run.fileset().traces.keys) == 1
    assert run.warnings == []


def test_search_filters_traces_by_step(run):
    assert run.find_graph_execution_traces(step=11).tolist() == [4, 5]
    assert run.find_graph_execution_traces(step=13, name_contains="mul").tolist() == [9]
    assert run.find_graph_execution_traces(step=99).tolist() == []


def test_tf_dumps_have_no_steps(tf_dumps):
    run = _read(os.path.join(tf_dumps, "FULL_HEALTH"))
    assert run.steps() == []
    assert run.graph_execution_trace_digests(0, 1)[0]["step"] is None
    assert run.execution_digests(0, 1)[0]["step"] is None


# -- report and CLI -----------------------------------------------------------------------------


def test_first_bad_tensor_names_its_step(run):
    fb = analyze_run(run)["first_bad_tensor"]
    assert (fb["op_name"], fb["index"], fb["step"]) == ("Log", 8, BAD_STEP)


def test_first_bad_tensor_of_an_unmarked_dump_has_step_none(ours_dump):
    assert analyze_run(_read(ours_dump))["first_bad_tensor"]["step"] is None


def test_report_summarizes_the_marked_steps(run):
    assert analyze_run(run)["steps"] == {"count": 5, "first": 10, "last": 14}


def test_cli_text_report_says_the_step_of_the_first_bad_tensor(step_dump, capsys):
    code = cli.main(["report", step_dump])
    out = capsys.readouterr().out
    assert code == cli.EXIT_OK
    line = next(x for x in out.splitlines() if "first bad tensor" in x)
    assert line.endswith("at step 13"), line
    assert "5 training steps marked (10 to 14)" in out


def test_cli_text_report_of_an_unmarked_dump_names_no_step(ours_dump, capsys):
    cli.main(["report", ours_dump])
    out = capsys.readouterr().out
    assert "at step" not in out and "training step" not in out


def test_cli_json_report_carries_the_step(step_dump, capsys):
    cli.main(["report", step_dump, "--json"])
    (entry,) = json.loads(capsys.readouterr().out)["runs"]
    assert entry["first_bad_tensor"]["step"] == BAD_STEP


# -- routes -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("step_logdir")
    write_step_dump(str(logdir / "marked"))
    dumps.write_dump(str(logdir / "unmarked"))
    return make_client(str(logdir))


def test_digest_routes_carry_the_step(client):
    _, execs = get(client, "execution/digests", run="marked")
    _, traces = get(client, "graph_execution/digests", run="marked", begin=2, end=4)
    _, data = get(client, "graph_execution/data", run="marked", begin=8, end=9)
    assert [i["step"] for i in execs["items"]] == list(MARKED)
    assert [i["step"] for i in traces["items"]] == [10, 10]
    assert data["items"][0]["step"] == 13


def test_steps_route_pages_the_steps_with_their_first_records(client):
    status, body = get(client, "steps", run="marked", begin=1, end=3)
    assert status == 200
    assert (body["begin"], body["end"], body["total"]) == (1, 3, 5)
    assert body["items"] == [
        {"step": 11, "first_execution": 2, "num_executions": 1,
         "first_graph_execution_trace": 4, "num_graph_execution_traces": 2},
        {"step": 12, "first_execution": 3, "num_executions": 1,
         "first_graph_execution_trace": 6, "num_graph_execution_traces": 2}]


def test_steps_route_of_an_unmarked_run_is_empty(client):
    status, body = get(client, "steps", run="unmarked")
    assert status == 200 and body["total"] == 0 and body["items"] == []


def test_find_step_answers_the_first_records_at_or_after_the_step(client):
    _, body = get(client, "steps/find", run="marked", step=13)
    assert body == {"execution": {"step": 13, "index": 4},
                    "graph_execution_trace": {"step": 13, "index": 8}}
    _, past = get(client, "steps/find", run="marked", step=15)
    assert past == {"execution": None, "graph_execution_trace": None}


def test_search_route_filters_by_step(client):
    _, body = get(client, "graph_execution/search", run="marked", step=12)
    assert [(i["index"], i["step"]) for i in body["items"]] == [(6, 12), (7, 12)]


def test_summary_names_the_steps_per_host_and_the_step_of_the_first_bad_tensor(client):
    _, body = get(client, "summary", run="marked")
    assert body["first_bad_tensor"]["step"] == BAD_STEP
    assert body["steps"] == {"count": 5, "first": 10, "last": 14}
    assert body["steps_by_host"] == {"steps": {"count": 5, "first": 10, "last": 14}}
