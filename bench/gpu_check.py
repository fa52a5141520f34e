"""GPU check of the CUDA health path: our CUDA kernels and Triton == pure torch, and the cost.

Run on a machine with a CUDA device, Triton and this package built
(``python setup.py build_ext --inplace`` from the repo root, then, from the repo root)::

    PYTHONPATH=. python bench/gpu_check.py      # about 2-3 minutes, prints markdown

It (1) compares the raw health rows of the CUDA kernels (``_health_cuda.cu``,
launched from PTX through the driver) and of Triton with the pure-torch
reference and with the C kernel on a host copy, for float16, bfloat16, float32
and float64 tensors holding NaN, +-Inf, zeros, -0.0, negatives, tiny values,
all-NaN and empty tensors, at every kernel level, and once on a side stream:
counts and extrema must be identical, sums equal to 1e-9 relative (block order
differs); checks that a CUDA capture finds log(0) on each backend; (2) times
one health row per tensor size on each backend with CUDA events; and (3) times
a training step of the benchmark transformer encoder on the GPU uninstrumented,
under NO_TENSOR and under FULL_HEALTH, on both capture paths (the dispatch mode
and the native hook, which is built on first use). Exit status 1 if any
comparison fails. Paste its tables into docs/benchmarks.md.
"""

import glob
import os
import statistics
import struct
import sys
import tempfile
import time

import numpy as np
import torch

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.torch import health, kernels, kernels_cuda, native

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


def row_of(backend, x, level):
    """The raw row of CUDA tensor ``x`` on ``backend`` ("cuda", "triton" or "torch"), as numpy."""
    from tb_numerics_plugin.torch import _triton_health

    if backend == "cuda":
        row = kernels_cuda.empty_rows(x.device, 1)[0]
        kernels_cuda.raw_stats_into(x, level, row)
    elif backend == "triton":
        row = torch.empty(health.RAW_WIDTH, dtype=torch.float64, device="cuda")
        _triton_health.raw_stats_into(x, level, row)
    else:
        row = health.torch_raw_stats(x, level)
    return row.cpu().numpy()


def same(a, b):
    """Counts and extrema identical, sums equal to 1e-9 relative (block order differs)."""
    return np.array_equal(a[:10], b[:10]) and np.allclose(a[10:], b[10:], rtol=1e-9,
                                                          atol=1e-300)


def compare():
    """Returns the number of mismatches, printing each: the CUDA kernels and Triton against
    pure torch and the C kernel on a host copy, then the CUDA kernels on a side stream."""
    failures = 0
    for dtype in DTYPES:
        for name, x in cases(dtype):
            for level in LEVELS:
                refs = [("torch", row_of("torch", x, level))]
                if kernels.c_kernel_available():
                    refs.append(("C", kernels.c_raw_stats(x.cpu(), level)))
                for backend in ("cuda", "triton"):
                    got = row_of(backend, x, level)
                    for other, vals in refs:
                        if not same(got, vals):
                            failures += 1
                            print("MISMATCH %s %s level %d, %s vs %s:\n  %s\n  %s" % (
                                dtype, name, level, backend, other, got.tolist(), vals.tolist()))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = special(torch.float32, 3_000_000, 5)
        got = row_of("cuda", x, health.LEVEL_MOMENTS)
    if not same(got, row_of("torch", x, health.LEVEL_MOMENTS)):
        failures += 1
        print("MISMATCH on a side stream: %s" % got.tolist())
    return failures


def time_rows(sizes=(1_000, 100_000, 10_000_000), reps=50):
    """Markdown table: microseconds per health row on each backend, float32 (CUDA events
    around ``reps`` rows: host time where the launches cannot keep the GPU busy)."""
    backends = ("cuda", "triton", "torch")
    lines = ["| elements | level | CUDA kernels µs | Triton µs | torch µs |",
             "|---:|---:|---:|---:|---:|"]
    for n in sizes:
        x = torch.randn(n, device="cuda")
        for level in (health.LEVEL_COUNTS, health.LEVEL_MOMENTS):
            results = []
            for backend in backends:
                rows = kernels_cuda.empty_rows(x.device, reps + 1)
                fn = _row_fn(backend, x, level, rows)
                fn(reps)
                start = torch.cuda.Event(enable_timing=True)
                stop = torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                for i in range(reps):
                    fn(i)
                stop.record()
                torch.cuda.synchronize()
                results.append(start.elapsed_time(stop) * 1e3 / reps)
            lines.append("| %d | %d | %.1f | %.1f | %.1f |" % ((n, level) + tuple(results)))
    return "\n".join(lines)


