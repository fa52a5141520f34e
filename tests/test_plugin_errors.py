"""What clients get wrong: 400 naming the parameter, 404 for unknown names, never a 500."""

import pytest

from test_plugin_helpers import demo_logdir, get, make_client

RUN = "tf_mnist"
JSON_ROUTES = (
    "summary", "alerts", "alerts/next", "execution/digests", "execution/data",
    "graph_execution/digests", "graph_execution/data", "graph_execution/search",
    "graphs/graph_info", "graphs/op_info", "source_files/list", "source_files/file",
    "stack_frames/stack_frames", "steps", "steps/find",
)


@pytest.fixture(scope="session")
def client(tmp_path_factory):
    return make_client(demo_logdir(str(tmp_path_factory.getbasetemp())))


def _error(client, route, status, parameter, **params):
    code, body = get(client, route, **params)
    assert code == status, body
    assert set(body) == {"error"}
    assert body["error"]["code"] == status and body["error"]["parameter"] == parameter
    assert body["error"]["message"]
    return body["error"]


@pytest.mark.parametrize("route", JSON_ROUTES)
def test_missing_run_is_400_naming_run(client, route):
    _error(client, route, 400, "run")


@pytest.mark.parametrize("route", JSON_ROUTES)
def test_unknown_run_is_404_naming_run(client, route):
    _error(client, route, 404, "run", run="no_such_run")


@pytest.mark.parametrize("run", ["..", "../..", "/etc", "tf_mnist/..", "tf_mnist/../.."])
def test_path_like_run_names_are_unknown_runs(client, run):
    _error(client, "execution/digests", 404, "run", run=run)


def test_unknown_host_is_404_naming_host(client):
    _error(client, "graph_execution/digests", 404, "host", run=RUN, host="nohost")


@pytest.mark.parametrize("value", ["x", "1.5", " 3", "0x10", "1e3", "9" * 60])
def test_malformed_begin_is_400_naming_begin(client, value):
    _error(client, "graph_execution/digests", 400, "begin", run=RUN, begin=value)


def test_empty_begin_means_the_default(client):
    status, body = get(client, "execution/digests", run=RUN, begin="", end=3)
    assert status == 200 and (body["begin"], body["end"]) == (0, 3)


def test_negative_begin_is_400_naming_begin(client):
    _error(client, "execution/digests", 400, "begin", run=RUN, begin=-1)


def test_end_before_begin_is_400_naming_end(client):
    _error(client, "execution/digests", 400, "end", run=RUN, begin=5, end=2)


def test_end_below_minus_one_is_400_naming_end(client):
    _error(client, "execution/digests", 400, "end", run=RUN, end=-2)


def test_end_past_the_total_is_clipped(client):
    status, body = get(client, "execution/digests", run=RUN, begin=1, end=10**6)
    assert status == 200 and body["end"] == body["total"] == body["begin"] + len(body["items"])


def test_huge_end_is_clipped_to_the_total(client):
    status, body = get(client, "graph_execution/digests", run=RUN, end="9" * 30)
    assert status == 200 and body["end"] == body["total"]


def test_begin_past_the_total_is_an_empty_page(client):
    status, body = get(client, "graph_execution/digests", run=RUN, begin=10**9)
    assert status == 200 and body["items"] == [] and body["begin"] == body["end"] == body["total"]


def test_data_pages_are_capped_at_100_items(client):
    body = get(client, "graph_execution/data", run=RUN, begin=0, end=10**6)[1]
    assert len(body["items"]) == min(body["total"], 100) == body["end"]


def test_bad_boolean_is_400_naming_bad_only(client):
    _error(client, "graph_execution/search", 400, "bad_only", run=RUN, bad_only="maybe")


def test_unknown_alert_type_is_400_naming_alert_type(client):
    _error(client, "alerts", 400, "alert_type", run=RUN, alert_type="Nope")


def test_bad_direction_is_400_naming_direction(client):
    _error(client, "alerts/next", 400, "direction", run=RUN, index=0, direction="sideways")


def test_missing_index_for_next_alert_is_400_naming_index(client):
    _error(client, "alerts/next", 400, "index", run=RUN)


def test_find_step_without_step_is_400_naming_step(client):
    _error(client, "steps/find", 400, "step", run=RUN)


@pytest.mark.parametrize("value", ["x", "1.5", "9" * 60])
def test_malformed_step_is_400_naming_step(client, value):
    _error(client, "steps/find", 400, "step", run=RUN, step=value)
    _error(client, "graph_execution/search", 400, "step", run=RUN, step=value)


def test_unknown_graph_is_404_naming_graph_id(client):
    _error(client, "graphs/graph_info", 404, "graph_id", run=RUN, graph_id="nope")
    _error(client, "graphs/op_info", 404, "graph_id", run=RUN, graph_id="nope", op_name="Log")


def test_unknown_op_is_404_naming_op_name(client):
    graph_id = get(client, "alerts", run=RUN, end=1)[1]["items"][0]["graph_id"]
    _error(client, "graphs/op_info", 404, "op_name", run=RUN, graph_id=graph_id, op_name="nope")


def test_missing_op_name_is_400_naming_op_name(client):
    _error(client, "graphs/op_info", 400, "op_name", run=RUN, graph_id="g")


def test_source_file_index_past_the_list_is_404_naming_index(client):
    count = len(get(client, "source_files/list", run=RUN)[1]["items"])
    _error(client, "source_files/file", 404, "index", run=RUN, index=count)


@pytest.mark.parametrize("index", ["../../etc/passwd", "/etc/passwd", "-1", "tf_mnist.py"])
def test_path_like_source_file_index_is_400_and_never_opens_a_path(client, index):
    _error(client, "source_files/file", 400, "index", run=RUN, index=index)


def test_unknown_stack_frame_id_is_404_naming_stack_frame_ids(client):
    _error(client, "stack_frames/stack_frames", 404, "stack_frame_ids", run=RUN,
           stack_frame_ids="nope")


def test_empty_stack_frame_id_is_400(client):
    _error(client, "stack_frames/stack_frames", 400, "stack_frame_ids", run=RUN,
           stack_frame_ids="a,,b")


_NASTY = ["x", "-5", "9" * 45, "%00", "../..", "true", "NaN", "", "\u00e9", "1,2"]
_PARAMS = ("begin", "end", "index", "host", "graph_id", "op_name", "stack_frame_ids",
           "bad_only", "alert_type", "direction", "kind", "op_type", "name", "step")


@pytest.mark.parametrize("route", JSON_ROUTES)
def test_no_parameter_value_causes_a_500(client, route):
    for param in _PARAMS:
        for value in _NASTY:
            code, body = get(client, route, run=RUN, **{param: value})
            assert code in (200, 400, 404), (route, param, value, body)
            if code != 200:
                assert body["error"]["code"] == code
