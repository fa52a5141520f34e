"""Captures the native hook's tests share (tests/test_torch_native*.py).

Each test runs a small torch program under a capture on a per-op path named
by ``TB_NUMERICS_CAPTURE`` (``native.ENV``), then reads the dump it wrote.
"""

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.torch import native


def capture(monkeypatch, path, tmp, train, mode="FULL_HEALTH"):
    """Runs ``train()`` under a capture on the per-op path ``path``.

    Args:
        monkeypatch: pytest's fixture; sets ``TB_NUMERICS_CAPTURE`` for the test only.
        path: the per-op capture path, ``"native"`` or ``"python"``.
        tmp: the dump directory (any path-like), with an unbounded circular buffer.
        train: called with no arguments inside the capture.
        mode: the tensor debug mode's name.

    Returns:
        The capture's handle, closed (its ``capture_path`` says the path it took).

    Raises:
        AssertionError: the capture's session counted an error.
    """
    monkeypatch.setenv(native.ENV, path)
    with tbn.enable_dump_debug_info(str(tmp), mode, circular_buffer_size=-1) as handle:
        train()
    assert handle._session.errors == 0
    return handle
