"""The ops a compiled graph calls into the capture: its health rows and its hand-over.

:func:`health_row` computes one traced value's raw health row inside the
graph; :func:`emit` (forward graphs) and :func:`emit_backward` (backward
graphs) hand all rows of one compiled call, once per call, to the session
that installed the passes (:class:`State`).
"""

import itertools
import threading
from typing import List

import torch

from tb_numerics_plugin.torch import health, kernels, kernels_cuda

# key -> table.CompiledGraph: every graph instrumented in this process (empty: none yet)
instrumented = {}


class State:
    """What the compiled graphs reach: the session they report to, and the graphs by key."""

    session = None  # the capture session compiled regions report to
    keys = itertools.count(1)
    graphs = instrumented
    installed = None  # the pass settings before install, while installed (compiled._CONFIGS)
    lock = threading.Lock()


def _hand_over(rows, key, values=(), inputs=()):
    session = State.session
    if session is not None:
        session.compiled_calls.on_compiled(State.graphs.get(key), rows, values, inputs)


@torch.library.custom_op("tb_numerics::emit", mutates_args=())
def emit(rows: torch.Tensor, key: int, values: List[torch.Tensor],
         inputs: List[torch.Tensor]) -> None:
    """Hands the ``[n, 12]`` raw health rows of one compiled call to the capture (runs
    after the call's kernels), with the values the call returns (``CompiledGraph.returned``
    order: the capture tags them as their ops' outputs) and the inputs its ops read
    (``CompiledGraph.placeholders`` order: their tags name their producers)."""
    _hand_over(rows, key, values, inputs)


@emit.register_fake
def _emit_fake(rows, key, values, inputs):
    return None


emit.register_effect(torch._library.effects.EffectType.ORDERED)


@torch.library.custom_op("tb_numerics::emit_backward", mutates_args=("rows",))
def emit_backward(rows: torch.Tensor, key: int, values: List[torch.Tensor]) -> None:
    """Hands the rows of one compiled backward call to the capture, with the gradients
    it returns (tagged as their ops' outputs). Declared as writing ``rows`` so that
    inductor keeps it: nothing reads what it returns."""
    _hand_over(rows, key, values)


@emit_backward.register_fake
def _emit_backward_fake(rows, key, values):
    return None


@torch.library.custom_op("tb_numerics::health_row", mutates_args=())
def health_row(x: torch.Tensor, level: int) -> torch.Tensor:
    """The raw health row (``health.py``) of ``x`` as a float64 ``[12]`` tensor on its
    device: one pass of the C kernel on CPU, the CUDA kernels (else Triton) on CUDA (no
    sync), else torch ops. Compiled graphs call it after each traced value (an extern call:
    inductor's own fused reductions measured several times slower than the C pass)."""
    if x.device.type == "cpu" and kernels.c_kernel_available():
        row = torch.empty(health.RAW_WIDTH, dtype=torch.float64)
        kernels.c_raw_stats(x, level, out=row.numpy())
        return row
    if x.device.type == "cuda" and kernels_cuda.ready(x.device):
        row = kernels_cuda.empty_rows(x.device, 1)[0]
        kernels_cuda.raw_stats_into(x, level, row)
        return row
    if x.device.type == "cuda" and kernels.triton_available():
        from tb_numerics_plugin.torch import _triton_health

        row = torch.empty(health.RAW_WIDTH, dtype=torch.float64, device=x.device)
        _triton_health.raw_stats_into(x, level, row)
        return row
    return health.torch_raw_stats(x, level)


@health_row.register_fake
def _health_row_fake(x, level):
    return x.new_empty(health.RAW_WIDTH, dtype=torch.float64)

