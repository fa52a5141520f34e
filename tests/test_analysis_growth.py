"""OverflowGrowth (analysis/growth.py) and the report's "Numerics over time" (summary, CLI).

Series are written with the real encoder beside real dumps of tests/dumps.py.
"""

import json
import math

import numpy as np
import pytest

import dumps
import trends_data
from trends_data import GROWING, STEADY
from tb_numerics_plugin import cli, series
from tb_numerics_plugin.analysis import analyze_run, growth

ALERT_KEYS = {"alert_type", "host", "series_kind", "module", "dtype", "limit", "first_step",
              "last_step", "abs_max_first", "abs_max_last", "bits_per_step", "r_squared",
              "num_points", "headroom_bits", "projected_overflow_step", "message"}


def _alerts(tmp_path, modules, steps=range(60), kind="output", bad_free=True):
    root = str(tmp_path)
    writer = dumps.write_dump(root, bad_from=None if bad_free else 3)
    trends_data.write_steps(series.path_for(writer.prefix), steps, modules, kind=kind)
    return growth.run_alerts(dumps.read_run(root))


def _scaled(scale, rate, start=0):
    return lambda s: trends_data.tensor(s - start, scale, rate)


def test_fit_of_an_exact_exponential_is_its_rate_with_r2_one():
    steps = np.arange(10)
    slope, r2 = growth.fit(steps, 3.0 * 2.0 ** (0.25 * steps))
    assert slope == pytest.approx(0.25) and r2 == pytest.approx(1.0)


def test_fit_of_a_constant_has_no_slope_and_no_r2():
    assert growth.fit(np.arange(5), np.full(5, 7.0)) == (0.0, 0.0)


def test_a_float16_output_growing_toward_its_limit_is_one_alert_with_the_documented_fields(
        tmp_path):
    root = str(tmp_path)
    trends_data.dump_with_series(root)  # GROWING: 120 * 1.1**(s-10), steps 10..60
    run = dumps.read_run(root)
    (alert,) = growth.run_alerts(run)
    assert set(alert) == ALERT_KEYS
    assert (alert["alert_type"], alert["host"], alert["series_kind"], alert["module"],
            alert["dtype"], alert["limit"]) == ("OverflowGrowth", "testhost", "output", GROWING,
                                                "float16", 65504.0)
    # the last 50 points: steps 11..60
    assert (alert["first_step"], alert["last_step"], alert["num_points"]) == (11, 60, 50)
    assert alert["bits_per_step"] == pytest.approx(math.log2(1.1), rel=1e-4)
    last = 120.0 * 1.1 ** 50
    assert alert["abs_max_last"] == pytest.approx(last, rel=1e-6)
    assert alert["headroom_bits"] == pytest.approx(math.log2(65504.0 / last), rel=1e-5)
    # 120 * 1.1**(s-10) passes 65504 between steps 76 and 77
    assert 120.0 * 1.1 ** 66 < 65504.0 < 120.0 * 1.1 ** 67
    assert alert["projected_overflow_step"] == 77
    assert alert["message"] == (
        "model.layers.0.mlp output abs max grew 1.3e+02 -> 1.4e+04 over steps 11-60 (x1.10 per "
        "step); at this rate it reaches the float16 limit 65504 near step 77")


def test_steady_series_raise_no_alert(tmp_path):
    assert _alerts(tmp_path, {"m": ("float16", _scaled(30000.0, 1.0))}) == []


def test_the_same_growth_in_float32_is_far_from_its_limit_and_raises_none(tmp_path):
    assert _alerts(tmp_path, {"m": ("float32", _scaled(120.0, 1.1))}) == []


def test_noise_without_a_trend_raises_none(tmp_path):
    rng = np.random.default_rng(0)
    scales = 2.0 ** rng.uniform(10, 15.9, size=60)  # float16, jumping around, near the limit
    assert _alerts(tmp_path, {"m": ("float16", lambda s: trends_data.tensor(0, scales[s]))}) == []


def test_fewer_than_five_points_raise_none(tmp_path):
    assert _alerts(tmp_path, {"m": ("float16", _scaled(1000.0, 2.0))}, steps=range(4)) == []
    assert len(_alerts(tmp_path / "five", {"m": ("float16", _scaled(1000.0, 2.0))},
                       steps=range(5))) == 1


def test_growth_under_two_bits_over_the_window_raises_none(tmp_path):
    # x1.02 per step over 49 steps: 1.4 bits, though close to the limit
    assert _alerts(tmp_path, {"m": ("float16", _scaled(16000.0, 1.02))}, steps=range(50)) == []


def test_growth_that_would_take_longer_than_the_window_to_overflow_raises_none(tmp_path):
    # x1.05 per step from 1: 3.5 bits over 50 steps, 12.5 bits of headroom left: 178 steps
    assert _alerts(tmp_path, {"m": ("float16", _scaled(1.0, 1.05))}, steps=range(50)) == []


