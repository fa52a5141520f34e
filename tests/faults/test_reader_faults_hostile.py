"""Hostile records and files: the reader skips or neutralises each with a warning naming file and
offset, loses nothing after it, and neither the reader's API nor `tb-numerics report` ever raises.

The cases of tests/faults/hostile.py are checked one by one; hypothesis then mutates the records of
a real torch capture (bit flips, cuts, random field values through protobuf) and runs each result
through the public API and the CLI.
"""

import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faults import hostile
from tb_numerics_plugin import cli, records
from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.filenames import SUFFIXES
from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.reader import Logdir

DOCUMENTED_CHECK_CODES = {0, 1, 3, 5}


def sweep(run):
    """Every public query of every host, every item served; returns the items served."""
    run.update()
    assert isinstance(run.warnings, list) and run.tensor_debug_mode
    served = 0
    for h in run.hosts:
        n = run.num_executions(h)
        run.execution_digests(0, n, h)
        for i in range(n):
            run.execution(i, h)
            served += 1
        n = run.num_graph_execution_traces(h)
        run.graph_execution_trace_digests(0, n, h)
        for i in range(n):
            run.graph_execution_trace(i, h)
            served += 1
        run.find_graph_execution_traces(op_type="Log", name_contains="o", bad_only=True, host=h)
        run.bad_trace_indices(h)
        run.bad_execution_indices(h)
        fs = run.fileset(h)
        for graph_id, op_name in list(fs.graphs.ops):
            run.op_info(graph_id, op_name, h)
        for graph_id in run.graph_ids(h):
            run.graph_info(graph_id, h)
        for f in run.source_files(h):
            run.source_file(f["index"], h)
        run.stack_frames(list(fs.graphs.stack_frames), h)
        run.writer_status(h)
    json.dumps(analyze_run(run), allow_nan=False)
    return served


def report(root, *flags):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["report", root, *flags])
    assert "Traceback" not in err.getvalue() and code != cli.EXIT_INTERNAL, err.getvalue()
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("name", sorted(hostile.CASES))
def test_hostile_case_is_reported_and_loses_nothing_else(name, tmp_path):
    root = hostile.base_dump(str(tmp_path / "d"), bad_from=None)
    case = hostile.CASES[name](root)
    run = Logdir(root).run(".")
    sweep(run)
    if case.kind != "file":
        where = "" if case.offset is None else "offset %d" % case.offset
        assert any(case.path in w and where in w for w in run.warnings), run.warnings
        assert run.incomplete
    if case.sentinel:
        assert hostile.sentinel_present(run, case.sentinel)
    if case.kind in ("mode", "counts", "shape", "size", "wall", "kind", "utf8", "length"):
        assert run.num_graph_execution_traces() >= 10  # the ten good traces are all there
    code, _, _ = report(root, "--check")
    assert code == (0 if case.kind == "file" else cli.EXIT_INCOMPLETE)
    code, out, _ = report(root, "--json")
    assert code == 0 and json.loads(out)["runs"]


def test_huge_counts_and_shapes_size_nothing(tmp_path):
    root = hostile.base_dump(str(tmp_path / "d"))
    for name in ("op_num_outputs_huge", "trace_full_tensor_huge_shape",
                 "trace_full_tensor_huge_shape_no_values", "trace_too_many_values"):
        hostile.CASES[name](root)
    run = Logdir(root).run(".")
    sweep(run)
    fs = run.fileset()
    assert fs.traces.cols["values"].shape[1] <= 32
    info = run.op_info(hostile.dumps.GRAPH_ID, "hostile_op")
    assert info["num_outputs"] == 0 and len(info["consumers"]) <= 1


_PROGRAM = textwrap.dedent("""
    import sys
    import torch
    from torch import nn
    from tb_numerics_plugin import torch as tbn

    model = nn.Sequential(nn.Linear(4, 3), nn.Softmax(-1))
    handle = tbn.enable_dump_debug_info(sys.argv[1], tensor_debug_mode=sys.argv[2],
                                        circular_buffer_size=-1)
    for _ in range(2):
        probs = model(torch.ones(2, 4)) * torch.tensor([1.0, 0.0, 1.0])
        loss = torch.log(probs).sum()
        loss.backward()
    handle.close()
""")


@pytest.fixture(scope="module")
def torch_dump(tmp_path_factory):
    """A real torch capture (FULL_HEALTH, log of a zero) whose records the fuzzer mutates."""
    pytest.importorskip("torch")
    base = tmp_path_factory.mktemp("torch_dump")
    program = base / "program.py"
    program.write_text(_PROGRAM)
    root = str(base / "dump")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    subprocess.run([sys.executable, str(program), root, "FULL_HEALTH"], check=True, env=env,
                   timeout=300)
    return root


def _framed(path):
    with open(path, "rb") as f:
        data = f.read()
    return data, records.scan_buffer(data, 0, path).records


