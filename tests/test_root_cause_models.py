"""Root cause on real model code: masked vs propagating values, the first bad tensor, its line.

Each program of tests/models.py trains a tiny random-init model (nn.Transformer
layers, transformers GPT-2, T5, Llama) for a step or two on CPU under the
capture; the report is then read back like a user would: ``tb-numerics report``.
"""

import json
import os

import pytest

import models
from tb_numerics_plugin import cli

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def dump_of(tmp_path_factory):
    """``dump_of(name)``: the dump of ``models.<name>`` (each program runs once)."""
    made = {}

    def get(name):
        if name not in made:
            path = str(tmp_path_factory.mktemp(name))
            made[name] = (path, getattr(models, name)(path))
        return made[name]

    return get


def _report(capsys, path, *flags):
    code = cli.main(["report", path, "--json", *flags])
    out, err = capsys.readouterr()
    (run,) = json.loads(out)["runs"]
    return code, run, err


@pytest.mark.parametrize("name, masked", [
    ("transformer_encoder", True),  # the causal mask's -inf, made by the user at top level
    ("gpt2", False),  # transformers 5 masks with finfo.min: nothing non-finite at all
    ("t5", True),  # relative-position bucket: log(0) -inf, cast to int and masked by where
    ("amp_grad_scaler", True),  # the overflowed gradients of the steps GradScaler skipped
    ("t5_compiled", True),  # the same log(0), masked inside the compiled graph
])
def test_healthy_training_passes_the_check_and_counts_masked_values(dump_of, capsys, name,
                                                                     masked):
    path, info = dump_of(name)
    code, run, err = _report(capsys, path, "--check")
    assert code == cli.EXIT_OK, (run["alerts"], run["first_bad_tensor"])
    assert run["alerts"]["InfNan"] == 0 and run["first_bad_tensor"] is None
    assert (run["alerts"]["MaskedNonFinite"] > 0) == masked, run["alerts"]
    if name == "amp_grad_scaler":  # the skipped steps really overflowed and were skipped
        assert info["params_finite"] and info["scale"] < 2.0 ** 40


def test_t5_float16_overflow_is_found_in_its_linear_with_the_modeling_t5_line(dump_of, capsys):
    path, truth = dump_of("t5_fp16_overflow")
    code, run, _ = _report(capsys, path, "--check")
    assert code == cli.EXIT_ALERTS
    fb = run["first_bad_tensor"]
    assert fb["op_name"].startswith(truth["module"] + "/"), fb["op_name"]
    assert fb["module"] == truth["module"]
    assert fb["health"]["pos_inf"] > 0 and fb["health"]["dtype"] == "float16"
    # the model library's line, not the user's model(...) call
    assert os.path.basename(fb["source"]["file"]) == truth["file"]
    assert fb["source"]["kind"] == "model" and "self.wo(" in fb["source"]["code"]
    assert fb["user_source"]["kind"] == "user" and fb["user_source"]["file"] == models.__file__
    # T5 log(0)s happened earlier but are masked: counted apart, not the first bad tensor
    assert run["alerts"]["MaskedNonFinite"] > 0
    # the path runs from the root to what training keeps
    assert fb["path"][0]["op_name"] == fb["op_name"] and len(fb["path"]) > 2
    assert all(h["health"]["any_inf_or_nan"] for h in fb["path"])
    assert fb["sink"] == "model output"
    assert "reached the output of the top-level model call through" in fb["explanation"]


def test_llama_rms_norm_of_a_zero_row_points_at_rsqrt(dump_of, capsys):
    path, truth = dump_of("llama_rsqrt")
    code, run, _ = _report(capsys, path, "--check")
    assert code == cli.EXIT_ALERTS
    fb = run["first_bad_tensor"]
    assert fb["op_type"] == "aten.rsqrt.default" and fb["module"] == truth["module"]
    assert os.path.basename(fb["source"]["file"]) == truth["file"]
    assert "torch.rsqrt(" in fb["source"]["code"]
    # its input was finite and held the zero: the explanation says so
    assert "was finite and held 1 zeros" in fb["explanation"]


def test_compiled_llama_rsqrt_is_found_inside_the_compiled_graph(dump_of, capsys):
    path, truth = dump_of("llama_rsqrt_compiled")
    code, run, _ = _report(capsys, path, "--check")
    assert code == cli.EXIT_ALERTS
    fb = run["first_bad_tensor"]
    # the torch-level op of the compiled graph (eager capture names aten.rsqrt.default)
    assert fb["op_type"] == "rsqrt" and fb["module"] == truth["module"], fb
    assert fb["op_name"] == truth["module"] + "/rsqrt_0"
    assert os.path.basename(fb["source"]["file"]) == truth["file"]
    assert "torch.rsqrt(" in fb["source"]["code"]
    assert fb["user_source"]["file"] == models.__file__ and "model(" in fb["user_source"]["code"]
    assert "was finite and held 1 zeros" in fb["explanation"]
    assert fb["sink"] == "model output"


def test_plain_function_loss_log_is_the_eager_execution(dump_of, capsys):
    path, truth = dump_of("plain_function_loss")
    code, run, _ = _report(capsys, path, "--check")
    assert code == cli.EXIT_ALERTS
    fb = run["first_bad_tensor"]
    # the eager aten.log, not a later backward trace
    assert (fb["kind"], fb["op_type"]) == ("execution", truth["op"])
    assert fb["source"]["func"] == truth["func"] and "torch.log(probs)" in fb["source"]["code"]
    assert fb["inputs"][0]["op_type"] == "aten._softmax.default"
    assert fb["inputs"][0]["health"]["zero"] > 0
    assert [h["op_type"] for h in fb["path"][1:]] == ["aten.mul.Tensor", "aten.sum.default",
                                                      "aten.neg.default"]
    assert fb["sink"] == "never read"  # the loss: backward starts from it, nothing reads it


def test_text_report_shows_masked_count_apart_and_both_lines(dump_of, capsys):
    path, _ = dump_of("t5_fp16_overflow")
    assert cli.main(["report", path]) == cli.EXIT_OK  # no --check: 0
    out = capsys.readouterr().out
    assert "MaskedNonFinite, not an alarm" in out
    assert "modeling_t5.py" in out and "called from: %s" % models.__file__ in out


def test_check_without_health_exits_3(tmp_path, capsys):
    models.transformer_encoder(str(tmp_path), steps=1, mode="NO_TENSOR")
    code, run, err = _report(capsys, str(tmp_path), "--check")
    assert code == cli.EXIT_NO_HEALTH
    assert not run["health_available"] and "nothing to check" in err
    assert _report(capsys, str(tmp_path))[0] == cli.EXIT_OK  # without --check: 0


def test_internal_error_exits_4_not_1(ours_dump, capsys, monkeypatch):
    from tb_numerics_plugin.analysis import summary

    def broken(run):
        raise RuntimeError("boom")

    monkeypatch.setattr(summary, "first_bad_tensor", broken)
    code = cli.main(["report", ours_dump, "--check"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_INTERNAL and "internal error: RuntimeError: boom" in err
