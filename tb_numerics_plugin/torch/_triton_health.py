"""Raw health statistics on CUDA with Triton (imported only when Triton is installed).

Two or three launches per tensor and no host sync: ``_partials_kernel``
writes per-block partial statistics, ``_fold_kernel`` folds them into the raw
row (layout ``health.RAW_WIDTH``, see ``health.py``), and for FULL_NUMERICS
``_sq_dev_kernel`` adds the squared deviations from the mean it reads back
from that row on the device.
"""

import torch
import triton
import triton.language as tl

_BLOCK = 4096
_FOLD_BLOCK = 512
_PARTS = 11  # partial columns: 6 counts, min, max, abs_min_nonzero, abs_max, sum


@triton.jit
def _partials_kernel(x_ptr, n, out_ptr, EXTREMA: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float64)
    inf = float("inf")
    fin = ((x - x) == 0) & mask
    base = out_ptr + pid.to(tl.int64) * 11
    tl.store(base + 0, tl.sum(((x == -inf) & mask).to(tl.float64), axis=0))
    tl.store(base + 1, tl.sum(((x == inf) & mask).to(tl.float64), axis=0))
    tl.store(base + 2, tl.sum(((x != x) & mask).to(tl.float64), axis=0))
    tl.store(base + 3, tl.sum((fin & (x < 0)).to(tl.float64), axis=0))
    tl.store(base + 4, tl.sum(((x == 0) & mask).to(tl.float64), axis=0))
    tl.store(base + 5, tl.sum((fin & (x > 0)).to(tl.float64), axis=0))
    if EXTREMA:
        a = tl.abs(x)
        tl.store(base + 6, tl.min(tl.where(fin, x, inf), axis=0))
        tl.store(base + 7, tl.max(tl.where(fin, x, -inf), axis=0))
        tl.store(base + 8, tl.min(tl.where(fin & (a > 0), a, inf), axis=0))
        tl.store(base + 9, tl.max(tl.where(fin, a, -1.0), axis=0))
        tl.store(base + 10, tl.sum(tl.where(fin, x, 0.0), axis=0))


@triton.jit
def _fold_kernel(parts_ptr, nblocks, row_ptr, EXTREMA: tl.constexpr, BLOCK: tl.constexpr):
    # One program per row slot: slots 6 and 8 take the min of their partial
    # column, 7 and 9 the max, the others the sum; slot 11 starts at 0 for
    # _sq_dev_kernel's atomic adds. Without EXTREMA, slots 6..10 get the
    # "no element" values (their partial columns were never written).
    col = tl.program_id(0)
    inf = float("inf")
    s = tl.zeros([BLOCK], dtype=tl.float64)
    lo = s + inf
    hi = s - inf
    if (col < 6) | (EXTREMA & (col < 11)):
        for start in range(0, nblocks, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = offs < nblocks
            v = tl.load(parts_ptr + offs * 11 + col, mask=m, other=0.0)
            s += v
            lo = tl.minimum(lo, tl.where(m, v, inf))
            hi = tl.maximum(hi, tl.where(m, v, -inf))
    total = tl.sum(s, axis=0)
    is_min = (col == 6) | (col == 8)
    is_max = (col == 7) | (col == 9)
    result = tl.where(is_min, tl.min(lo, axis=0), tl.where(is_max, tl.max(hi, axis=0), total))
    if not EXTREMA:
        empty = tl.where(is_min, inf, tl.where(col == 7, -inf, tl.where(col == 9, -1.0, 0.0)))
        result = tl.where(col >= 6, empty, result)
    result = tl.where(col == 11, 0.0, result)
    tl.store(row_ptr + col, result)


@triton.jit
def _sq_dev_kernel(x_ptr, n, row_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float64)
    fin = ((x - x) == 0) & mask
    n_fin = tl.load(row_ptr + 3) + tl.load(row_ptr + 4) + tl.load(row_ptr + 5)
    mean = tl.load(row_ptr + 10) / tl.maximum(n_fin, 1.0)
    d = tl.where(fin, x - mean, 0.0)
    tl.atomic_add(row_ptr + 11, tl.sum(d * d, axis=0))


def raw_stats_into(tensor, level, row):
    """Writes the raw row of a CUDA tensor into ``row`` (a float64 device view).

    Args:
      tensor: CUDA tensor of float16, bfloat16, float32 or float64.
      level: ``health.LEVEL_*`` (0 counts, 1 also extrema and sum, 2 also
        squared deviations, one more launch).
      row: contiguous float64 CUDA tensor of ``health.RAW_WIDTH`` elements.
    """
    x = tensor.detach().reshape(-1)
    if not x.is_contiguous():
        x = x.contiguous()
    n = x.numel()
    blocks = max(triton.cdiv(n, _BLOCK), 1)
    parts = torch.empty((blocks, _PARTS), dtype=torch.float64, device=x.device)
    extrema = level >= 1
    _partials_kernel[(blocks,)](x, n, parts, EXTREMA=extrema, BLOCK=_BLOCK)
    _fold_kernel[(12,)](parts, blocks, row, EXTREMA=extrema, BLOCK=_FOLD_BLOCK)
    if level >= 2 and n:
        _sq_dev_kernel[(blocks,)](x, n, row, BLOCK=_BLOCK)
