"""Raw health statistics on CUDA with Triton (imported only when Triton is installed).

Two launches per tensor and no host sync: a kernel writes per-block partial
statistics, torch ops on the device fold them into the raw row, and, for
FULL_NUMERICS, a second kernel sums squared deviations from the (device-side)
mean. The row layout is ``health.RAW_WIDTH`` as in ``health.py``.
"""

import torch
import triton
import triton.language as tl

_BLOCK = 4096
_PARTS = 11  # partial columns: 6 counts, min, max, abs_min_nonzero, abs_max, sum


@triton.jit
def _partials_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float64)
    inf = float("inf")
    fin = ((x - x) == 0) & mask
    a = tl.abs(x)
    base = out_ptr + pid * 11
    tl.store(base + 0, tl.sum(((x == -inf) & mask).to(tl.float64), axis=0))
    tl.store(base + 1, tl.sum(((x == inf) & mask).to(tl.float64), axis=0))
    tl.store(base + 2, tl.sum(((x != x) & mask).to(tl.float64), axis=0))
    tl.store(base + 3, tl.sum((fin & (x < 0)).to(tl.float64), axis=0))
    tl.store(base + 4, tl.sum(((x == 0) & mask).to(tl.float64), axis=0))
    tl.store(base + 5, tl.sum((fin & (x > 0)).to(tl.float64), axis=0))
    tl.store(base + 6, tl.min(tl.where(fin, x, inf), axis=0))
    tl.store(base + 7, tl.max(tl.where(fin, x, -inf), axis=0))
    tl.store(base + 8, tl.min(tl.where(fin & (a > 0), a, inf), axis=0))
    tl.store(base + 9, tl.max(tl.where(fin, a, -1.0), axis=0))
    tl.store(base + 10, tl.sum(tl.where(fin, x, 0.0), axis=0))


@triton.jit
def _sq_dev_kernel(x_ptr, n, mean_ptr, out_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float64)
    fin = ((x - x) == 0) & mask
    mean = tl.load(mean_ptr)
    d = tl.where(fin, x - mean, 0.0)
    tl.store(out_ptr + pid, tl.sum(d * d, axis=0))


def raw_stats_into(tensor, level, row):
    """Writes the raw row of a CUDA tensor into ``row`` (a float64 device view).

    Args:
      tensor: CUDA tensor of float16, bfloat16, float32 or float64.
      level: ``health.LEVEL_*``; LEVEL_MOMENTS adds a second launch for the
        squared deviations.
      row: float64 CUDA tensor of ``health.RAW_WIDTH`` elements.
    """
    x = tensor.detach().reshape(-1)
    if not x.is_contiguous():
        x = x.contiguous()
    n = x.numel()
    if n == 0:
        row.copy_(torch.tensor([0, 0, 0, 0, 0, 0, float("inf"), float("-inf"), float("inf"),
                                -1.0, 0.0, 0.0], dtype=torch.float64), non_blocking=True)
        return
    blocks = triton.cdiv(n, _BLOCK)
    parts = torch.empty((blocks, _PARTS), dtype=torch.float64, device=x.device)
    _partials_kernel[(blocks,)](x, n, parts, BLOCK=_BLOCK)
    row[0:6] = parts[:, 0:6].sum(0)
    if level == 0:  # health.LEVEL_COUNTS: the other slots keep their "no element" values
        row[6:].copy_(torch.tensor([float("inf"), float("-inf"), float("inf"), -1.0, 0.0, 0.0],
                                   dtype=torch.float64), non_blocking=True)
        return
    row[6] = parts[:, 6].min()
    row[7] = parts[:, 7].max()
    row[8] = parts[:, 8].min()
    row[9] = parts[:, 9].max()
    row[10] = parts[:, 10].sum()
    if level >= 2:  # health.LEVEL_MOMENTS
        n_fin = row[3:6].sum().clamp(min=1)
        mean = (row[10] / n_fin).reshape(1)
        sq = torch.empty(blocks, dtype=torch.float64, device=x.device)
        _sq_dev_kernel[(blocks,)](x, n, mean, sq, BLOCK=_BLOCK)
        row[11] = sq.sum()
    else:
        row[11] = 0.0