def test_only_the_last_fifty_points_count(tmp_path):
    early = lambda s: trends_data.tensor(min(s, 30), 1.0, 1.35)  # noqa: E731
    assert _alerts(tmp_path, {"m": ("float16", early)}, steps=range(90)) == []


def test_points_from_the_first_nonfinite_step_on_are_left_out(tmp_path):
    def overflowing(s):
        values = trends_data.tensor(s, 120.0, 1.1)
        return np.append(values, np.inf) if s >= 60 else values

    (alert,) = _alerts(tmp_path, {"m": ("float16", overflowing)}, steps=range(80))
    assert alert["last_step"] == 59

    def flat_then_bad_then_growing(s):
        if s < 20:
            return trends_data.tensor(0, 100.0)
        return np.append(trends_data.tensor(s, 100.0, 1.2), np.nan)

    assert _alerts(tmp_path / "b", {"m": ("float16", flat_then_bad_then_growing)}) == []


def test_grad_series_are_judged_too(tmp_path):
    (alert,) = _alerts(tmp_path, {"m": ("bfloat16", _scaled(1e30, 1.5))}, kind="grad",
                       steps=range(30))
    assert alert["series_kind"] == "grad" and alert["dtype"] == "bfloat16"


def test_a_dtype_without_a_limit_raises_none(tmp_path):
    assert _alerts(tmp_path, {"m": ("int32", _scaled(120.0, 1.5))}) == []


def test_alerts_are_sorted_most_urgent_first(tmp_path):
    alerts = _alerts(tmp_path, {"slow": ("float16", _scaled(120.0, 1.1)),
                                "fast": ("float16", _scaled(2.0, 1.25))})
    assert [a["module"] for a in alerts] == ["fast", "slow"]


def test_report_json_has_trends_per_host_and_growth(tmp_path, capsys):
    root = str(tmp_path)
    trends_data.dump_with_series(root)
    assert cli.main(["report", root, "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    (alert,) = run["growth"]
    assert alert["module"] == GROWING
    host = run["trends"]["testhost"]
    assert (host["steps"], host["first_step"], host["last_step"], host["kinds"]) == (
        51, 10, 60, ["output"])
    lowest = host["lowest_headroom"]
    assert [e["module"] for e in lowest] == [GROWING, STEADY]
    assert set(lowest[0]) == {"kind", "module", "dtype", "step", "headroom_bits", "abs_max"}
    assert lowest[0]["step"] == 60 and lowest[0]["dtype"] == "float16"
    assert lowest[0]["headroom_bits"] == pytest.approx(alert["headroom_bits"], rel=1e-5)


def test_lowest_headroom_keeps_the_five_lowest_modules(tmp_path):
    root = str(tmp_path)
    writer = dumps.write_dump(root)
    trends_data.write_steps(series.path_for(writer.prefix), range(3), {
        "m%d" % i: ("float16", _scaled(2.0 ** i, 1.0)) for i in range(8)})
    host = analyze_run(dumps.read_run(root))["trends"]["testhost"]
    assert [e["module"] for e in host["lowest_headroom"]] == ["m7", "m6", "m5", "m4", "m3"]


def test_a_dump_without_series_reports_empty_trends_and_growth(ours_dump):
    summary = analyze_run(dumps.read_run(ours_dump))
    assert summary["trends"] == {} and summary["growth"] == []


def test_the_text_report_prints_numerics_over_time_with_growth_first(tmp_path, capsys):
    root = str(tmp_path)
    trends_data.dump_with_series(root)
    cli.main(["report", root])
    out = capsys.readouterr().out
    section = out[out.index("  Numerics over time:"):].splitlines()
    assert section[1] == ("    OverflowGrowth on testhost: model.layers.0.mlp output abs max "
                          "grew 1.3e+02 -> 1.4e+04 over steps 11-60 (x1.10 per step); at this "
                          "rate it reaches the float16 limit 65504 near step 77")
    assert section[2] == "    testhost: 51 steps summarized (10 to 60): output"
    assert section[3].startswith("      least headroom: model.layers.0.mlp output (float16): "
                                 "2.2 bits at step 60")


def test_growth_alone_leaves_the_check_exit_status_0(tmp_path, capsys):
    root = str(tmp_path)
    writer = dumps.write_dump(root, bad_from=None)
    trends_data.write_steps(series.path_for(writer.prefix), range(60),
                            {"m": ("float16", _scaled(120.0, 1.1))})
    assert cli.main(["report", root, "--check"]) == 0
    assert "OverflowGrowth on testhost" in capsys.readouterr().out


def test_summary_follows_the_series_as_it_grows(tmp_path):
    root = str(tmp_path)
    writer = dumps.write_dump(root)
    path = series.path_for(writer.prefix)
    modules = {"m": ("float16", _scaled(120.0, 1.1))}
    trends_data.write_steps(path, range(3), modules)
    run = dumps.read_run(root)
    assert analyze_run(run)["growth"] == []
    trends_data.write_steps(path, range(3, 60), modules)
    run.update()
    summary = analyze_run(run)
    assert len(summary["growth"]) == 1 and summary["trends"]["testhost"]["steps"] == 60