def _row_fn(backend, x, level, rows):
    from tb_numerics_plugin.torch import _triton_health

    if backend == "cuda":
        return lambda i: kernels_cuda.raw_stats_into(x, level, rows[i])
    if backend == "triton":
        return lambda i: _triton_health.raw_stats_into(x, level, rows[i])
    return lambda i: rows[i].copy_(health.torch_raw_stats(x, level))


def time_steps(rounds=5, warm=2, timed=5):
    """Markdown table: transformer training step on the GPU, medians of interleaved rounds.

    Each configuration dumps into one root across the rounds: enabling it again
    resumes that capture (its graphs, frames and files known), so the timed steps
    are a long run's, not a fresh capture's first steps."""
    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(16, 128, 256, device="cuda")

    def step():
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        torch.cuda.synchronize()

    configs = {"uninstrumented": None,
               "NO_TENSOR (python)": ("NO_TENSOR", "auto", "python"),
               "NO_TENSOR (native)": ("NO_TENSOR", "auto", "native"),
               "FULL_HEALTH CUDA kernels (python)": ("FULL_HEALTH", "cuda", "python"),
               "FULL_HEALTH CUDA kernels (native)": ("FULL_HEALTH", "cuda", "native"),
               "FULL_HEALTH Triton (native)": ("FULL_HEALTH", "triton", "native")}
    times = {k: [] for k in configs}
    with tempfile.TemporaryDirectory() as root:
        roots = {name: tempfile.mkdtemp(dir=root) for name in configs}
        for _ in range(rounds):
            for name, config in configs.items():
                ctx = None
                if config:
                    os.environ[native.ENV] = config[2]
                    ctx = tbn.enable_dump_debug_info(roots[name], config[0],
                                                     health_backend=config[1])
                    if ctx.capture_path != config[2]:
                        print("%s: ran on the %s path" % (name, ctx.capture_path))
                try:
                    for _ in range(warm):
                        step()
                    for _ in range(timed):
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


def _records(root):
    """The records of a dump's executions and traces, each without its wall time (the
    first field: protobuf writes it first)."""
    out = {}
    for kind in ("execution", "graph_execution_traces"):
        (path,) = glob.glob(os.path.join(root, "**", "*." + kind), recursive=True)
        with open(path, "rb") as f:
            data = f.read()
        events, pos = [], 0
        while pos < len(data):
            (length,) = struct.unpack_from("<Q", data, pos)
            events.append(data[pos + 12 + 9:pos + 12 + length])
            pos += 12 + length + 4
        out[kind] = events
    return out


def _train_tiny(steps=3):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8, 32, device="cuda")
    x[0, 0, 0] = float("inf")  # a bad input: the first bad tensor comes from it
    for _ in range(steps):
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
    torch.cuda.synchronize()


def record_check():
    """Returns the number of mismatches: the records of a CUDA training run on the C
    recorder (rows queued from C) equal the Python recorder's, byte for byte, on each
    capture path; prints how many rows each queued from Python."""
    from tb_numerics_plugin.torch import encoder, recorder

    failures = 0
    calls = [0]
    payload = encoder.Encoder.payload

    def counted(self, t, device):
        calls[0] += device.type == "cuda"
        return payload(self, t, device)

    encoder.Encoder.payload = counted
    try:
        for path in ("python", "native"):
            for mode in ("FULL_HEALTH", "FULL_NUMERICS"):
                dumps = {}
                for which in ("c", "python"):
                    os.environ[native.ENV], os.environ[recorder.RECORD_ENV] = path, which
                    root, calls[0] = tempfile.mkdtemp(), 0
                    with tbn.enable_dump_debug_info(root, mode, -1) as handle:
                        _train_tiny()
                    dumps[which] = _records(root)
                    print("records %s %s %s recorder: %d CUDA rows queued from Python, "
                          "%d errors" % (path, mode, which, calls[0], handle.errors))
                    failures += handle.errors
                if dumps["c"] != dumps["python"]:
                    failures += 1
                    print("MISMATCH: %s %s records differ between the recorders" % (path, mode))
    finally:
        encoder.Encoder.payload = payload
        os.environ.pop(recorder.RECORD_ENV, None)
    return failures


def main():
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 2
    if not kernels.triton_available():
        print("Triton is not importable: nothing to check")
        return 2
    print("device: %s, torch %s" % (torch.cuda.get_device_name(), torch.__version__))
    failures = compare()
    failures += sum(not capture_check(b) for b in ("cuda", "triton", "torch"))
    failures += record_check()
    print("comparisons: %s" % ("all identical" if not failures else "%d MISMATCHES" % failures))
    print("\n### Health row per tensor (float32)\n")
    print(time_rows())
    print("\n### Transformer encoder training step on the GPU\n")
    print(time_steps())
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
