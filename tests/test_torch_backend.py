"""The capture says which health backend runs, and what a missing C kernel costs."""

import logging
import subprocess
import sys
import textwrap

import pytest
import torch

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.torch import kernels

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
    with pytest.raises(ValueError, match="health_backend must be one of auto, c, triton, torch"):
        tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", health_backend="cuda")
