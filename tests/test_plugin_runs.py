"""Runs: nested runs, several ranks per run, runs and records that appear while serving."""

import threading
import time

from tb_numerics_plugin.plugin.runs import RunRegistry
from test_plugin_helpers import SyntheticDump, get, make_client, write_status_sidecar

# Slightly longer than the plugin's 1 s update/discovery throttle.
_PAST_THROTTLE_S = 1.2


def _runs(client):
    status, body = get(client, "runs")
    assert status == 200
    return {r["run"]: r for r in body["runs"]}


def test_nested_directories_with_file_sets_are_runs(tmp_path):
    SyntheticDump(str(tmp_path / "a")).close()
    SyntheticDump(str(tmp_path / "b" / "c")).close()
    assert sorted(_runs(make_client(str(tmp_path)))) == ["a", "b/c"]


def test_two_ranks_in_one_directory_are_two_hosts_of_one_run(tmp_path):
    rank0 = SyntheticDump(str(tmp_path / "job"), part="rank0")
    rank1 = SyntheticDump(str(tmp_path / "job"), part="rank1")
    rank0.add_traces(3)
    rank1.add_traces(5, bad_every=5)
    client = make_client(str(tmp_path))
    run = _runs(client)["job"]
    assert run["hosts"] == ["testhost.rank0", "testhost.rank1"]
    assert run["num_graph_execution_traces"] == 8
    totals = [get(client, "graph_execution/digests", run="job", host=h)[1]["total"]
              for h in run["hosts"]]
    assert totals == [3, 5]


def test_alerts_are_per_host(tmp_path):
    rank0 = SyntheticDump(str(tmp_path / "job"), part="rank0")
    rank1 = SyntheticDump(str(tmp_path / "job"), part="rank1")
    rank0.add_traces(4)
    rank1.add_traces(4, bad_every=2)
    client = make_client(str(tmp_path))
    clean = get(client, "alerts", run="job", host="testhost.rank0")[1]
    bad = get(client, "alerts", run="job", host="testhost.rank1")[1]
    assert clean["counts"]["InfNan"] == 0 and clean["items"] == []
    assert [a["index"] for a in bad["items"]] == [1, 3]
    assert {a["host"] for a in bad["items"]} == {"testhost.rank1"}


def test_summary_counts_the_alerts_of_each_host(tmp_path):
    rank0 = SyntheticDump(str(tmp_path / "job"), part="rank0")
    rank1 = SyntheticDump(str(tmp_path / "job"), part="rank1")
    rank0.add_traces(4)
    rank1.add_traces(6, bad_every=2)
    summary = get(make_client(str(tmp_path)), "summary", run="job")[1]
    by_host = summary["alerts_by_host"]
    assert by_host["testhost.rank0"]["InfNan"] == 0
    assert by_host["testhost.rank1"]["InfNan"] == 3 == summary["alerts"]["InfNan"]
    assert summary["first_bad_tensor"]["host"] == "testhost.rank1"


def test_runs_carry_each_hosts_writer_status_with_its_notes(tmp_path):
    rank0 = SyntheticDump(str(tmp_path / "job"), part="rank0")
    rank1 = SyntheticDump(str(tmp_path / "job"), part="rank1")
    rank0.add_traces(2)
    rank1.add_traces(2)
    rank0.close()
    rank1.close()
    write_status_sidecar(rank0.writer.prefix)
    write_status_sidecar(
        rank1.writer.prefix, circular_buffer_size=1000,
        written={"execution": 0, "graph_execution_traces": 5000},
        evicted={"execution": 0, "graph_execution_traces": 4000},
        lost={"ENOSPC": 12}, first_error="tfdbg_events.x.graph_execution_traces: ENOSPC")
    run = _runs(make_client(str(tmp_path)))["job"]
    status = run["writer_status"]
    assert status["testhost.rank0"]["notes"] == []
    notes = status["testhost.rank1"]["notes"]
    assert any("kept the last 1000 of 5000" in n for n in notes), notes
    assert any("12 records lost" in n and "ENOSPC" in n for n in notes), notes
    # The notes are run warnings too, there prefixed with the file set they are about.
    assert all(any(w.endswith(n) for w in run["warnings"]) for n in notes), run["warnings"]
    assert run["error"] is None


def test_a_dump_without_a_writer_status_lists_null_status(tmp_path):
    SyntheticDump(str(tmp_path / "tf_like")).close()
    for path in tmp_path.glob("tf_like/*writer_status.json"):
        path.unlink()  # as a TensorFlow dump: no sidecar
    run = _runs(make_client(str(tmp_path)))["tf_like"]
    assert run["writer_status"] == {"testhost": None} and run["error"] is None


