"""The capture says which health backend runs, what a missing C kernel costs, and why the
CUDA kernels cannot run (their rows are checked on a GPU by bench/gpu_check.py)."""

import ctypes
import logging
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.torch import health, kernels, kernels_cuda

# A real process whose import of the C kernel fails, as on a machine that had no C compiler
# when tb-numerics was installed (the extension is optional in setup.py).
_WITHOUT_C_KERNEL = textwrap.dedent("""
    import logging, sys, tempfile
    sys.modules["tb_numerics_plugin.torch._health"] = None  # import raises ImportError
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    import torch
    from tb_numerics_plugin import torch as tbn
    from tb_numerics_plugin.torch import kernels
    assert not kernels.c_kernel_available()
    try:
        tbn.enable_dump_debug_info(tempfile.mkdtemp(), "FULL_HEALTH", health_backend="c")
    except ValueError as e:
        print("REFUSED", e)
    for _ in range(2):
        with tbn.enable_dump_debug_info(tempfile.mkdtemp(), "FULL_HEALTH", -1):
            y = torch.log(torch.zeros(4))
    print("STEP", y.tolist())
""")


@pytest.fixture(scope="module")
def without_c_kernel():
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_C_KERNEL], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, proc.stderr


def test_forcing_the_c_backend_without_the_kernel_is_refused_with_how_to_build_it(
        without_c_kernel):
    out, _ = without_c_kernel
    (line,) = [l for l in out.splitlines() if l.startswith("REFUSED")]
    assert "health_backend='c'" in line and "C compiler" in line
    assert "--no-binary tb-numerics" in line


def test_auto_without_the_kernel_warns_once_with_the_cost_and_still_captures(without_c_kernel):
    out, err = without_c_kernel
    warnings = [l for l in err.splitlines() if l.startswith("WARNING") and "C health kernel" in l]
    assert len(warnings) == 1, err
    assert "10x" in warnings[0] and "apt-get install gcc" in warnings[0]
    enabled = [l for l in err.splitlines() if "tensor_debug_mode FULL_HEALTH" in l]
    assert len(enabled) == 2 and all("CPU tensors: pure torch" in l for l in enabled)
    assert "STEP [-inf, -inf, -inf, -inf]" in out


def test_enable_and_disable_are_logged_with_root_mode_and_backend(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tb_numerics_plugin.torch")
    with tbn.enable_dump_debug_info(str(tmp_path), "CONCISE_HEALTH", 10) as handle:
        torch.exp(torch.ones(3))
    texts = [r.getMessage() for r in caplog.records]
    (enabled,) = [t for t in texts if "dumping to" in t]
    assert handle.file_prefix in enabled and "tensor_debug_mode CONCISE_HEALTH" in enabled
    assert "the last 10 executions and traces" in enabled
    expected = "C kernel" if kernels.c_kernel_available() else "pure torch"
    assert "CPU tensors: %s" % expected in enabled
    (closed,) = [t for t in texts if "closed:" in t]
    assert handle.file_prefix in closed and "executions" in closed


def test_an_unknown_backend_names_the_parameter(tmp_path):
    with pytest.raises(ValueError,
                       match="health_backend must be one of auto, c, cuda, triton, torch"):
        tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", health_backend="gpu")


def _driver_present():
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_forcing_the_cuda_kernels_without_a_device_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ValueError, match="health_backend='cuda': .*no CUDA device"):
        tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", health_backend="cuda")
    assert not list(tmp_path.iterdir())  # refused before anything was written
    # auto takes the C kernel on CPU and says the CUDA kernels are not in use
    summary, _ = kernels.describe_backend("auto")
    assert summary.endswith("CUDA tensors: pure torch") or "Triton" in summary


@pytest.mark.skipif(not kernels.c_kernel_available() or _driver_present(),
                    reason="needs the C extension and a machine without a CUDA driver")
