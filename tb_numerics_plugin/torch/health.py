"""Pure "tensor → health vector" builders, in TensorFlow's value layouts.

Nothing here does I/O. Two stages:

1. raw statistics of a tensor, a 12-vector (:data:`RAW_WIDTH`), computed on
   the tensor's device by a kernel (``kernels.py``) or by :func:`torch_raw_stats`
   (the pure-torch reference);
2. :func:`debug_values` turns a raw row plus the tensor's metadata into the
   values of one ``TensorDebugMode`` (layouts in ``docs/format.md``).

Raw row: ``[n_neg_inf, n_pos_inf, n_nan, n_neg, n_zero, n_pos, min, max,
abs_min_nonzero, abs_max, sum, sum_sq_dev]`` where neg/zero/pos, min, max,
abs_max and sum cover finite elements only; min/max are +inf/-inf, abs_min
_nonzero +inf and abs_max -1 when there is no such element; ``sum_sq_dev``
(squared deviations from the finite mean) is 0 unless moments were asked for.
"""

import math

import numpy as np
import torch

from tb_numerics_plugin import schema
from tb_numerics_plugin.proto import debug_event_pb2, tensor_pb2

RAW_WIDTH = 12
MODES = ("NO_TENSOR", "CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH", "SHAPE",
         "FULL_NUMERICS", "FULL_TENSOR")
# The raw row of no element: every count 0, min/max +inf/-inf, abs_min_nonzero +inf,
# abs_max -1, sums 0 (what the CUDA kernels' atomics merge into, too).
EMPTY_ROW = (0.0,) * 6 + (math.inf, -math.inf, math.inf, -1.0, 0.0, 0.0)
# torch.dtype -> the dtype code of the C and CUDA kernels (_health.h)
C_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
# Modes whose values come from the raw statistics of a kernel.
KERNEL_MODES = ("CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH", "FULL_NUMERICS")
# How much of the raw row a kernel computes (see _health.c): counts only; plus
# min/max/abs extrema and the sum; plus squared deviations.
LEVEL_COUNTS, LEVEL_EXTREMA, LEVEL_MOMENTS = 0, 1, 2
HEALTH_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
SHAPE_MAX_RANK = 6

# TensorFlow's DataType numbers of the torch dtypes that have one.
DTYPE_ENUM = {
    getattr(torch, name): enum for name, enum in schema.DTYPE_ENUMS.items()
    if isinstance(getattr(torch, name, None), torch.dtype)
}


def mode_enum(mode):
    """Returns the ``TensorDebugMode`` number of a mode name.

    Raises:
      ValueError: unknown mode name.
    """
    if mode not in MODES:
        raise ValueError("tensor_debug_mode must be one of %s, not %r" % (", ".join(MODES), mode))
    return debug_event_pb2.TensorDebugMode.Value(mode)


def level_for(mode):
    """The kernel level a mode needs: only FULL_NUMERICS reads beyond the counts."""
    return LEVEL_MOMENTS if mode == "FULL_NUMERICS" else LEVEL_COUNTS


def torch_raw_stats(tensor, level):
    """Computes the raw row of ``tensor`` with torch ops on its device.

    The pure-torch reference of the C and Triton kernels: no device→host copy.

    Args:
      tensor: a floating tensor (any layout).
      level: LEVEL_COUNTS, LEVEL_EXTREMA or LEVEL_MOMENTS; slots a level does
        not compute keep their "no element" values.

    Returns:
      A float64 tensor of :data:`RAW_WIDTH` values on ``tensor.device``.
    """
    x = tensor.detach().reshape(-1)
    inf = math.inf
    if x.numel() == 0:
        return torch.tensor(EMPTY_ROW, dtype=torch.float64, device=x.device)
    x = x.double()  # exact for every supported dtype; sums in float64 like the C loop
    fin = torch.isfinite(x)
    a = x.abs()
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    total = torch.where(fin, x, zero).sum()
    parts = [
        (x == -inf).sum(), (x == inf).sum(), torch.isnan(x).sum(),
        (fin & (x < 0)).sum(), (x == 0).sum(), (fin & (x > 0)).sum(),
    ]
    if level == LEVEL_COUNTS:
        rest = torch.tensor(EMPTY_ROW[6:], dtype=x.dtype, device=x.device)
        return torch.cat([torch.stack([p.to(torch.float64) for p in parts]), rest])
    parts += [
        torch.where(fin, x, inf).min(), torch.where(fin, x, -inf).max(),
        torch.where(fin & (a > 0), a, inf).min(), torch.where(fin, a, -1.0).max(),
        total,
    ]
    if level >= LEVEL_MOMENTS:
        n_fin = fin.sum().clamp(min=1)
        dev = torch.where(fin, x - total / n_fin, zero)
        parts.append((dev * dev).sum())
    else:
        parts.append(zero)
    return torch.stack([p.to(torch.float64) for p in parts])