def test_default_host_is_the_first_host(tmp_path):
    rank0 = SyntheticDump(str(tmp_path / "job"), part="rank0")
    SyntheticDump(str(tmp_path / "job"), part="rank1").add_traces(7)
    rank0.add_traces(2)
    client = make_client(str(tmp_path))
    assert get(client, "graph_execution/digests", run="job")[1]["total"] == 2


def test_a_run_that_appears_later_is_served_without_restart(tmp_path):
    SyntheticDump(str(tmp_path / "first")).close()
    client = make_client(str(tmp_path))
    assert list(_runs(client)) == ["first"]
    SyntheticDump(str(tmp_path / "second")).add_traces(2)
    time.sleep(_PAST_THROTTLE_S)
    assert list(_runs(client)) == ["first", "second"]
    assert get(client, "graph_execution/digests", run="second")[1]["total"] == 2


def test_records_appended_while_serving_are_followed(tmp_path):
    dump = SyntheticDump(str(tmp_path / "live"))
    dump.add_traces(10)
    client = make_client(str(tmp_path))
    assert get(client, "graph_execution/digests", run="live")[1]["total"] == 10
    assert get(client, "alerts", run="live")[1]["total"] == 0
    dump.add_traces(20, bad_every=20)
    time.sleep(_PAST_THROTTLE_S)
    body = get(client, "graph_execution/digests", run="live", begin=25)[1]
    assert body["total"] == 30 and [d["index"] for d in body["items"]] == list(range(25, 30))
    assert [a["index"] for a in get(client, "alerts", run="live")[1]["items"]] == [29]


def test_updates_are_throttled_between_requests(tmp_path):
    dump = SyntheticDump(str(tmp_path / "live"))
    dump.add_traces(1)
    clock = [100.0]
    registry = RunRegistry(str(tmp_path), clock=lambda: clock[0])
    with registry.open("live") as reader:
        assert reader.num_graph_execution_traces() == 1
    dump.add_traces(1)
    clock[0] += 0.5
    with registry.open("live") as reader:
        assert reader.num_graph_execution_traces() == 1
    clock[0] += 0.6
    with registry.open("live") as reader:
        assert reader.num_graph_execution_traces() == 2


def test_one_reader_per_run_is_shared_across_requests(tmp_path):
    SyntheticDump(str(tmp_path / "r")).close()
    registry = RunRegistry(str(tmp_path))
    with registry.open("r") as first:
        pass
    with registry.open("r") as second:
        pass
    assert first is second


def test_is_active_only_once_a_dump_exists(tmp_path):
    client = make_client(str(tmp_path))
    listing = client.get("/data/plugins_listing").get_json()
    assert listing["numerics"]["enabled"] is False
    registry = RunRegistry(str(tmp_path), active_interval_s=0)
    assert registry.has_dumps() is False
    SyntheticDump(str(tmp_path / "later")).close()
    assert registry.has_dumps() is True


def test_a_missing_logdir_has_no_runs_and_is_inactive(tmp_path):
    client = make_client(str(tmp_path / "not_yet"))
    assert _runs(client) == {}
    assert client.get("/data/plugins_listing").get_json()["numerics"]["enabled"] is False


def test_concurrent_requests_during_growth_get_consistent_pages(tmp_path):
    dump = SyntheticDump(str(tmp_path / "live"))
    dump.add_traces(50, bad_every=7)
    client = make_client(str(tmp_path))
    failures = []

    def ask():
        for _ in range(15):
            status, body = get(client, "graph_execution/digests", run="live", begin=10, end=40)
            if status != 200 or [d["index"] for d in body["items"]] != list(range(10, 40)):
                failures.append((status, body))
            status, body = get(client, "alerts", run="live")
            if status != 200 or body["total"] != len(body["items"]):
                failures.append((status, body))

    threads = [threading.Thread(target=ask) for _ in range(6)]
    for t in threads:
        t.start()
    for _ in range(5):
        dump.add_traces(20, bad_every=7)
        time.sleep(0.3)
    for t in threads:
        t.join()
    assert failures == []


def test_background_read_indexes_runs_before_any_request(tmp_path):
    dump = SyntheticDump(str(tmp_path / "r"))
    dump.add_traces(4)
    clock = [50.0]
    registry = RunRegistry(str(tmp_path), clock=lambda: clock[0])
    registry.read_in_background().join(timeout=60)
    dump.add_traces(4)
    # The clock has not moved: open() finds the run fresh and serves what the
    # background read indexed (4), not what a first update would find now (8).
    with registry.open("r") as reader:
        assert reader.num_graph_execution_traces() == 4
