"""Alerts: InfNan per trace and execution, OverflowHeadroom, paging, next/previous, caching."""

import numpy as np
import pytest

import dumps
from tb_numerics_plugin.analysis import alerts, analyze_run
from tb_numerics_plugin.reader import Logdir
from tb_numerics_plugin.writer import FileSetWriter


def _run(root, name="."):
    run = Logdir(root).run(name)
    run.update()
    return run


@pytest.fixture(scope="module")
def run(ours_dump):
    return _run(ours_dump)


def _numerics(abs_max, dtype_enum=19, nan=0):
    """A FULL_NUMERICS vector of a 10-element tensor whose largest magnitude is abs_max."""
    return [0, -1, dtype_enum, 1, 10, 0, 0, nan, 0, 0, 10 - nan,
            1.0, abs_max, 1.0, abs_max, 2.0, 1.0]


def test_list_alerts_orders_traces_then_executions(run):
    total, items = alerts.list_alerts(run)
    assert total == 5
    assert [(a["kind"], a["index"]) for a in items] == [
        ("graph_execution_trace", 6), ("graph_execution_trace", 7), ("graph_execution_trace", 8),
        ("graph_execution_trace", 9), ("execution", 0)]


def test_alert_has_contract_keys_and_a_message(run):
    _, (alert,) = alerts.list_alerts(run, begin=0, end=1)
    assert set(alert) == {"alert_type", "kind", "index", "host", "op_type", "op_name",
                          "output_slot", "graph_id", "wall_time", "health", "message"}
    assert alert["message"] == "Log:0 in graph loss: 3 -inf of 10 elements"


def test_list_alerts_pages_are_clipped(run):
    total, items = alerts.list_alerts(run, begin=3, end=100)
    assert total == 5 and [a["index"] for a in items] == [9, 0]


def test_unknown_alert_type_is_a_value_error(run):
    with pytest.raises(ValueError, match="Overflow"):
        alerts.list_alerts(run, alert_type="Overflow")


def test_next_alert_goes_forward_and_back(run):
    assert alerts.next_alert(run, 6)["index"] == 7
    assert alerts.next_alert(run, 0)["index"] == 6
    assert alerts.next_alert(run, 7, direction=-1)["index"] == 6
    assert alerts.next_alert(run, 6, direction=-1) is None
    assert alerts.next_alert(run, 9) is None
    assert alerts.next_alert(run, -1, kind="execution")["op_type"] == "__inference_loss_1"


def test_overflow_headroom_fires_within_a_factor_two_of_the_dtype_limit(tmp_path):
    with FileSetWriter(str(tmp_path), circular_buffer_size=-1, host_name="h") as w:
        dumps.write_structure(w)
        for i, (abs_max, dtype) in enumerate([(40000.0, 19), (30000.0, 19), (40000.0, 1),
                                              (2e38, 1), (70000.0, 19)]):
            w.write_serialized("graph_execution_traces", dumps.trace_payload(
                "Log", _numerics(abs_max, dtype, nan=1 if i == 4 else 0), 10.0 + i,
                mode=dumps.FULL_NUMERICS))
    run = _run(str(tmp_path))
    _, items = alerts.list_alerts(run, alert_type="OverflowHeadroom")
    assert [a["index"] for a in items] == [0, 3]  # fp16 40000 and fp32 2e38; #4 is InfNan
    assert alerts.counts(run) == {"InfNan": 1, "OverflowHeadroom": 2, "MaskedNonFinite": 0}
    assert "within 2x of the float16 limit" in items[0]["message"]


def test_results_are_cached_until_update_indexes_new_data(ours_dump, tmp_path):
    import shutil
    root = str(tmp_path / "d")
    shutil.copytree(ours_dump, root)
    run = _run(root)
    first = analyze_run(run)
    # Each call answers a new dict (its warnings are read per call) over the cached analysis.
    assert analyze_run(run)["first_bad_tensor"] is first["first_bad_tensor"]
    assert run.update() is False
    assert analyze_run(run)["first_bad_tensor"] is first["first_bad_tensor"]
    (path,) = [p for p in (tmp_path / "d").iterdir() if p.name.endswith("traces")]
    dumps.append_record(str(path), dumps.trace_payload("mul", dumps.MUL_BAD, 5000.0))
    assert run.update() is True
    again = analyze_run(run)
    assert again["first_bad_tensor"] is not first["first_bad_tensor"]
    assert again["alerts"]["InfNan"] == 6


def test_bad_mask_and_alerts_agree_with_a_python_loop(run):
    expected = [i for i in range(run.num_graph_execution_traces())
                if run.graph_execution_trace(i)["health"]["any_inf_or_nan"]]
    assert np.array_equal(run.bad_trace_indices(), expected)
