"""Hostile records served through every route: no 500, and the healthy run beside them unharmed.

Each hostile run is a real file set written with ``FileSetWriter``: the
miniature model of ``dumps.py`` (graph ``loss``: ``x -> Log -> mul``), a good
trace, the hostile record(s), another good trace. One healthy run shares the
logdir. Every route of the plugin's route table is asked about every run
through TensorBoard's WSGI app; an answer is either a 200 or our JSON error
shape with a 4xx code, never a 500 and never non-JSON.
"""

import argparse
import collections
import logging
import threading
import time

import numpy as np
import pytest
from tensorboard.backend import application
from tensorboard.plugins import base_plugin
from werkzeug import test as werkzeug_test

from dumps import GOOD, write_dump, write_structure, trace_payload
from tb_numerics_plugin.plugin import NumericsPlugin
from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.writer import FileSetWriter
from test_plugin_helpers import PREFIX, make_client, strict_json

HEALTHY = "healthy"
FULL_HEALTH, FULL_TENSOR = 4, 7


def _counts_with(slot, value):
    values = list(GOOD)
    values[slot] = value
    return values


def _execution(num_outputs=1, mode=FULL_HEALTH, values=GOOD, wall_time=50.0):
    ev = debug_event_pb2.DebugEvent(wall_time=wall_time)
    ex = ev.execution
    ex.op_type, ex.num_outputs, ex.tensor_debug_mode = "__inference_loss_1", num_outputs, mode
    ex.output_tensor_ids.append(7)
    proto = ex.tensor_protos.add()
    proto.dtype = 2
    proto.tensor_shape.dim.add().size = len(values)
    proto.tensor_content = np.asarray(values, "<f8").tobytes()
    return ev.SerializeToString()


def _full_tensor(dtype=1, dims=(1 << 40,) * 4, content=b"\0" * 16):
    """A FULL_TENSOR trace of ``Log``; by default a shape of 2**160 elements holding 16 bytes."""
    ev = debug_event_pb2.DebugEvent(wall_time=20.0)
    t = ev.graph_execution_trace
    t.tfdbg_context_id, t.op_name, t.tensor_debug_mode = "g-loss", "Log", FULL_TENSOR
    t.tensor_proto.dtype = dtype
    for size in dims:
        t.tensor_proto.tensor_shape.dim.add().size = size
    t.tensor_proto.tensor_content = content
    return ev.SerializeToString()


def _weird_op():
    """A second ``Log`` op in graph ``loss`` with malformed input names and 2**31-1 outputs."""
    ev = debug_event_pb2.DebugEvent()
    c = ev.graph_op_creation
    c.op_type, c.op_name, c.graph_id, c.graph_name = "Weird", "Log", "g-loss", "loss"
    c.num_outputs = 2**31 - 1
    c.input_names.extend(["::", "x:99999999999", ":0"])
    return ev.SerializeToString()


def _unknown_op():
    return trace_payload("no_such_op", GOOD, 20.0, graph_id="no-such-graph")


# name -> [(file suffix, serialized DebugEvent)], written between two good traces.
HOSTILE = {
    "trace_mode_minus_1": [("graph_execution_traces", trace_payload("Log", GOOD, 20.0, mode=-1))],
    "trace_mode_9": [("graph_execution_traces", trace_payload("Log", GOOD, 20.0, mode=9))],
    "nan_in_health_counts": [
        ("graph_execution_traces", trace_payload("Log", _counts_with(5, float("nan")), 20.0))],
    "inf_in_health_counts": [
        ("graph_execution_traces", trace_payload("mul", _counts_with(7, float("inf")), 20.0))],
    "negative_health_counts": [
        ("graph_execution_traces", trace_payload("Log", _counts_with(4, -5.0), 20.0))],
    "short_health_vector": [("graph_execution_traces", trace_payload("Log", [0, -1, 1], 20.0))],
    "huge_full_tensor_shape": [("graph_execution_traces", _full_tensor())],
    "full_tensor_unknown_dtype": [("graph_execution_traces", _full_tensor(999, [2], b"\0" * 8))],
    "full_tensor_short_content": [("graph_execution_traces", _full_tensor(1, [3], b"\0" * 7))],
    "full_tensor_negative_dim": [("graph_execution_traces", _full_tensor(1, [-2], b"\0" * 8))],
    "malformed_op_creation": [("graphs", _weird_op())],
    "trace_of_unknown_graph": [("graph_execution_traces", _unknown_op())],
    "execution_huge_num_outputs": [("execution", _execution(num_outputs=2**31 - 1))],
    "execution_mode_minus_1": [("execution", _execution(mode=-1))],
    "execution_nan_counts": [("execution", _execution(values=_counts_with(7, float("nan"))))],
    "undecodable_payload": [("graph_execution_traces", b"\xff\xfe not a protobuf \x00" * 3)],
}


