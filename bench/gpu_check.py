"""GPU check of the CUDA health path: Triton == pure torch, and what it costs.

Run on a machine with a CUDA device, Triton and this package installed
(``pip install -e . --no-deps`` from the repo root, then, from the repo root)::

    python bench/gpu_check.py            # about 1-2 minutes, prints markdown

It (1) compares the raw health rows of the Triton kernel with the pure-torch
reference (and with the C kernel on a host copy) for float16, bfloat16,
float32 and float64 tensors holding NaN, +-Inf, zeros, -0.0, negatives,
tiny values, all-NaN and empty tensors, at every kernel level: counts and
extrema must be identical, sums equal to 1e-9 relative (block order differs);
(2) times one health row per tensor size on each path with CUDA events; and
(3) times a training step of the benchmark transformer encoder on the GPU
uninstrumented and under FULL_HEALTH with each backend. Exit status 1 if any
comparison fails. Paste its tables into docs/benchmarks.md.
"""

import statistics
import sys
import tempfile
import time

import numpy as np
import torch

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.torch import health, kernels

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
LEVELS = (health.LEVEL_COUNTS, health.LEVEL_EXTREMA, health.LEVEL_MOMENTS)


def special(dtype, n, seed):
    """Random values with NaN, +-Inf, zeros, -0.0 and tiny values mixed in, on CUDA."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 10
    pick = torch.randint(0, 8, (n,), generator=g)
    x[pick == 0] = 0.0
    x[pick == 1] = float("inf")
    x[pick == 2] = float("-inf")
    x[pick == 3] = float("nan")
    x[pick == 4] = -0.0
    x[pick == 5] *= 1e-3
    return x.to(dtype).cuda()


def cases(dtype):
    yield "special-1k", special(dtype, 1000, 0)
    yield "special-5M", special(dtype, 5_000_001, 1)
    yield "finite-3M", (torch.randn(3_000_017, dtype=torch.float64) * 100).to(dtype).cuda()
    yield "all-nan", torch.full((4097,), float("nan"), dtype=dtype, device="cuda")
    yield "empty", torch.empty(0, dtype=dtype, device="cuda")
    yield "transposed", special(dtype, 4096, 2).reshape(64, 64).t()


def compare():
    """Returns the number of mismatches, printing each."""
    from tb_numerics_plugin.torch import _triton_health

    failures = 0
    row = torch.empty(health.RAW_WIDTH, dtype=torch.float64, device="cuda")
    for dtype in DTYPES:
        for name, x in cases(dtype):
            for level in LEVELS:
                _triton_health.raw_stats_into(x, level, row)
                tri = row.cpu().numpy()
                ref = health.torch_raw_stats(x, level).cpu().numpy()
                rows = [("torch", ref)]
                if kernels.c_kernel_available():
                    rows.append(("C", kernels.c_raw_stats(x.cpu(), level)))
                for other, vals in rows:
                    exact = np.array_equal(tri[:10], vals[:10])
                    close = np.allclose(tri[10:], vals[10:], rtol=1e-9, atol=1e-300)
                    if not (exact and close):
                        failures += 1
                        print("MISMATCH %s %s level %d vs %s:\n  triton %s\n  %-6s %s"
                              % (dtype, name, level, other, tri.tolist(), other, vals.tolist()))
    return failures


def time_rows(sizes=(1_000, 100_000, 10_000_000), reps=50):
    """Markdown table: microseconds per health row, Triton vs torch, float32."""
    from tb_numerics_plugin.torch import _triton_health

    lines = ["| elements | level | Triton µs | torch µs | torch / Triton |", "|---:|---:|---:|---:|---:|"]
    row = torch.empty(health.RAW_WIDTH, dtype=torch.float64, device="cuda")
    for n in sizes:
        x = torch.randn(n, device="cuda")
        for level in (health.LEVEL_COUNTS, health.LEVEL_MOMENTS):
            results = []
            for fn in (lambda: _triton_health.raw_stats_into(x, level, row),
                       lambda: row.copy_(health.torch_raw_stats(x, level))):
                fn()
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                for _ in range(reps):
                    fn()
                stop.record()
                torch.cuda.synchronize()
                results.append(start.elapsed_time(stop) * 1e3 / reps)
            lines.append("| %d | %d | %.1f | %.1f | %.1f |" % (n, level, results[0], results[1],
                                                                results[1] / results[0]))
    return "\n".join(lines)


def time_steps(rounds=5):
    """Markdown table: transformer training step on the GPU, medians of interleaved rounds."""
    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(16, 128, 256, device="cuda")

    def step():
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        torch.cuda.synchronize()

    configs = {"uninstrumented": None, "NO_TENSOR": ("NO_TENSOR", "auto"),
               "FULL_HEALTH triton": ("FULL_HEALTH", "triton"),
               "FULL_HEALTH torch": ("FULL_HEALTH", "torch")}
    times = {k: [] for k in configs}
    with tempfile.TemporaryDirectory() as root:
        for _ in range(rounds):
            for name, config in configs.items():
                ctx = (tbn.enable_dump_debug_info(tempfile.mkdtemp(dir=root), config[0],
                                                  health_backend=config[1]) if config else None)
                try:
                    step()
                    for _ in range(3):
                        t = time.perf_counter()
                        step()
                        times[name].append(time.perf_counter() - t)
                finally:
                    if ctx is not None:
                        ctx.close()
    base = statistics.median(times["uninstrumented"])
    lines = ["| configuration | step ms | × |", "|---|---:|---:|"]
    for name, ts in times.items():
        med = statistics.median(ts)
        lines.append("| %s | %.2f | %.2f |" % (name, med * 1e3, med / base))
    return "\n".join(lines)


def capture_check(backend):
    """True when a CUDA capture finds log(0) as the first bad tensor (eager ops)."""
    from tb_numerics_plugin.analysis import analyze_run
    from tb_numerics_plugin.reader import Logdir

    with tempfile.TemporaryDirectory() as root:
        with tbn.enable_dump_debug_info(root, "FULL_HEALTH", -1, health_backend=backend):
            logits = torch.tensor([[0.0, 200.0], [1.0, 2.0]], device="cuda")
            torch.log(torch.softmax(logits, dim=1))
        run = Logdir(root).run(".")
        run.update()
        first = analyze_run(run)["first_bad_tensor"]
    ok = bool(first) and first["op_type"] == "aten.log.default" and first["health"]["neg_inf"] == 1
    print("capture on CUDA (%s): first bad tensor %s -> %s" % (
        backend, first and first["op_type"], "ok" if ok else "WRONG"))
    return ok


def main():
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 2
    if not kernels.triton_available():
        print("Triton is not importable: nothing to check")
        return 2
    print("device: %s, torch %s" % (torch.cuda.get_device_name(), torch.__version__))
    failures = compare()
    failures += sum(not capture_check(b) for b in ("triton", "torch"))
    print("comparisons: %s" % ("all identical" if not failures else "%d MISMATCHES" % failures))
    print("\n### Health row per tensor (float32)\n")
    print(time_rows())
    print("\n### Transformer encoder training step on the GPU\n")
    print(time_steps())
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
