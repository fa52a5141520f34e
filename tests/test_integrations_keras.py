"""The Keras callback around TensorFlow's own dump, on a real ``model.fit``.

TensorFlow runs only in a subprocess (this file run as a script), so pytest's
process never imports it; the dumps TF wrote are read here with our reader.
"""

import glob
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tb_numerics_plugin import cli, records, series
from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.reader import Logdir

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BATCH = 20
BAD_BATCH = 3
BATCHES = 6


def fit(dump_root, bad_batch, jit_compile="auto"):
    """Fits a softmax classifier under the callback; batch ``bad_batch`` (or none)
    holds inputs scaled by 1e4, which saturate the softmax: log(0) = -inf, 0 * -inf = NaN.

    Returns a dict: ``raised`` (the NonFiniteError's epoch, batch, step, report's
    first bad op type) or None, ``torch_imported`` after importing the callback.
    """
    from tb_numerics_plugin.integrations import keras as tbn_keras  # imports TF

    torch_imported = "torch" in sys.modules
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * BATCHES, 8)).astype("float32")
    if bad_batch is not None:
        x[bad_batch * BATCH:(bad_batch + 1) * BATCH] *= 1e4
    y = np.eye(4, dtype="float32")[rng.integers(0, 4, BATCH * BATCHES)]
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(4, activation="softmax")])

    def cross_entropy(labels, probs):
        return -tf.reduce_sum(labels * tf.math.log(probs), axis=-1)

    model.compile(optimizer="sgd", loss=cross_entropy, jit_compile=jit_compile)
    callback = tbn_keras.NumericsCallback(dump_root)
    result = {"raised": None, "torch_imported": torch_imported,
              "layers": [layer.name for layer in model.layers]}
    try:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[callback])
    except tbn_keras.NonFiniteError as e:
        first = (e.report or {}).get("first_bad_tensor") or {}
        result["raised"] = {"epoch": e.epoch, "batch": e.batch, "step": e.step,
                            "first_op_type": first.get("op_type"),
                            "stop_training": model.stop_training}
    result["abs_max"] = {  # of each layer's weights after the fit: the last summary's value
        layer.name: max(float(np.abs(w.numpy()).max()) for w in layer.weights)
        for layer in model.layers}
    return result


@pytest.fixture(scope="module")
def keras_runs(tmp_path_factory):
    """Runs this file as a script: a NaN fit into bad/ and a healthy fit into good/."""
    if importlib.util.find_spec("tensorflow") is None:  # find, never import, TF here
        pytest.skip("the Keras callback needs tensorflow")
    out = tmp_path_factory.mktemp("keras")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), str(out)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    if proc.returncode:
        pytest.fail("keras fit failed:\n" + proc.stderr[-4000:])
    with open(out / "results.json") as f:
        results = json.load(f)
    return out, results, proc.stderr


def _analyze(dump):
    run = Logdir(str(dump)).run(".")
    run.update()
    return analyze_run(run)


def test_nan_loss_stops_the_fit_at_its_batch_with_the_exception(keras_runs):
    _, results, _ = keras_runs
    raised = results["bad"]["raised"]
    assert raised == {"epoch": 0, "batch": BAD_BATCH, "step": None, "first_op_type": "Log",
                      "stop_training": True}


def test_dump_tf_wrote_names_log_as_the_first_bad_tensor(keras_runs):
    out, _, _ = keras_runs
    first = _analyze(out / "bad")["first_bad_tensor"]
    assert first["op_type"] == "Log"
    assert first["health"]["neg_inf"] > 0
    assert "tf.math.log(probs)" in first["source"]["code"]


def test_first_bad_tensor_story_goes_to_stderr(keras_runs):
    _, _, stderr = keras_runs
    assert "loss is nan at epoch 0, batch %d" % BAD_BATCH in stderr
    assert "first bad tensor:" in stderr and "(Log)" in stderr
    assert "tf.math.log(probs)" in stderr


def test_healthy_fit_leaves_a_dump_whose_check_passes(keras_runs, capsys):
    out, results, _ = keras_runs
    assert results["good"]["raised"] is None
    assert cli.main(["report", str(out / "good"), "--check"]) == 0
    assert "no inf or NaN found" in capsys.readouterr().out


def test_jit_compiled_model_is_dumped_without_xla_instead_of_failing(keras_runs):
    # XLA cannot compile tfdbg2's DebugIdentityV2 ops: with jit_compile=True
    # and dumping on, TF's fit fails ("tf2xla conversion failed").
    out, results, _ = keras_runs
    assert results["jit"]["raised"] is None
    report = _analyze(out / "jit")
    assert report["num_graph_execution_traces"] > 0
    assert report["first_bad_tensor"] is None


def _series(dump):
    """``{step: {(module, stat): value}}`` and the descriptors of the dump's one series file."""
    paths = glob.glob(os.path.join(str(dump), "*." + series.SUFFIX))
    assert len(paths) == 1, paths
    steps, descriptors = {}, []
    for _, payload in records.scan(paths[0]).records:
        step, _, values, described = series.decode_event(payload)
        descriptors += described
        if step is not None:
            steps[step] = {(module, stat): v for kind, stat, _, module, v in values
                           if kind == "weight"}
    return steps, descriptors


def test_healthy_fit_writes_a_weights_summary_per_layer_and_batch(keras_runs):
    out, results, _ = keras_runs
    good = results["good"]
    steps, descriptors = _series(out / "good")
    assert sorted(steps) == list(range(BATCHES))
    assert sorted(d[2] for d in descriptors) == sorted(good["layers"])
    assert {d[3] for d in descriptors} == {"float32"}
    last = steps[BATCHES - 1]
    for layer in good["layers"]:
        # the last summary is of the weights the fit ended with
        assert last[(layer, "abs_max")] == pytest.approx(good["abs_max"][layer], rel=1e-6)
        assert last[(layer, "nonfinite")] == 0
        assert last[(layer, "headroom_bits")] > 100  # float32 weights far from their limit


def test_nan_batch_shows_as_nonfinite_weights_at_its_step(keras_runs):
    out, results, _ = keras_runs
    steps, _ = _series(out / "bad")
    assert sorted(steps) == list(range(BAD_BATCH + 1))  # the fit stopped after that batch
    for layer in results["bad"]["layers"]:
        assert all(steps[s][(layer, "nonfinite")] == 0 for s in range(BAD_BATCH))
        assert steps[BAD_BATCH][(layer, "nonfinite")] > 0  # SGD applied the NaN gradient


def test_importing_the_keras_callback_does_not_import_torch(keras_runs):
    _, results, _ = keras_runs
    assert results["bad"]["torch_imported"] is False


def main(out):
    results = {"bad": fit(os.path.join(out, "bad"), BAD_BATCH),
               "good": fit(os.path.join(out, "good"), None),
               "jit": fit(os.path.join(out, "jit"), None, jit_compile=True)}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
