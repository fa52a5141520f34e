"""The Lightning ``NumericsCallback`` on a real ``Trainer.fit`` (tiny MLP, CPU).

The module's loss takes ``torch.log(softmax(logits / temperature))``; at step
3 the temperature drops to 1e-4, the softmax saturates and the log gives -inf.
"""

import inspect
import os
import subprocess
import sys

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from tb_numerics_plugin import cli
from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.integrations.lightning import NumericsCallback
from dumps import read_run as read

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOWUP = 3
STEPS = 6


class Classifier(pl.LightningModule):
    """An 8-16-4 MLP; ``blowup_step`` (or None) is the step whose temperature is 1e-4."""

    def __init__(self, blowup_step):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.blowup_step = blowup_step
        self.steps_run = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.steps_run.append(self.global_step)
        temperature = 1e-4 if self.global_step == self.blowup_step else 1.0
        probs = torch.softmax(self(x) / temperature, dim=1)
        log_probs = torch.log(probs)  # log(0) = -inf at the bad step
        return -log_probs.gather(1, y[:, None]).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(dump, blowup_step, **callback_kwargs):
    """Fits under the callback; returns (trainer, callback, the exception or None)."""
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
    callback = NumericsCallback(str(dump), **callback_kwargs)
    trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[callback])
    error = None
    trainer.module = Classifier(blowup_step)
    try:
        trainer.fit(trainer.module, torch.utils.data.DataLoader(data, batch_size=8))
    except tbn.NonFiniteError as e:
        error = e
    finally:
        tbn.disable_dump_debug_info()  # never leak an active capture into other tests
    return trainer, callback, error


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    dump = tmp_path_factory.mktemp("pl_nan") / "dump"
    return (dump,) + fit(dump, BLOWUP)


def test_nan_step_raises_nonfinite_error_out_of_fit_at_that_step(stopped):
    _, trainer, _, error = stopped
    assert isinstance(error, tbn.NonFiniteError)
    assert error.step == BLOWUP
    # the bad step's optimizer update may run (Lightning steps the optimizer
    # around the training step); no later training step does
    assert trainer.module.steps_run == list(range(BLOWUP + 1))


def test_stopped_dump_has_steps_up_to_the_bad_one_and_names_the_log(stopped):
    run = read(stopped[0])
    assert run.steps() == list(range(BLOWUP + 1))
    first = analyze_run(run)["first_bad_tensor"]
    assert first["op_type"] == "aten.log.default" and first["step"] == BLOWUP
    lines, start = inspect.getsourcelines(Classifier.training_step)
    line = start + next(k for k, text in enumerate(lines) if "torch.log(probs)" in text)
    assert first["source"]["line"] == line


def test_stopped_fit_keeps_numerics_over_time_up_to_the_bad_step(stopped):
    # Lightning calls the LightningModule itself only through training_step: the summarized
    # modules are the Classifier's net and its layers, every step up to the bad one.
    run = read(stopped[0])
    (host,) = run.hosts
    with run.lock:
        trends = run.trends(host)
        steps, modules, abs_max = trends.table("output", "abs_max")
        assert steps.tolist() == list(range(BLOWUP + 1))
        assert {"net", "net.0", "net.1", "net.2"} <= set(modules)
        assert (abs_max[modules.index("net.2")] > 0).all()
        grad_steps, grad_modules, _ = trends.table("grad", "abs_max")
        assert "net.0" in grad_modules and grad_steps.tolist()[0] == 0


def test_trends_false_leaves_no_series(tmp_path):
    _, _, error = fit(tmp_path / "dump", None, trends=False)
    assert error is None
    assert not [n for n in os.listdir(tmp_path / "dump") if n.endswith(".numerics.tfevents")]


def test_on_exception_closes_the_dump(stopped):
    dump, _, callback, _ = stopped
    assert callback.handle is None
    report = analyze_run(read(dump))
    assert [w["state"] for w in report["writers"].values()] == ["closed"]
    assert not report["incomplete"]


def test_healthy_fit_finishes_and_its_dump_passes_the_check(tmp_path, capsys):
    trainer, callback, error = fit(tmp_path / "dump", None)
    assert error is None and trainer.global_step == STEPS and callback.handle is None
    assert read(tmp_path / "dump").steps() == list(range(STEPS))
    assert cli.main(["report", str(tmp_path / "dump"), "--check"]) == 0
    assert "no inf or NaN found" in capsys.readouterr().out


def test_bad_tensor_debug_mode_is_refused_naming_the_parameter():
    with pytest.raises(ValueError, match="tensor_debug_mode"):
        NumericsCallback("d", tensor_debug_mode="full")


def test_importing_the_callback_does_not_import_tensorflow():
    code = ("import sys, tb_numerics_plugin.integrations.lightning;"
            "assert 'tensorflow' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-2000:]
