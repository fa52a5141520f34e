"""The transformers ``NumericsCallback`` on a real ``Trainer`` (tiny GPT-2, CPU).

The run is the Trainer demo: a temperature bug at step 3 makes
``torch.log(softmax)`` return -inf and the loss +inf.
"""

import contextlib
import inspect
import io
import os
import subprocess
import sys

import pytest

from tb_numerics_plugin import cli
from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.demo import trainer_demo
from tb_numerics_plugin.integrations.transformers import NumericsCallback
from tb_numerics_plugin.reader import Logdir
from dumps import read_run as read

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOWUP = 3
STEPS = 6


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """(dump, trainer, error, stderr) of the demo run that blows up at step 3."""
    dump = tmp_path_factory.mktemp("hf_nan") / "dump"
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        trainer, error = trainer_demo.run(str(dump), steps=STEPS, blowup_step=BLOWUP)
    tbn.disable_dump_debug_info()  # whatever the run left active, never leak it into others
    return dump, trainer, error, stderr.getvalue()


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    """(dump, trainer, error) of the demo run without the bug."""
    dump = tmp_path_factory.mktemp("hf_ok") / "dump"
    trainer, error = trainer_demo.run(str(dump), steps=STEPS, blowup_step=None)
    tbn.disable_dump_debug_info()
    return dump, trainer, error


def test_nan_step_raises_nonfinite_error_out_of_train_at_that_step(stopped):
    _, trainer, error, _ = stopped
    assert isinstance(error, tbn.NonFiniteError)
    assert isinstance(error, RuntimeError)
    assert error.step == BLOWUP
    assert trainer.state.global_step == BLOWUP  # the bad step's optimizer step never ran


def test_stopped_dump_has_steps_up_to_the_bad_one(stopped):
    dump = stopped[0]
    assert read(dump).steps() == list(range(BLOWUP + 1))


def test_first_bad_tensor_is_the_log_at_the_bad_step_and_line(stopped):
    dump, _, error, _ = stopped
    first = analyze_run(read(dump))["first_bad_tensor"]
    assert first["op_type"] == "aten.log.default"
    assert first["step"] == BLOWUP
    assert first["health"]["neg_inf"] > 0
    (inp,) = first["inputs"]
    assert inp["op_type"] == "aten._softmax.default" and inp["health"]["zero"] > 0
    lines, start = inspect.getsourcelines(trainer_demo.ToyLM.forward)
    line = start + next(k for k, text in enumerate(lines) if "torch.log(probs)" in text)
    assert first["source"]["line"] == line
    assert error.report["first_bad_tensor"]["op_type"] == "aten.log.default"


def test_stopped_run_keeps_numerics_over_time_up_to_the_bad_step(stopped):
    # trends=True is the callback's default: every step summarized, the loss (the first value of
    # the model's output) non-finite at the bad step only, a gradient for every Linear-like layer.
    run = read(stopped[0])
    (host,) = run.hosts
    with run.lock:
        trends = run.trends(host)
        assert trends.kinds() == ["output", "grad"]
        steps, modules, nonfinite = trends.table("output", "nonfinite")
        assert steps.tolist() == list(range(BLOWUP + 1))
        assert {"ToyLM", "transformer", "transformer.h.0.attn", "lm_head"} <= set(modules)
        root = nonfinite[modules.index("ToyLM")]
        assert root[:BLOWUP].tolist() == [0] * BLOWUP and root[BLOWUP] > 0
        _, grad_modules, _ = trends.table("grad", "abs_max")
        assert "transformer.h.1.mlp.c_fc" in grad_modules
        assert trends.dtype("output", "lm_head") == "float32"


def test_first_bad_tensor_story_goes_to_stderr(stopped):
    stderr = stopped[3]
    assert "aten.log" in stderr and "torch.log(probs)" in stderr


def test_stopped_run_leaves_a_closed_readable_dump(stopped):
    run = read(stopped[0])
    report = analyze_run(run)
    assert not report["incomplete"]
    assert [w["state"] for w in report["writers"].values()] == ["closed"]


