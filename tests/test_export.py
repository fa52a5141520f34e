"""`tb-numerics export`: real dumps (a two-rank torch program, TF-written dumps in every mode)
exported to Parquet, read back with pyarrow and queried with DuckDB as docs/export.md does.
"""

import os
import subprocess
import sys

import pytest

from tb_numerics_plugin import cli
from tb_numerics_plugin.analysis import alerts, analyze_run
from tb_numerics_plugin.analysis.summary import module_of
from tb_numerics_plugin.reader import Logdir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One rank of a data-parallel job, as far as the capture can tell ($RANK): four marked steps of
# a small classifier; at BAD_STEP a temperature of 1e-4 saturates the softmax and log(0) = -inf.
PROGRAM = """
import sys
import torch
from torch import nn
from tb_numerics_plugin import torch as tbn

dump, bad_step = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
with tbn.enable_dump_debug_info(dump, "FULL_HEALTH", circular_buffer_size=-1) as handle:
    for step in range(4):
        handle.step(step)
        temperature = 1e-4 if step == bad_step else 1.0
        probs = torch.softmax(model(x) / temperature, dim=1)
        loss = -torch.log(probs).gather(1, y[:, None]).mean()
        loss.backward()
"""

FIRST_ACROSS_RANKS = """
    SELECT host, step, kind, "index", op_type, module, wall_time
    FROM read_parquet('{out}/**/*.parquet', hive_partitioning = true)
    WHERE alert = 'InfNan'
    ORDER BY wall_time
    LIMIT 1
"""


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """``(logdir, out)``: run ``job`` of two ranks (rank 1 goes bad at step 1 and runs first,
    rank 0 at step 2), exported to ``out``."""
    pytest.importorskip("pyarrow")
    root = tmp_path_factory.mktemp("export")
    script = root / "rank.py"
    script.write_text(PROGRAM)
    logdir = root / "logdir"
    for rank, bad_step in ((1, 1), (0, 2)):
        env = dict(os.environ, RANK=str(rank), PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
        proc = subprocess.run([sys.executable, str(script), str(logdir / "job"), str(bad_step)],
                              capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
    out = root / "out"
    assert cli.main(["export", str(logdir), str(out)]) == 0
    return logdir, out


def _rows(out, **filters):
    """Every exported row as a dict (host from the partition), sorted by host, kind, index."""
    import pyarrow.dataset as ds

    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table()
    rows = table.to_pylist()
    for key, value in filters.items():
        rows = [r for r in rows if r[key] == value]
    return sorted(rows, key=lambda r: (r["host"], r["kind"], r["index"]))


def _expected(run, host, kind):
    """The rows the export must hold for one host and kind, from the reader's digests."""
    if kind == "graph_execution_trace":
        digests = run.graph_execution_trace_digests(0, None, host)
    else:
        digests = run.execution_digests(0, None, host)
    types = {}  # index -> the first of alerts.TYPES the record raises
    for alert_type in reversed(alerts.TYPES):
        for a in alerts.list_alerts(run, host, alert_type)[1]:
            if a["kind"] == kind:
                types[a["index"]] = alert_type
    out = []
    for d in digests:
        health = d["health"] or {}
        op_name = d.get("op_name")
        out.append({
            "run": run.name, "host": host, "kind": kind, "index": d["index"], "step": d["step"],
            "wall_time": d["wall_time"], "op_type": d["op_type"], "op_name": op_name,
            "graph_id": d["graph_id"],
            "graph_name": (d["graph_name"] if kind == "graph_execution_trace"
                           else run.execution(d["index"], host)["graph_name"]),
            "output_slot": d.get("output_slot"), "tensor_debug_mode": d["tensor_debug_mode"],
            "nonfinite": bool(health.get("any_inf_or_nan", False)),
            "alert": types.get(d["index"]),
            "neg_inf": health.get("neg_inf"), "pos_inf": health.get("pos_inf"),
            "nan": health.get("nan"), "size": health.get("size"), "dtype": health.get("dtype")})
    return out


def _assert_rows_are_the_digests(logdir, out, run_name):
    run = Logdir(str(logdir)).run(run_name)
    run.update()
    got = _rows(out, run=run_name)
    want = []
    for host in run.hosts:
        for kind in ("execution", "graph_execution_trace"):
            want.extend(_expected(run, host, kind))
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert {k: v for k, v in g.items() if k != "module"} == w
        # the module path as the analysis names it (torch op names: "<module>/<op>_<n>")
        assert g["module"] == (module_of(w["op_name"]) if w["op_name"] is not None else None)
    return got


def test_rows_are_the_digests_of_every_trace_and_execution_of_both_ranks(ranks):
    logdir, out = ranks
    got = _assert_rows_are_the_digests(logdir, out, "job")
    hosts = sorted({r["host"] for r in got})
    assert len(hosts) == 2 and all(h.endswith((".rank0", ".rank1")) for h in hosts)
    modules = {r["module"] for r in got if r["kind"] == "graph_execution_trace"}
    assert {"0", "2"} <= modules  # the Linear layers' traces carry their module path


def test_partitions_are_one_hive_directory_per_rank(ranks):
    logdir, out = ranks
    run = Logdir(str(logdir)).run("job")
    run.update()
    files = sorted(os.path.relpath(os.path.join(d, f), str(out))
                   for d, _, names in os.walk(str(out)) for f in names)
    assert files == ["host=%s/part-0.parquet" % h for h in run.hosts]


def test_duckdb_finds_the_first_nonfinite_across_ranks_as_the_analysis_does(ranks):
    duckdb = pytest.importorskip("duckdb")
    logdir, out = ranks
    ((host, step, kind, index, op_type, module, _),) = duckdb.sql(
        FIRST_ACROSS_RANKS.format(out=out)).fetchall()
    assert host.endswith(".rank1") and step == 1  # rank 1 went bad first, at its step 1
    assert op_type == "aten.log.default" and kind == "execution"  # outside the model: eager
    assert module is None  # executions carry no op name, hence no module path
    run = Logdir(str(logdir)).run("job")
    run.update()
    first = analyze_run(run)["first_bad_tensor"]
    assert (first["host"], first["kind"], first["index"], first["step"]) == (
        host, kind, index, step)
    # One query per rank: each rank's first non-finite step.
    per_rank = duckdb.sql("""
        SELECT host, min(step) FROM read_parquet('{out}/**/*.parquet', hive_partitioning = true)
        WHERE alert = 'InfNan' GROUP BY host ORDER BY host""".format(out=out)).fetchall()
    assert [s for _, s in per_rank] == [2, 1]


@pytest.mark.parametrize("mode", ["FULL_HEALTH", "CONCISE_HEALTH", "CURT_HEALTH", "SHAPE",
                                  "NO_TENSOR", "FULL_TENSOR"])
def test_tf_written_dumps_export_their_digests_in_every_mode(tf_dumps, tmp_path, mode):
    pytest.importorskip("pyarrow")
    logdir = os.path.join(tf_dumps, mode)
    assert cli.main(["export", logdir, str(tmp_path / "out")]) == 0
    got = _assert_rows_are_the_digests(logdir, tmp_path / "out", ".")
    if mode in ("FULL_HEALTH", "CONCISE_HEALTH", "FULL_TENSOR"):
        bad = [r for r in got if r["nonfinite"]]
        assert bad and all(r["neg_inf"] or r["pos_inf"] or r["nan"] for r in bad)


def test_cli_prints_what_it_wrote_and_refuses_an_unknown_run(ranks, tmp_path, capsys):
    logdir, _ = ranks
    assert cli.main(["export", str(logdir), str(tmp_path / "o"), "--run", "job"]) == 0
    printed = capsys.readouterr().out
    assert "of 1 run into 2 files under" in printed
    assert cli.main(["export", str(logdir), str(tmp_path / "o"), "--run", "nope"]) == 2
    assert "no run 'nope'" in capsys.readouterr().err


def test_without_pyarrow_export_says_how_to_install_it(ours_dump, tmp_path):
    code = ("import sys; sys.modules['pyarrow'] = None; from tb_numerics_plugin import cli;"
            "sys.exit(cli.main(['export', %r, %r]))" % (ours_dump, str(tmp_path / "o")))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 2
    assert "pip install 'tb-numerics[export]'" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_a_gpt2_attention_mask_is_masked_and_the_query_finds_the_log(tmp_path):
    # Real model code: GPT-2's causal mask holds -inf from step 0 on, which no reader of the
    # export should take for the first bad tensor; the alert column says which rows propagate.
    duckdb = pytest.importorskip("duckdb")
    from tb_numerics_plugin.demo import trainer_demo
    from tb_numerics_plugin import torch as tbn

    dump = tmp_path / "logdir" / "gpt2"
    _, error = trainer_demo.run(str(dump), steps=4, blowup_step=3)
    tbn.disable_dump_debug_info()
    assert error is not None and error.step == 3
    out = tmp_path / "out"
    assert cli.main(["export", str(tmp_path / "logdir"), str(out)]) == 0
    rows = duckdb.sql("""
        SELECT alert, min(step), count(*)
        FROM read_parquet('{out}/**/*.parquet', hive_partitioning = true)
        WHERE nonfinite GROUP BY alert ORDER BY alert""".format(out=out)).fetchall()
    assert [(a, s) for a, s, _ in rows] == [("InfNan", 3), ("MaskedNonFinite", 0)]
    ((_, step, kind, index, op_type, _, _),) = duckdb.sql(
        FIRST_ACROSS_RANKS.format(out=out)).fetchall()
    run = Logdir(str(tmp_path / "logdir")).run("gpt2")
    run.update()
    first = analyze_run(run)["first_bad_tensor"]
    assert (kind, index, op_type, step) == (first["kind"], first["index"], "aten.log.default", 3)
