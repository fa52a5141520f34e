"""The one vocabulary (tb_numerics_plugin.schema): every surface speaks it the same way."""

import torch

from tb_numerics_plugin import cli, schema
from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.analysis import alerts, analyze_run
from tb_numerics_plugin.analysis import health as health_lib
from tb_numerics_plugin.reader import Logdir
from tb_numerics_plugin.torch import health as torch_health
from tb_numerics_plugin.torch import stacks


def test_counts_phrase_names_only_the_nonzero_counts():
    full = health_lib.decode("FULL_HEALTH", [0, -1, 19, 1, 12, 2, 0, 1, 3, 4, 2])
    assert schema.counts_phrase(full) == "2 -inf, 1 NaN of 12 elements"
    concise = health_lib.decode("CONCISE_HEALTH", [0, 5, 0, 5, 0])
    assert schema.counts_phrase(concise) == "5 +inf of 5 elements"
    curt = health_lib.decode("CURT_HEALTH", [0, 1])
    assert schema.counts_phrase(curt) == "inf or NaN (CURT_HEALTH records no counts)"


def test_torch_dtype_numbers_are_the_schema_numbers():
    for dtype, enum in torch_health.DTYPE_ENUM.items():
        assert schema.dtype_name(enum) == str(dtype).replace("torch.", "")
    for dtype in torch_health.HEALTH_DTYPES:
        assert schema.dtype_name(torch_health.DTYPE_ENUM[dtype]) in schema.DTYPE_MAX


def test_capture_keeps_exactly_the_frames_the_reader_calls_model_or_user():
    paths = {
        "/usr/lib/python3.11/site-packages/tensorflow/python/ops/math_ops.py": True,
        "/opt/venv/lib/python3.12/dist-packages/numpy/core/fromnumeric.py": True,
        "/usr/lib/python3.11/contextlib.py": True,
        "<frozen importlib._bootstrap>": True,
        torch.nn.functional.__file__: True,
        stacks.__file__: True,
        "/opt/venv/lib/python3.12/site-packages/transformers/models/t5/modeling_t5.py": False,
        "/home/me/project/train.py": False,
    }
    for path, framework in paths.items():
        assert stacks.is_framework_file(path) is framework, path
        assert (schema.frame_kind(path) == schema.FRAMEWORK) is framework, path
    assert schema.frame_kind("/x/site-packages/transformers/a.py") == schema.MODEL


def test_alert_report_and_cli_say_the_same_counts(tmp_path, capsys):
    probs = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1):
        loss = -torch.log(probs).sum()
    assert torch.isinf(loss)
    run = Logdir(str(tmp_path)).run(".")
    run.update()
    _, (alert,) = alerts.list_alerts(run, alert_type="InfNan", begin=0, end=1)
    phrase = schema.counts_phrase(alert["health"])
    assert phrase == "3 -inf of 6 elements"
    assert alert["message"].endswith(phrase)
    assert phrase in analyze_run(run)["first_bad_tensor"]["explanation"]
    assert cli.main(["report", "--check", str(tmp_path)]) == 1
    assert phrase in capsys.readouterr().out
