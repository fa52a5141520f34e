"""Every route of the numerics plugin, through TensorBoard's WSGI app, on real demo dumps.

The TF demo (``tf.math.log(probs)`` on saturated softmax probabilities)
is run once per session in a subprocess; its dump is the data under test.
"""

import pytest

from test_plugin_helpers import TORCH_DEMO, demo_available, demo_logdir, get, make_client

RUN = "tf_mnist"


@pytest.fixture(scope="session")
def client(tmp_path_factory):
    return make_client(demo_logdir(str(tmp_path_factory.getbasetemp())))


@pytest.fixture(scope="session")
def first_alert(client):
    status, body = get(client, "alerts", run=RUN, end=1)
    assert status == 200
    return body["items"][0]


def test_plugins_listing_marks_numerics_enabled_on_a_logdir_with_dumps(client):
    listing = client.get("/data/plugins_listing").get_json()
    assert listing["numerics"]["enabled"] is True


def test_runs_lists_the_demo_run_with_its_host_and_counts(client):
    status, body = get(client, "runs")
    assert status == 200
    (run,) = [r for r in body["runs"] if r["run"] == RUN]
    assert len(run["hosts"]) == 1 and run["tensor_debug_mode"] == "FULL_HEALTH"
    assert run["num_executions"] == get(client, "execution/digests", run=RUN, end=0)[1]["total"]
    traces = get(client, "graph_execution/digests", run=RUN, end=0)[1]["total"]
    assert run["num_graph_execution_traces"] == traces > 0
    assert run["num_graphs"] > 0


def test_first_alert_is_the_infnan_of_the_log_op(client, first_alert):
    assert first_alert["alert_type"] == "InfNan"
    assert first_alert["kind"] == "graph_execution_trace"
    assert first_alert["op_type"] == "Log"
    assert first_alert["health"]["neg_inf"] > 0


def test_alerts_page_carries_counts_per_type_and_the_total(client):
    status, body = get(client, "alerts", run=RUN)
    assert status == 200
    assert body["counts"]["InfNan"] > 0
    assert body["total"] == sum(body["counts"].values())
    assert body["begin"] == 0 and body["end"] == len(body["items"]) == min(body["total"], 1000)


def test_alerts_filtered_by_type_hold_only_that_type(client):
    body = get(client, "alerts", run=RUN, alert_type="InfNan")[1]
    assert body["total"] == body["counts"]["InfNan"]
    assert {a["alert_type"] for a in body["items"]} == {"InfNan"}


def test_next_alert_after_minus_one_is_the_first_alert(client, first_alert):
    status, body = get(client, "alerts/next", run=RUN, index=-1)
    assert status == 200 and body["alert"] == first_alert


def test_next_and_previous_alert_move_strictly_past_the_index(client, first_alert):
    index = first_alert["index"]
    after = get(client, "alerts/next", run=RUN, index=index)[1]["alert"]
    assert after["index"] > index
    before = get(client, "alerts/next", run=RUN, index=after["index"], direction="prev")[1]
    assert before["alert"]["index"] < after["index"]


def test_summary_names_the_log_op_as_first_bad_tensor(client):
    status, body = get(client, "summary", run=RUN)
    assert status == 200
    assert body["run"] == RUN and body["alerts"]["InfNan"] > 0
    assert body["first_bad_tensor"]["op_type"] == "Log"


def test_execution_digests_page_is_the_asked_range(client):
    total = get(client, "execution/digests", run=RUN, end=0)[1]["total"]
    body = get(client, "execution/digests", run=RUN, begin=2, end=7)[1]
    assert (body["begin"], body["end"], body["total"]) == (2, 7, total)
    assert [d["index"] for d in body["items"]] == list(range(2, 7))


def test_execution_data_holds_full_records_capped_at_100(client):
    body = get(client, "execution/data", run=RUN)[1]
    assert body["end"] - body["begin"] == len(body["items"]) == min(body["total"], 100)
    assert all("stack_frame_ids" in e and "debug_tensor_values" in e for e in body["items"])


def test_graph_execution_digests_page_is_the_asked_range(client):
    body = get(client, "graph_execution/digests", run=RUN, begin=5, end=10)[1]
    assert [d["index"] for d in body["items"]] == list(range(5, 10))


def test_graph_execution_data_holds_the_health_vector_of_the_bad_trace(client, first_alert):
    index = first_alert["index"]
    body = get(client, "graph_execution/data", run=RUN, begin=index, end=index + 1)[1]
    (trace,) = body["items"]
    # FULL_HEALTH layout: index 5 counts -inf.
    assert trace["debug_tensor_value"][5] == first_alert["health"]["neg_inf"]