def tensor_meta(tensor, device=None):
    """Returns ``(dtype_enum, shape tuple, device_id)`` of a tensor (no sync).

    Args:
      tensor: any tensor.
      device: ``tensor.device`` when the caller has it already (saves building it again).
    """
    index = (tensor.device if device is None else device).index
    # torch.Size is an immutable tuple already: no copy needed
    return DTYPE_ENUM.get(tensor.dtype, 0), tensor.shape, -1 if index is None else index


def dense_view(tensor):
    """Returns ``tensor`` if its elements fill one gap-free memory span, else a contiguous copy.

    Health statistics do not depend on element order, so a transposed or
    permuted tensor (non-overlapping and dense) is read in memory order
    without the copy ``.contiguous()`` would make.
    """
    if tensor.is_contiguous():
        return tensor
    expected = 1
    for stride, size in sorted(zip(tensor.stride(), tensor.shape)):
        if size == 1:
            continue
        if stride != expected:
            return tensor.contiguous()
        expected *= size
    return tensor


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def debug_values(mode, tensor_id, raw, meta):
    """Builds the debug values of one tensor in TensorFlow's layout.

    Args:
      mode: a mode name of :data:`KERNEL_MODES` or ``"SHAPE"``.
      tensor_id: id written in slot 0 (-1 for eager executions).
      raw: the tensor's raw row (sequence of floats), ignored for SHAPE.
      meta: ``(dtype_enum, shape, device_id)`` from :func:`tensor_meta`.

    Returns:
      list of floats.

    Raises:
      ValueError: a mode without values (NO_TENSOR, FULL_TENSOR) or unknown.
    """
    dtype_enum, shape, device_id = meta
    size = float(_numel(shape))
    if mode == "SHAPE":
        dims = list(shape[-SHAPE_MAX_RANK:]) if shape else []
        dims += [0] * (SHAPE_MAX_RANK - len(dims))
        head = [float(tensor_id), float(dtype_enum), float(len(shape)), size]
        return head + [float(d) for d in dims]
    n_ni, n_pi, n_nan = float(raw[0]), float(raw[1]), float(raw[2])
    if mode == "CURT_HEALTH":
        return [float(tensor_id), 1.0 if n_ni + n_pi + n_nan > 0 else 0.0]
    if mode == "CONCISE_HEALTH":
        return [float(tensor_id), size, n_ni, n_pi, n_nan]
    if mode not in ("FULL_HEALTH", "FULL_NUMERICS"):
        raise ValueError("mode %r has no debug values" % (mode,))
    values = [float(tensor_id), float(device_id), float(dtype_enum), float(len(shape)), size,
              n_ni, n_pi, n_nan, float(raw[3]), float(raw[4]), float(raw[5])]
    if mode == "FULL_NUMERICS":
        values += numerics_tail(raw)
    return values


def numerics_tail(raw):
    """Returns ``[min, max, abs_min_nonzero, abs_max, mean, std]`` of a raw row.

    min, max, abs_max, mean and std are NaN when no element is finite;
    abs_min_nonzero is 0 when no finite element is nonzero; std is the
    population standard deviation (ddof=0).
    """
    n_fin = float(raw[3]) + float(raw[4]) + float(raw[5])
    if n_fin == 0:
        return [math.nan, math.nan, 0.0, math.nan, math.nan, math.nan]
    amn = float(raw[8])
    mean = float(raw[10]) / n_fin
    return [float(raw[6]), float(raw[7]), 0.0 if math.isinf(amn) else amn, float(raw[9]),
            mean, math.sqrt(float(raw[11]) / n_fin)]


def values_proto(values):
    """Returns a 1-D float64 TensorProto (little-endian ``tensor_content``)."""
    proto = tensor_pb2.TensorProto(dtype=tensor_pb2.DT_DOUBLE)
    proto.tensor_shape.dim.add().size = len(values)
    proto.tensor_content = np.asarray(values, dtype="<f8").tobytes()
    return proto


def full_tensor_proto(tensor):
    """Returns the whole host tensor as a TensorProto (FULL_TENSOR mode).

    Args:
      tensor: a CPU tensor (already copied off the device).

    Returns:
      TensorProto with dtype, shape and little-endian ``tensor_content``;
      dtype DT_INVALID (0) with no content for dtypes TensorFlow lacks.
    """
    enum = DTYPE_ENUM.get(tensor.dtype, 0)
    proto = tensor_pb2.TensorProto(dtype=enum)
    for d in tensor.shape:
        proto.tensor_shape.dim.add().size = d
    if enum:
        flat = tensor.contiguous().reshape(-1)
        if tensor.dtype in (torch.bfloat16, torch.float16):
            flat = flat.view(torch.int16)
        data = flat.numpy()
        proto.tensor_content = data.astype(data.dtype.newbyteorder("<"), copy=False).tobytes()
    return proto