def test_healthy_run_finishes_and_its_dump_passes_the_check(healthy, capsys):
    dump, trainer, error = healthy
    assert error is None and trainer.state.global_step == STEPS
    assert read(dump).steps() == list(range(STEPS))
    assert cli.main(["report", str(dump), "--check"]) == 0
    assert "no inf or NaN found" in capsys.readouterr().out


def test_a_compiled_models_training_is_traced_inside_its_graphs_and_stops_at_the_bad_step(
        tmp_path):
    dump = tmp_path / "dump"
    _, error = trainer_demo.run(str(dump), steps=STEPS, blowup_step=BLOWUP, torch_compile=True)
    tbn.disable_dump_debug_info()
    assert error is not None and error.step == BLOWUP
    run = read(dump)
    first = analyze_run(run)["first_bad_tensor"]
    # the compiled graph's torch-level op (eager capture names aten.log.default)
    assert (first["op_type"], first["op_name"], first["step"]) == ("log", "ToyLM/log_0", BLOWUP)
    assert "torch.log(probs)" in first["source"]["code"]
    assert first["source"]["file"] == inspect.getsourcefile(trainer_demo)
    forwards = [run.execution(i) for i in range(run.num_executions())
                if run.execution(i)["op_type"] == "ToyLM.forward"]
    assert [e["step"] for e in forwards] == list(range(BLOWUP + 1))


def test_trace_steps_keeps_traces_of_the_window_steps_only(tmp_path):
    dump = tmp_path / "dump"
    _, error = trainer_demo.run(str(dump), steps=5, blowup_step=None, trace_steps=[1, 3])
    assert error is None
    run = read(dump)
    traced = {d["step"] for d in run.graph_execution_trace_digests(0, -1)}
    assert traced == {1, 3}


def test_demo_command_reports_the_stop_and_exits_1(tmp_path):
    dump = tmp_path / "dump"
    proc = subprocess.run(
        [sys.executable, "-m", "tb_numerics_plugin.demo.trainer_demo", "--dump_dir", str(dump),
         "--steps", "5", "--blowup_step", "2"],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
        env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "training stopped at step 2" in proc.stdout
    report = subprocess.run([sys.executable, "-m", "tb_numerics_plugin", "report", str(dump)],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert "aten.log.default" in report.stdout


@pytest.mark.parametrize("kwargs, name", [
    ({"dump_root": ""}, "dump_root"),
    ({"dump_root": "d", "tensor_debug_mode": "BOGUS"}, "tensor_debug_mode"),
    ({"dump_root": "d", "stop_on_nonfinite": "yes"}, "stop_on_nonfinite"),
    ({"dump_root": "d", "circular_buffer_size": 1.5}, "circular_buffer_size"),
    ({"dump_root": "d", "trace_steps": "every:0"}, "trace_steps"),
    ({"dump_root": "d", "trends": 0}, "trends"),
])
def test_bad_arguments_are_refused_naming_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        NumericsCallback(**kwargs)


def test_importing_the_callback_imports_neither_tensorflow_nor_the_root_torch():
    code = ("import sys, tb_numerics_plugin.integrations as i;"
            "assert 'torch' not in sys.modules and 'tensorflow' not in sys.modules, 'root';"
            "import tb_numerics_plugin.integrations.transformers;"
            "assert 'tensorflow' not in sys.modules, 'transformers'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_two_trainings_into_one_dump_root_read_as_one_run_holding_both(tmp_path):
    dump = tmp_path / "dump"
    trainer_demo.run(str(dump), steps=2, blowup_step=None)
    once = read(dump)
    first_count = once.num_executions()
    trainer_demo.run(str(dump), steps=2, blowup_step=None)
    twice = read(dump)
    assert len(Logdir(str(dump)).runs()) == 1 and len(twice.hosts) == 1
    assert twice.num_executions() == 2 * first_count