def _write_hostile(root, name, records):
    writer = FileSetWriter(str(root / name), circular_buffer_size=-1, host_name="h")
    write_structure(writer)
    writer.write_serialized("graph_execution_traces", trace_payload("Log", GOOD, 10.0))
    writer.write_serialized("execution", _execution(wall_time=11.0))
    for suffix, payload in records:
        writer.write_serialized(suffix, payload)
    writer.write_serialized("graph_execution_traces", trace_payload("mul", GOOD, 30.0))
    writer.write_serialized("execution", _execution(wall_time=31.0))
    writer.close()


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile_logdir")
    write_dump(str(root / HEALTHY), host="h")
    for name, records in HOSTILE.items():
        _write_hostile(root, name, records)
    return make_client(str(root))


def _routes():
    """Every JSON route of the plugin's route table (static files are not about runs)."""
    plugin = NumericsPlugin(base_plugin.TBContext(logdir=""))
    return sorted(r.lstrip("/") for r in plugin.get_plugin_apps() if not r.startswith("/static"))


ROUTES = _routes()
# Parameters that make every route reach the data (names of the miniature model).
PARAMS = {
    "alerts/next": {"index": -1},
    "graphs/graph_info": {"graph_id": "g-loss"},
    "graphs/op_info": {"graph_id": "g-loss", "op_name": "Log"},
    "source_files/file": {"index": 0},
    "stack_frames/stack_frames": {"stack_frame_ids": "f-user-log"},
    "steps/find": {"step": 0},
}


def _ask(client, route, run):
    params = dict(PARAMS.get(route, {}))
    if route != "runs":
        params["run"] = run
    response = client.get(PREFIX + route, query_string=params)
    body = strict_json(response.get_data(as_text=True))  # JSON whatever the status
    return response.status_code, body


def test_the_route_table_is_what_the_fuzz_covers():
    assert len(ROUTES) == 17 and "trends" in ROUTES and "runs" in ROUTES and "summary" in ROUTES


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_no_route_answers_500_for_a_hostile_run(client, case, caplog):
    answers = {}
    with caplog.at_level(logging.CRITICAL):
        for route in ROUTES:
            answers[route] = _ask(client, route, case)
    failed = {r: b for r, (status, b) in answers.items() if status >= 500}
    assert not failed, failed
    for route, (status, body) in answers.items():
        if status != 200:
            assert 400 <= status < 500 and body["error"]["code"] == status, (route, body)
            assert case in body["error"]["message"] or status == 404, (route, body)


def test_runs_lists_every_run_each_hostile_one_with_counts_or_an_error(client, caplog):
    with caplog.at_level(logging.CRITICAL):
        status, body = _ask(client, "runs", None)
    assert status == 200
    runs = {r["run"]: r for r in body["runs"]}
    assert set(runs) == set(HOSTILE) | {HEALTHY}
    for name in HOSTILE:
        entry = runs[name]
        assert entry["hosts"] == ["h"]
        # Either read (counts) or said why not: never silently empty.
        assert entry["error"] or entry["num_graph_execution_traces"] is not None, entry
    healthy = runs[HEALTHY]
    assert healthy["error"] is None and healthy["num_graph_execution_traces"] == 10


def test_the_healthy_run_serves_every_route_beside_hostile_runs(client, caplog):
    with caplog.at_level(logging.CRITICAL):
        for name in HOSTILE:  # the hostile runs are read first
            _ask(client, "summary", name)
    for route in ROUTES:
        status, body = _ask(client, route, HEALTHY)
        assert status == 200, (route, body)
    summary = _ask(client, "summary", HEALTHY)[1]
    assert summary["first_bad_tensor"]["op_name"] == "Log" and summary["alerts"]["InfNan"] == 5  # 4 traces, 1 execution


@pytest.mark.parametrize("case", ["trace_mode_minus_1", "nan_in_health_counts",
                                  "short_health_vector", "huge_full_tensor_shape"])
def test_a_hostile_trace_does_not_take_its_neighbours_out_of_the_page(client, case, caplog):
    with caplog.at_level(logging.CRITICAL):
        for route in ("graph_execution/digests", "graph_execution/data"):
            status, body = _ask(client, route, case)
            assert status == 200, body
            items = {i["index"]: i for i in body["items"]}
            first, last = items[0], items[body["total"] - 1]
            assert (first["op_name"], first["wall_time"]) == ("Log", 10.0)
            assert (last["op_name"], last["wall_time"]) == ("mul", 30.0)
            # A hostile item is served readably or named as unreadable, never dropped silently.
            for item in body["items"]:
                assert "error" in item or "op_name" in item


