"""Ranks of a run indexed in worker processes (``RunReader.update(workers=...)``): the same
index, warnings and analysis as reading them one after the other, on a real three-rank torch
job and on three ranks our writer wrote (the lowest-versions job, without torch), one rank of
each damaged.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import dumps
from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.reader import parallel as parallel_lib
from tb_numerics_plugin.reader.run import RunReader
from test_export import PROGRAM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _torch_job(root):
    """Three ranks of a real torch program, run in the order 1, 0, 2 (bad at steps 1, 2 and
    3): the first bad tensor by wall time is rank 1's, not the first host's."""
    pytest.importorskip("torch")
    script = root / "rank.py"
    script.write_text(PROGRAM)
    run_dir = root / "job"
    for rank, bad_step in ((1, 1), (0, 2), (2, 3)):
        env = dict(os.environ, RANK=str(rank), PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
        proc = subprocess.run([sys.executable, str(script), str(run_dir), str(bad_step)],
                              capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def _written_job(root):
    """Three ranks written by our FileSetWriter (no torch: the lowest-versions job runs it):
    rank 1's clock starts first, so its first bad trace is the earliest."""
    run_dir = root / "job"
    for rank, t0 in ((0, 2000.0), (1, 1000.0), (2, 3000.0)):
        dumps.write_dump(str(run_dir), steps=6, bad_from=2, part="rank%d" % rank, t0=t0)
    return run_dir


@pytest.fixture(scope="module", params=["torch", "written"])
def job(request, tmp_path_factory):
    """A run of three ranks whose first bad tensor by wall time is rank 1's; rank 2's trace
    file has a flipped byte."""
    root = tmp_path_factory.mktemp("parallel")
    run_dir = _torch_job(root) if request.param == "torch" else _written_job(root)
    (traces,) = [p for p in run_dir.iterdir()
                 if ".rank2." in p.name and p.name.endswith("graph_execution_traces")]
    dumps.flip_byte(str(traces), dumps.record_offsets(str(traces))[5] + 20)
    return str(run_dir)


TRACE_COLUMNS = ("offset", "wall_time", "key", "values", "nvals", "step")
EXECUTION_COLUMNS = ("offset", "wall_time", "op_type", "graph_id", "mode", "values", "nvals",
                     "out_begin", "out_end", "in_begin", "in_end", "step")


def _assert_same_index(a, b):
    """Every column of every host's tables, the keys, graphs, digests and warnings agree."""
    assert a.hosts == b.hosts and sorted(a.warnings) == sorted(b.warnings)
    for host in a.hosts:
        fa, fb = a.fileset(host), b.fileset(host)
        for table, columns in (("traces", TRACE_COLUMNS), ("executions", EXECUTION_COLUMNS)):
            for col in columns:
                np.testing.assert_array_equal(getattr(fa, table).cols[col],
                                              getattr(fb, table).cols[col], err_msg=col)
        np.testing.assert_array_equal(fa.executions.outputs["id"], fb.executions.outputs["id"])
        assert fa.traces.keys.op_name == fb.traces.keys.op_name
        assert sorted(a.graph_ids(host)) == sorted(b.graph_ids(host))
        assert (a.graph_execution_trace_digests(0, None, host)
                == b.graph_execution_trace_digests(0, None, host))
        assert a.execution_digests(0, None, host) == b.execution_digests(0, None, host)


def test_workers_index_the_ranks_exactly_as_one_process_does(job, monkeypatch):
    monkeypatch.setattr(parallel_lib, "PARALLEL_MIN_BYTES", 0)  # the job is small: force workers
    indexed = []

    def spy(fs, real=parallel_lib._index_elsewhere):
        result = real(fs)
        indexed.append(result is not None and result[0].label)
        return result

    monkeypatch.setattr(parallel_lib, "_index_elsewhere", spy)
    seen = []
    parallel = RunReader(job, "job")
    assert parallel.update(progress=lambda host, done, total: seen.append(host), workers=2)
    serial = RunReader(job, "job")
    assert serial.update(workers=1)
    assert len(parallel.hosts) == 3
    # two groups on two workers: this process kept one share, a child indexed the other
    assert indexed and all(indexed) and len(indexed) < 3
    assert sorted(set(seen)) == parallel.hosts  # each worker-read host reported once done
    _assert_same_index(parallel, serial)
    assert any(".rank2" in w and "offset" in w for w in parallel.warnings)  # the flipped byte
    first, again = analyze_run(parallel), analyze_run(serial)
    assert first["first_bad_tensor"] == again["first_bad_tensor"]
    assert first["first_bad_tensor"]["host"].endswith(".rank1")  # merged across ranks by time


def test_a_worker_read_run_keeps_reading_incrementally_in_process(job, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setattr(parallel_lib, "PARALLEL_MIN_BYTES", 0)
    copy = tmp_path / "job"
    shutil.copytree(job, copy)
    run = RunReader(str(copy), "job")
    run.update(workers=2)
    host = [h for h in run.hosts if h.endswith(".rank0")][0]
    before = run.num_graph_execution_traces(host)
    (traces,) = [p for p in copy.iterdir()
                 if ".rank0." in p.name and p.name.endswith("graph_execution_traces")]
    dumps.append_record(str(traces), dumps.trace_payload("mul", dumps.MUL_BAD, 5000.0))
    assert run.update(workers=2) is True  # one small file set: read in this process
    assert run.num_graph_execution_traces(host) == before + 1


def test_below_the_size_threshold_no_worker_starts(job, monkeypatch):
    def refuse(fs):
        raise AssertionError("a worker was started for %s" % fs.label)

    monkeypatch.setattr(parallel_lib, "_index_elsewhere", refuse)
    run = RunReader(job, "job")
    assert run.update(workers=2)
    assert len(run.hosts) == 3


def test_workers_that_cannot_start_leave_the_reading_to_this_process(job, monkeypatch):
    monkeypatch.setattr(parallel_lib, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(parallel_lib.sys, "executable", "/bin/false")  # every child exits 1
    run = RunReader(job, "job")
    assert run.update(workers=2)
    serial = RunReader(job, "job")
    serial.update(workers=1)
    _assert_same_index(run, serial)