def test_search_by_op_type_returns_only_that_type_with_trace_indices(client):
    body = get(client, "graph_execution/search", run=RUN, op_type="Log")[1]
    assert body["total"] > 0 and {d["op_type"] for d in body["items"]} == {"Log"}
    direct = get(client, "graph_execution/digests", run=RUN,
                 begin=body["items"][0]["index"], end=body["items"][0]["index"] + 1)[1]
    assert direct["items"][0] == body["items"][0]


def test_search_bad_only_returns_exactly_the_infnan_trace_alerts(client):
    bad = get(client, "graph_execution/search", run=RUN, bad_only="true")[1]
    alerts = get(client, "alerts", run=RUN, alert_type="InfNan")[1]["items"]
    trace_alerts = [a["index"] for a in alerts if a["kind"] == "graph_execution_trace"]
    assert [d["index"] for d in bad["items"]] == trace_alerts


def test_search_by_name_substring_matches_op_names(client):
    body = get(client, "graph_execution/search", run=RUN, name="Lo")[1]
    assert body["total"] > 0 and all("Lo" in d["op_name"] for d in body["items"])


def test_graph_info_of_the_bad_trace_graph_is_the_loss_function(client, first_alert):
    status, body = get(client, "graphs/graph_info", run=RUN, graph_id=first_alert["graph_id"])
    assert status == 200 and body["name"] == "loss" and body["num_ops"] > 0


def test_op_info_of_log_has_probs_as_input(client, first_alert):
    status, body = get(client, "graphs/op_info", run=RUN,
                       graph_id=first_alert["graph_id"], op_name=first_alert["op_name"])
    assert status == 200
    assert [i["op_name"] for i in body["inputs"]] == ["probs"]
    assert body["stack_frame_ids"]


def test_stack_frames_of_log_point_at_the_users_line(client, first_alert):
    op = get(client, "graphs/op_info", run=RUN,
             graph_id=first_alert["graph_id"], op_name=first_alert["op_name"])[1]
    status, body = get(client, "stack_frames/stack_frames", run=RUN,
                       stack_frame_ids=",".join(op["stack_frame_ids"]))
    assert status == 200 and len(body["stack_frames"]) == len(op["stack_frame_ids"])
    frames = [f for f in body["stack_frames"] if f["file_path"].endswith("tf_mnist.py")]
    assert frames
    source = get(client, "source_files/file", run=RUN, index=frames[-1]["file_index"])[1]
    lines = [source["lines"][f["lineno"] - 1] for f in frames]
    assert any("tf.math.log(probs)" in line for line in lines)


def test_source_files_list_names_the_demo_file_with_its_line_count(client):
    status, body = get(client, "source_files/list", run=RUN)
    assert status == 200
    (demo,) = [f for f in body["items"] if f["file_path"].endswith("demo/tf_mnist.py")]
    source = get(client, "source_files/file", run=RUN, index=demo["index"])[1]
    assert source["file_path"] == demo["file_path"] and len(source["lines"]) == demo["num_lines"]


_NO_TORCH_DEMO = not demo_available(TORCH_DEMO)


@pytest.mark.skipif(_NO_TORCH_DEMO, reason="torch demo not in this checkout")
def test_torch_run_first_alert_is_aten_log(client):
    status, body = get(client, "alerts", run="torch_mnist", end=1)
    assert status == 200 and body["items"][0]["op_type"].startswith("aten.log")


@pytest.mark.skipif(_NO_TORCH_DEMO, reason="torch demo not in this checkout")
def test_torch_run_leads_from_the_alert_to_the_users_source_line(client):
    alert = get(client, "alerts", run="torch_mnist", end=1)[1]["items"][0]
    op = get(client, "graphs/op_info", run="torch_mnist",
             graph_id=alert["graph_id"], op_name=alert["op_name"])[1]
    assert op["inputs"][0]["op_type"].startswith("aten._softmax")
    frames = get(client, "stack_frames/stack_frames", run="torch_mnist",
                 stack_frame_ids=",".join(op["stack_frame_ids"]))[1]["stack_frames"]
    innermost = frames[-1]
    source = get(client, "source_files/file", run="torch_mnist", index=innermost["file_index"])[1]
    assert "torch.log(probs)" in source["lines"][innermost["lineno"] - 1]