_INTS = st.one_of(st.sampled_from([-1, 0, 1, 9, 1000, 2 ** 31 - 1, -2 ** 31, 2 ** 63 - 1,
                                   -2 ** 63]), st.integers(-2 ** 63, 2 ** 63 - 1))
_FLOATS = st.one_of(st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e300, -0.0]),
                    st.floats(allow_nan=True, allow_infinity=True))
_TEXT = st.one_of(st.sampled_from(["", "\x1b[2J", "a" * 5000, "\u202e", "x:99999999999"]),
                  st.text(max_size=40))


def _mutate_field(message, draw):
    """Sets one random scalar field, at any depth, of ``message`` to a hostile value."""
    fields = []

    def repeated(f):
        flag = getattr(f, "is_repeated", None)  # protobuf >= 6; `label` before
        return flag if flag is not None else f.label == f.LABEL_REPEATED

    def collect(m):
        for f in m.DESCRIPTOR.fields:
            if f.message_type is not None:
                if not repeated(f):
                    fields.append((m, f))
                    collect(getattr(m, f.name))
                elif len(getattr(m, f.name)):
                    collect(getattr(m, f.name)[0])
            else:
                fields.append((m, f))

    collect(message)
    m, f = fields[draw(st.integers(0, len(fields) - 1))]
    if f.message_type is not None:
        getattr(m, f.name).Clear()
        return
    t = f.type
    if t in (f.TYPE_DOUBLE, f.TYPE_FLOAT):
        value = draw(_FLOATS)
    elif t == f.TYPE_STRING:
        value = draw(_TEXT)
    elif t == f.TYPE_BYTES:
        value = draw(st.binary(max_size=64))
    elif t == f.TYPE_BOOL:
        value = draw(st.booleans())
    elif t == f.TYPE_ENUM:
        value = draw(st.integers(-2 ** 31, 2 ** 31 - 1))
    else:
        bits = 32 if t in (f.TYPE_INT32, f.TYPE_SINT32, f.TYPE_SFIXED32, f.TYPE_UINT32,
                           f.TYPE_FIXED32) else 64
        unsigned = t in (f.TYPE_UINT32, f.TYPE_UINT64, f.TYPE_FIXED32, f.TYPE_FIXED64)
        lo, hi = (0, 2 ** bits - 1) if unsigned else (-2 ** (bits - 1), 2 ** (bits - 1) - 1)
        value = max(lo, min(hi, draw(_INTS)))
    if repeated(f):
        getattr(m, f.name).append(value)
    else:
        setattr(m, f.name, value)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_records_of_a_real_capture_never_raise(torch_dump, tmp_path_factory, data):
    root = str(tmp_path_factory.mktemp("fuzz") / "d")
    shutil.copytree(torch_dump, root)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        suffix = data.draw(st.sampled_from(SUFFIXES), label="file")
        path = hostile.file_of(root, suffix)
        whole, recs = _framed(path)
        kind = data.draw(st.sampled_from(["flip", "cut", "field"]), label="kind")
        if kind == "flip" and whole:
            buf = bytearray(whole)
            for _ in range(data.draw(st.integers(1, 8))):
                buf[data.draw(st.integers(0, len(buf) - 1))] ^= 1 << data.draw(st.integers(0, 7))
            whole = bytes(buf)
        elif kind == "cut":
            whole = whole[:data.draw(st.integers(0, len(whole)))]
        elif kind == "field" and recs:
            offset, payload = recs[data.draw(st.integers(0, len(recs) - 1))]
            event = debug_event_pb2.DebugEvent.FromString(payload)
            _mutate_field(event, data.draw)
            framed = records.encode(event.SerializeToString())
            end = offset + records.HEADER_SIZE + len(payload) + records.FOOTER_SIZE
            whole = whole[:offset] + framed + whole[end:]
        with open(path, "wb") as f:
            f.write(whole)
    sweep(Logdir(root).run("."))
    for flags in ([], ["--json"], ["--check"]):
        code, out, _ = report(root, *flags)
        if flags == ["--check"]:
            assert code in DOCUMENTED_CHECK_CODES
        else:
            assert code == 0
        if flags == ["--json"]:
            json.loads(out)


def test_every_single_byte_flip_of_a_trace_file_is_survived(torch_dump, tmp_path):
    root = str(tmp_path / "d")
    shutil.copytree(torch_dump, root)
    path = hostile.file_of(root, "graph_execution_traces")
    with open(path, "rb") as f:
        whole = f.read()
    good = len(records.scan_buffer(whole, 0, path).records)
    rng = random.Random(0)
    for pos in rng.sample(range(len(whole)), 40):
        with open(path, "wb") as f:
            f.write(whole[:pos] + bytes([whole[pos] ^ 0xFF]) + whole[pos + 1:])
        run = Logdir(root).run(".")
        sweep(run)
        # One record at most is lost to one flipped byte, and it is said.
        assert run.num_graph_execution_traces() >= good - 1
        if run.num_graph_execution_traces() < good:
            assert any(path in w for w in run.warnings)
