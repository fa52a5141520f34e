"""What the wheel and the sdist carry, built from this checkout as a user's pip would."""

import email
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _build(kind, source, out):
    # No isolation: the build uses this venv's setuptools instead of downloading one.
    code = "from setuptools import build_meta as b; print(b.build_%s(%r))" % (kind, str(out))
    proc = subprocess.run([sys.executable, "-c", code], cwd=source, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    return _build("sdist", REPO, tmp_path_factory.mktemp("sdist"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return _build("wheel", REPO, tmp_path_factory.mktemp("wheel"))


def test_wheel_ships_the_protos_and_the_served_frontend_but_no_test_js(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "tb_numerics_plugin/proto/debug_event.proto" in names
    assert "tb_numerics_plugin/proto/debug_event_pb2.py" in names
    assert "tb_numerics_plugin/frontend/index.js" in names
    assert "tb_numerics_plugin/frontend/views/alerts.js" in names
    for source in ("_native.cpp", "_native_tags.cpp", "_native_facts.cpp", "_native_values.cpp",
                   "_native_saved.cpp", "_native.h", "_native_facts.h"):  # compiled on first use
        assert "tb_numerics_plugin/torch/" + source in names
    # the CUDA health kernels, loaded by the driver (the C loader is in the _health extension)
    assert "tb_numerics_plugin/torch/_health_cuda.ptx" in names
    assert not [n for n in names if "/frontend/tests/" in n or n.endswith(".test.js")]
    assert not [n for n in names if n.startswith("tests/") or "__pycache__" in n]


def test_wheel_metadata_declares_licence_readme_and_the_tested_floors(wheel):
    archive = zipfile.ZipFile(wheel)
    (meta_name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    meta = email.message_from_bytes(archive.read(meta_name))
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().startswith("# tb-numerics")
    requires = meta.get_all("Requires-Dist")
    assert "protobuf<8,>=3.20.3" in requires
    assert any(r.startswith("tensorboard>=") for r in requires)
    assert not [r for r in requires if r.startswith(("tensorflow", "torch")) and "extra" not in r]
    entry = archive.read(meta_name.replace("METADATA", "entry_points.txt")).decode()
    assert "numerics = tb_numerics_plugin.plugin:NumericsPlugin" in entry
    assert "tb-numerics = tb_numerics_plugin.cli:main" in entry


def test_sdist_carries_what_builds_and_tests_it_and_builds_a_wheel(sdist, tmp_path):
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        tar.extractall(tmp_path, filter="data")
    for needed in ("proto/tb_numerics_plugin/proto/debug_event.proto", "tests/conftest.py",
                   "frontend/tests/format.test.js", "docs/format.md", "Makefile", "LICENSE",
                   "pyproject.toml", ".ci/run"):
        assert needed in names, needed
    assert not [n for n in names if n.endswith(".so") or "__pycache__" in n]
    (root,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    built = _build("wheel", root, tmp_path / "wheel_from_sdist")
    built_names = zipfile.ZipFile(built).namelist()
    assert "tb_numerics_plugin/proto/tensor.proto" in built_names
    if _compiler() is not None:  # the C extensions are optional: built where a compiler is
        for extension in ("_health", "_record"):
            assert [n for n in built_names
                    if n.startswith("tb_numerics_plugin/torch/%s." % extension)], extension


def _compiler():
    """The C compiler extensions build with here, or None."""
    command = (sysconfig.get_config_var("CC") or "cc").split()
    return shutil.which(command[0]) if command else None


@pytest.mark.parametrize("extension", ["_health", "_record"])
def test_an_extension_built_in_this_checkout_imports(extension):
    # A build that leaves a symbol undefined still writes the .so; the capture then falls
    # back to Python and the C tests skip, so the import itself is checked here.
    if not list((REPO / "tb_numerics_plugin" / "torch").glob(extension + ".*.so")):
        pytest.skip("%s is not built in this checkout" % extension)
    code = "import tb_numerics_plugin.torch.%s" % extension
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
