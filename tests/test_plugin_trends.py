"""GET trends (plugin/trends_route.py) through TensorBoard's WSGI app, on real dumps with series
written by the real encoder (series.SeriesWriter)."""

import numpy as np
import pytest

import dumps
import trends_data
from trends_data import GROWING, STEADY
from test_plugin_helpers import get, make_client
from tb_numerics_plugin import series

BODY_KEYS = {"run", "host", "kind", "stat", "kinds", "stats", "steps", "step_span", "bucket",
             "modules", "growth"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("trends_logdir")
    trends_data.dump_with_series(str(logdir / "grow"))  # steps 10..60, GROWING and STEADY
    dumps.write_dump(str(logdir / "plain"))
    writer = dumps.write_dump(str(logdir / "gaps"))
    trends_data.write_steps(series.path_for(writer.prefix), range(6), {
        "m": ("float16", lambda s: np.append(trends_data.tensor(s, 2.0, 2.0), np.inf)
              if s == 4 else trends_data.tensor(s, 2.0, 2.0)),
        "odd": ("float32", lambda s: trends_data.tensor(s) if s % 2 else None)})
    return make_client(str(logdir))


def test_the_answer_has_one_column_per_step_and_one_row_per_module(client):
    status, body = get(client, "trends", run="grow")
    assert status == 200 and set(body) == BODY_KEYS
    assert (body["run"], body["host"], body["kind"], body["stat"]) == (
        "grow", "testhost", "output", "abs_max")
    assert body["kinds"] == ["output"] and body["stats"] == list(series.STATS)
    assert body["steps"] == list(range(10, 61)) and body["bucket"] == 1
    assert body["step_span"] == [[s, s] for s in range(10, 61)]
    growing, steady = body["modules"]
    assert (growing["module"], growing["dtype"], growing["limit"]) == (GROWING, "float16", 65504)
    assert (steady["module"], steady["dtype"]) == (STEADY, "float32")
    assert steady["limit"] == pytest.approx(3.4028234663852886e38)
    assert growing["values"][0] == 120.0
    assert growing["values"][-1] == pytest.approx(120.0 * 1.1 ** 50, rel=1e-6)
    assert growing["headroom_bits"][-1] == pytest.approx(np.log2(65504 / (120 * 1.1 ** 50)),
                                                         rel=1e-5)
    assert steady["nonfinite"] == [0.0] * 51


def test_the_answer_carries_the_hosts_growth_alerts(client):
    (alert,) = get(client, "trends", run="grow")[1]["growth"]
    assert alert["alert_type"] == "OverflowGrowth" and alert["module"] == GROWING
    assert alert["projected_overflow_step"] == 77


def test_stat_picks_the_values(client):
    body = get(client, "trends", run="grow", stat="min")[1]
    assert body["stat"] == "min"
    assert body["modules"][1]["values"][0] == -2.25  # STEADY: 3 * [-0.5, 0.25, 1, -0.75]


def test_more_steps_than_max_steps_share_columns_reduced_per_stat(client):
    full = {stat: get(client, "trends", run="gaps", stat=stat)[1] for stat in series.STATS}
    for stat, reduce in (("abs_max", max), ("max", max), ("min", min), ("headroom_bits", min),
                         ("nonfinite", sum), ("mean", np.mean), ("std", np.mean)):
        body = get(client, "trends", run="gaps", stat=stat, max_steps=2)[1]
        assert body["bucket"] == 3 and body["steps"] == [0, 3]
        assert body["step_span"] == [[0, 2], [3, 5]]
        values = full[stat]["modules"][0]["values"]
        got = body["modules"][0]["values"]
        assert got == pytest.approx([reduce(values[:3]), reduce(values[3:])]), stat
    body = get(client, "trends", run="gaps", max_steps=2)[1]
    m = body["modules"][0]
    assert m["nonfinite"] == [0.0, 1.0]
    assert m["headroom_bits"] == pytest.approx(
        [min(full["headroom_bits"]["modules"][0]["values"][:3]),
         min(full["headroom_bits"]["modules"][0]["values"][3:])])


def test_absent_values_are_null_and_a_bucket_of_absent_values_stays_null(client):
    odd = get(client, "trends", run="gaps")[1]["modules"][1]
    assert odd["module"] == "odd"
    assert odd["values"][0::2] == [None, None, None] and None not in odd["values"][1::2]
    assert odd["nonfinite"][0::2] == [None, None, None]
    # one bucket per step pair: each pair holds one odd step
    paired = get(client, "trends", run="gaps", max_steps=3)[1]["modules"][1]
    assert None not in paired["values"] and paired["nonfinite"] == [0.0, 0.0, 0.0]


def test_max_steps_above_the_cap_is_clipped_to_2000_columns(tmp_path):
    root = tmp_path / "long"
    writer = dumps.write_dump(str(root))
    trends_data.write_steps(series.path_for(writer.prefix), range(2001),
                            {"m": ("float32", lambda s: trends_data.tensor(0))})
    body = get(make_client(str(tmp_path)), "trends", run="long", max_steps=100000)[1]
    assert body["bucket"] == 2 and len(body["steps"]) == 1001
    assert body["step_span"][-1] == [2000, 2000]


def test_a_run_without_series_answers_200_with_no_modules_and_no_kinds(client):
    status, body = get(client, "trends", run="plain")
    assert status == 200
    assert (body["modules"], body["kinds"], body["steps"], body["growth"]) == ([], [], [], [])


def test_a_kind_the_series_lacks_answers_no_modules(client):
    body = get(client, "trends", run="grow", kind="grad")[1]
    assert body["kinds"] == ["output"] and body["modules"] == [] and body["steps"] == []


@pytest.mark.parametrize("params, parameter", [
    ({"kind": "activation"}, "kind"),
    ({"stat": "median"}, "stat"),
    ({"max_steps": "0"}, "max_steps"),
    ({"max_steps": "many"}, "max_steps"),
])
def test_bad_parameters_are_400_naming_the_parameter(client, params, parameter):
    status, body = get(client, "trends", run="grow", **params)
    assert status == 400 and body["error"]["parameter"] == parameter


def test_unknown_run_and_host_are_404(client):
    assert get(client, "trends", run="nope")[1]["error"]["parameter"] == "run"
    status, body = get(client, "trends", run="grow", host="other")
    assert status == 404 and body["error"]["parameter"] == "host"


def test_summary_counts_growth_alerts_per_host(client):
    body = get(client, "summary", run="grow")[1]
    assert body["growth_by_host"] == {"testhost": 1}
    assert [a["module"] for a in body["growth"]] == [GROWING]
    assert body["trends"]["testhost"]["last_step"] == 60


def test_a_real_torch_capture_with_trends_is_served_with_its_growth_alert(tmp_path):
    torch = pytest.importorskip("torch")
    from tb_numerics_plugin import torch as tbn

    class Grow(torch.nn.Module):
        """Scales its input by a factor the loop raises x1.15 per step, in float16."""

        def __init__(self):
            super().__init__()
            self.scale = 1.0

        def forward(self, x):
            return (x * self.scale).half()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.grow = Grow()

        def forward(self, x):
            return self.grow(self.lin(x))

    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.randn(3, 4)
    dump = tmp_path / "torch_run"
    with tbn.enable_dump_debug_info(str(dump), "NO_TENSOR", trace_steps=[999],
                                    trends=True) as handle:
        for step in range(40):
            handle.step(step)
            model.grow.scale = 200.0 * 1.15 ** step
            loss = model(x).float().sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    client = make_client(str(tmp_path))
    status, body = get(client, "trends", run="torch_run")
    assert status == 200
    assert body["kinds"] == ["output", "grad"] and body["steps"] == list(range(40))
    rows = {m["module"]: m for m in body["modules"]}
    assert set(rows) == {"Net", "lin", "grow"}
    assert rows["grow"]["dtype"] == "float16" and rows["grow"]["limit"] == 65504
    lin_out = model.lin(x).detach().abs().max().item()
    assert rows["grow"]["values"][-1] == pytest.approx(
        torch.tensor(lin_out * 200.0 * 1.15 ** 39).half().item(), rel=1e-3)
    modules = {(a["series_kind"], a["module"]) for a in body["growth"]}
    assert ("output", "grow") in modules and ("output", "lin") not in modules
    grads = get(client, "trends", run="torch_run", kind="grad")[1]
    assert {m["module"] for m in grads["modules"]} >= {"grow", "lin"}
