"""Shared, session-scoped test data: real TF dumps and a small dump of ours.

TF is imported only in a subprocess (tests/tf_programs.py), once per test
session, so pytest's process stays free of TensorFlow.
"""

import importlib.util
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import dumps  # noqa: E402  (tests/dumps.py)

if os.environ.get("TB_NUMERICS_INSTALLED"):
    # `make test-compat`: the tests must exercise the installed wheel, not this checkout.
    import tb_numerics_plugin  # noqa: E402

    assert not os.path.abspath(tb_numerics_plugin.__file__).startswith(
        os.path.join(ROOT, "tb_numerics_plugin") + os.sep), (
        "TB_NUMERICS_INSTALLED is set but tb_numerics_plugin comes from the checkout: %s"
        % tb_numerics_plugin.__file__)


@pytest.fixture(scope="session")
def ours_dump(tmp_path_factory):
    """A miniature FULL_HEALTH dump written by our FileSetWriter (read-only for tests)."""
    root = str(tmp_path_factory.mktemp("ours_dump"))
    dumps.write_dump(root)
    return root


@pytest.fixture(scope="session")
def tf_dumps(tmp_path_factory, ours_dump):
    """Real TF 2.21 dumps of the demo in every mode, and TF's reading of them and of ours.

    Returns:
      path of a directory holding ``<MODE>/`` dump roots, ``tf_counts.json``
      and ``tf_reads_ours.json`` (see tests/tf_programs.py).
    """
    if importlib.util.find_spec("tensorflow") is None:  # find, never import, TF here
        pytest.skip("TF dumps need tensorflow")
    out = str(tmp_path_factory.mktemp("tf_dumps"))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "tf_programs.py"), out, ours_dump],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )
    if proc.returncode:
        pytest.fail("tf_programs.py failed:\n" + proc.stderr[-4000:])
    return out