def test_the_cuda_loader_names_the_missing_driver():
    from tb_numerics_plugin.torch import _health

    with open(kernels_cuda.PTX, "rb") as f:
        ptx = f.read()
    with pytest.raises(RuntimeError, match="CUDA driver not found: libcuda.so.1"):
        _health.CudaKernels(ptx)
    with pytest.raises(TypeError, match="must be bytes"):
        _health.CudaKernels(ptx.decode())


def test_the_cuda_kernels_start_from_the_empty_row_of_every_level():
    # their atomics merge into rows that hold these values: an empty tensor's row, as the
    # C kernel computes it, and the slots a counts-only row leaves untouched
    for level in (0, 1, 2):
        empty = health.torch_raw_stats(torch.empty(0), level).numpy()
        assert np.array_equal(np.array(health.EMPTY_ROW), empty)
        if kernels.c_kernel_available():
            c_empty = kernels.c_raw_stats(torch.empty(0), level)
            assert np.array_equal(np.array(health.EMPTY_ROW), c_empty)
    counts_only = kernels.c_raw_stats(torch.tensor([1.0, -2.0]), 0) if (
        kernels.c_kernel_available()) else health.torch_raw_stats(torch.tensor([1.0, -2.0]), 0)
    assert np.array_equal(counts_only[6:], np.array(health.EMPTY_ROW[6:]))
    rows = kernels_cuda.empty_rows(torch.device("cpu"), 3)
    assert rows.shape == (3, health.RAW_WIDTH) and rows.dtype == torch.float64
    assert np.array_equal(rows.numpy(), np.tile(health.EMPTY_ROW, (3, 1)))


def _nvcc_that_built_the_ptx():
    """True when this machine's nvcc is the release that wrote the shipped PTX."""
    if not shutil.which("nvcc"):
        return False
    with open(kernels_cuda.PTX) as f:
        header = [line[3:].strip() for line in f.readlines()[:8] if "compilation tools" in line]
    version = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    return bool(header) and header[0] in version


@pytest.mark.skipif(not _nvcc_that_built_the_ptx(), reason="needs the nvcc release of the PTX")
def test_the_shipped_ptx_is_built_from_the_kernel_source(tmp_path):
    # `make ptx` after editing _health_cuda.cu: the wheel ships the PTX, not the source's build
    out = tmp_path / "health.ptx"
    source = kernels_cuda.PTX.replace(".ptx", ".cu")
    subprocess.run(["nvcc", "-ptx", "-arch=compute_75", "-O3", "-o", str(out), source],
                   check=True)
    with open(kernels_cuda.PTX, "rb") as f:
        assert f.read() == out.read_bytes()
    assert b".entry tbn_rows_bf16(" in out.read_bytes()


def test_kernels_a_driver_cannot_compile_are_given_up_with_its_error(monkeypatch, caplog):
    # A driver older than the PTX refuses the module at its first use on a device: the
    # kernels are given up for the process (Triton or torch then), the error named once.
    # No CUDA driver here, so a stand-in raises what _health.CudaKernels.prepare raises.
    error = ("CUDA driver: cuModuleLoadData (the health kernels' PTX) failed: "
             "CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222)")
    prepared = []

    class OldDriver:
        def prepare(self, index):
            prepared.append(index)
            raise RuntimeError(error)

    monkeypatch.setattr(kernels_cuda._Cuda, "kernels", OldDriver())
    monkeypatch.setattr(kernels_cuda._Cuda, "failure", None)
    monkeypatch.setattr(kernels_cuda._Cuda, "ready", set())
    caplog.set_level(logging.WARNING, logger="tb_numerics_plugin.torch")
    assert not kernels_cuda.ready(torch.device("cuda", 0))
    assert not kernels_cuda.ready(torch.device("cuda", 0))
    assert prepared == [0]  # tried once
    assert kernels_cuda.cuda_kernels() is None
    assert kernels_cuda.failure() == "RuntimeError: " + error
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "UNSUPPORTED_PTX_VERSION" in warning and "Triton or torch" in warning
    with pytest.raises(RuntimeError, match="UNSUPPORTED_PTX_VERSION"):
        kernels_cuda.raw_stats_into(torch.ones(3), 0, torch.zeros(12))
