"""Logdirs on object storage: a real S3-compatible server (moto's server mode, a separate
process on loopback) holding real dumps, read by `tb-numerics report`, `export` and the plugin
(through TensorBoard's WSGI app), including a dump that grows and one rewritten in place.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tb_numerics_plugin import cli
from tb_numerics_plugin.reader import Logdir
from tb_numerics_plugin.reader import remote

s3fs = pytest.importorskip("s3fs")
from processes import free_port, stop, wait_for_port  # noqa: E402
from test_plugin_helpers import get, make_client  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "demo_logdir")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """An S3FileSystem on a moto server started for this module; AWS_* point every client
    (ours included) at it."""
    server = shutil.which("moto_server", path=os.path.dirname(sys.executable))
    if server is None:
        pytest.skip("moto's server is not installed")
    port = free_port()
    log = open(str(tmp_path_factory.mktemp("moto") / "moto.log"), "w")
    proc = subprocess.Popen([server, "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                            stderr=subprocess.STDOUT)
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
                                            "TB_NUMERICS_MIRROR")}
    try:
        wait_for_port(port)
        os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
                          AWS_DEFAULT_REGION="us-east-1",
                          AWS_ENDPOINT_URL="http://127.0.0.1:%d" % port,
                          TB_NUMERICS_MIRROR=str(tmp_path_factory.mktemp("mirrors")))
        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem()
        fs.mkdir("dumps")
        yield fs
    finally:
        stop(proc)
        log.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        s3fs.S3FileSystem.clear_instance_cache()


def _upload(fs, local_dir, key):
    fs.put(local_dir, "dumps/" + key, recursive=True)
    return "s3://dumps/" + key


def _without_paths(report):
    """The report JSON without what names local files (warnings, the mirror's paths)."""
    for run in report["runs"]:
        run.pop("warnings", None)
    return report


def test_report_of_an_s3_logdir_equals_the_report_of_the_same_local_logdir(s3, capsys):
    url = _upload(s3, DEMO, "demo")
    assert cli.main(["report", "--json", DEMO]) == 0
    local = json.loads(capsys.readouterr().out)
    assert cli.main(["report", "--json", url]) == 0
    remote_report = json.loads(capsys.readouterr().out)
    assert _without_paths(remote_report) == _without_paths(local)
    assert [r["run"] for r in remote_report["runs"]] == ["tf_mnist", "torch_mnist",
                                                         "trainer_gpt2"]
    assert cli.main(["report", url, "--run", "trainer_gpt2"]) == 0
    assert "tb-numerics report: %s" % url in capsys.readouterr().out


def _cut_dump(src, dst, fraction):
    """A copy of the file set in ``src`` whose trace file holds its first ``fraction`` of
    bytes (cut mid-record, as a writer's flush may leave it)."""
    shutil.copytree(src, dst)
    (traces,) = [p for p in os.listdir(dst) if p.endswith("graph_execution_traces")]
    path = os.path.join(dst, traces)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: int(len(data) * fraction)])
    return path, data


def test_the_plugin_serves_an_s3_dump_that_grows_fetching_only_what_was_appended(s3, tmp_path):
    src = os.path.join(DEMO, "torch_mnist")
    staged = str(tmp_path / "stage" / "torch_mnist")
    traces, full = _cut_dump(src, staged, 0.5)
    url = _upload(s3, str(tmp_path / "stage"), "growing")
    client = make_client(url)
    status, body = get(client, "runs")
    assert status == 200
    (run,) = body["runs"]
    first = run["num_graph_execution_traces"]
    expected = Logdir(DEMO).run("torch_mnist")
    expected.update()
    assert 0 < first < expected.num_graph_execution_traces()

    with open(traces, "wb") as f:  # the writer appends the rest
        f.write(full)
    s3.put(traces, "dumps/growing/torch_mnist/" + os.path.basename(traces))
    time.sleep(1.1)  # the plugin's update interval
    status, body = get(client, "runs")
    (run,) = body["runs"]
    assert run["num_graph_execution_traces"] == expected.num_graph_execution_traces()
    status, summary = get(client, "summary", run="torch_mnist")
    assert summary["first_bad_tensor"]["op_type"] == "aten.log.default"

    # What a sync fetches: only the bytes past the mirror's, with a range request.
    mirror = remote.Mirror(url, cache_dir=str(tmp_path / "m"))
    assert mirror.sync() == sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src))
    with open(traces, "ab") as f:
        f.write(b"\0" * 100)  # a half-written record
    s3.put(traces, "dumps/growing/torch_mnist/" + os.path.basename(traces))
    assert mirror.sync() == 100  # the writer status did not change: not fetched again
    assert mirror.sync() == 0


def test_a_file_rewritten_in_place_is_fetched_whole_and_read_again(s3, tmp_path):
    stage = tmp_path / "stage"
    traces, full = _cut_dump(os.path.join(DEMO, "torch_mnist"), str(stage / "run"), 1.0)
    url = _upload(s3, str(stage), "ring")
    logdir = Logdir(url)
    (name,) = logdir.runs()
    run = logdir.run(name)
    run.update()
    before = run.num_graph_execution_traces()
    # A circular buffer's flush: the same file, rewritten with its oldest records dropped.
    from tb_numerics_plugin import records

    offsets = [o for o, _ in records.scan(traces).records]
    with open(traces, "wb") as f:
        f.write(full[offsets[10]:])
    s3.put(traces, "dumps/ring/run/" + os.path.basename(traces))
    assert run.update() is True
    assert run.num_graph_execution_traces() == before - 10


def test_export_reads_an_s3_logdir(s3, tmp_path):
    pytest.importorskip("pyarrow")
    url = _upload(s3, os.path.join(DEMO, "tf_mnist"), "export/tf_mnist")
    assert cli.main(["export", url.rsplit("/", 1)[0], str(tmp_path / "out")]) == 0
    assert os.listdir(str(tmp_path / "out")) == ["host=vm"]


def test_a_missing_bucket_is_no_dumps_and_a_missing_fsspec_says_what_to_install(s3, capsys):
    assert cli.main(["report", "s3://no-such-bucket/logs"]) == 2
    assert "s3://no-such-bucket/logs: no tfdbg2 dumps found" in capsys.readouterr().err
    code = ("import sys; sys.modules['fsspec'] = None; from tb_numerics_plugin import cli;"
            "sys.exit(cli.main(['report', 's3://dumps/demo']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 2
    assert "pip install 'tb-numerics[remote]'" in proc.stderr