def test_a_hostile_execution_does_not_take_its_neighbours_out_of_the_page(client, caplog):
    with caplog.at_level(logging.CRITICAL):
        for case in ("execution_huge_num_outputs", "execution_mode_minus_1",
                     "execution_nan_counts"):
            for route in ("execution/digests", "execution/data"):
                status, body = _ask(client, route, case)
                assert status == 200, (case, route, body)
                walls = [i.get("wall_time") for i in body["items"]]
                assert walls[0] == 11.0 and walls[-1] == 31.0, (case, route, body)


# -- the ring rewrite race, as a client of the routes sees it ---------------------------------

RING = 64
RACE_POLLS = 300
_RACE_ROUTES = ("graph_execution/digests", "graph_execution/data", "alerts")


class _FreshPlugin(NumericsPlugin):
    """Re-reads a run on every request, so that each poll can meet a ring rewrite."""

    update_interval_s = 0.0


def _race_trace(seq):
    """Trace ``seq`` of op ``nan<k>`` (k = seq % 7) holding k NaN of 10: its name says its health."""
    k = seq % 7
    values = [seq, -1, 1, 1, 10, 0, 0, k, 0, 0, 10 - k]
    return trace_payload("nan%d" % k, values, float(seq), graph_id="g-race")


def _race_structure(writer):
    graph = debug_event_pb2.DebugEvent()
    graph.debugged_graph.graph_id, graph.debugged_graph.graph_name = "g-race", "race"
    writer.write_event(graph)
    for k in range(7):
        op = debug_event_pb2.DebugEvent()
        c = op.graph_op_creation
        c.op_type, c.op_name, c.graph_id, c.graph_name = "Op", "nan%d" % k, "g-race", "race"
        c.num_outputs = 1
        writer.write_event(op)


def _inconsistencies(route, body):
    """What in one 200 answer contradicts the health its op names encode; [] when consistent."""
    bad = []
    items = body["items"]
    if route != "alerts" and [i["index"] for i in items] != list(range(body["begin"], body["end"])):
        bad.append("indices %s are not [%d, %d)" % ([i["index"] for i in items], body["begin"],
                                                    body["end"]))
    if body["total"] > RING:
        bad.append("total %d exceeds the ring of %d" % (body["total"], RING))
    walls = []
    for item in items:
        if "error" in item:
            bad.append("error item %s" % item)
            continue
        k = int(item["op_name"][len("nan"):])
        health = item["health"]
        if health["nan"] != k or int(item["wall_time"]) % 7 != k:
            bad.append("%s holds %s NaN at wall time %s" % (item["op_name"], health["nan"],
                                                           item["wall_time"]))
        if route == "graph_execution/data" and item["debug_tensor_value"][7] != k:
            bad.append("%s data holds %s" % (item["op_name"], item["debug_tensor_value"]))
        if route == "alerts" and k == 0:
            bad.append("healthy %s listed as an alert" % item["op_name"])
        walls.append(item["wall_time"])
    if route != "alerts" and walls != sorted(walls):
        bad.append("wall times out of order: %s" % walls)
    return bad


def test_polling_a_ring_dump_while_it_is_rewritten_gets_only_consistent_answers(tmp_path, caplog):
    writer = FileSetWriter(str(tmp_path / "ring"), circular_buffer_size=RING, host_name="h")
    _race_structure(writer)
    for seq in range(RING):
        writer.write_serialized("graph_execution_traces", _race_trace(seq))
    writer.flush()
    flags = argparse.Namespace(logdir=str(tmp_path), path_prefix="", samples_per_plugin={},
                               window_title="")
    client = werkzeug_test.Client(
        application.TensorBoardWSGIApp(flags, [_FreshPlugin], data_provider=None))
    stop = threading.Event()
    written = [RING]

    def keep_writing():
        seq = RING
        while not stop.is_set():
            for _ in range(10):
                writer.write_serialized("graph_execution_traces", _race_trace(seq))
                seq += 1
            writer.flush()  # rewrites the ring file whole
            written[0] = seq
            time.sleep(0.002)

    thread = threading.Thread(target=keep_writing)
    thread.start()
    statuses, inconsistent = collections.Counter(), []
    try:
        with caplog.at_level(logging.CRITICAL):
            for poll in range(RACE_POLLS):
                route = _RACE_ROUTES[poll % len(_RACE_ROUTES)]
                status, body = _ask(client, route, "ring")
                statuses[status] += 1
                problems = _inconsistencies(route, body) if status == 200 else []
                if problems:
                    inconsistent.append("poll %d %s: %s" % (poll, route, problems[0]))
    finally:
        stop.set()
        thread.join()
        writer.close()
    assert written[0] > 2 * RING, "the writer did not wrap the ring during the polls"
    assert statuses[500] == 0, statuses
    assert not inconsistent, "%d of %d polls inconsistent: %s" % (
        len(inconsistent), RACE_POLLS, inconsistent[:5])
    assert statuses[200] == RACE_POLLS, statuses
