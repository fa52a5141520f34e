"""Cost of a training step outside a ``trace_steps`` window, beside no capture and full capture.

One process runs the same 1,000-step training loop (the torch demo's MLP,
784-500-10, batch 100, SGD; or a small transformer encoder) five ways:
uninstrumented; captured with ``trace_steps=[999]`` (paused for steps 0-998,
``handle.step()`` called every step), with ``trends`` off, with
``trends=True`` (numerics over time summarized at every step, also outside
the window) and with ``trends=10``; captured at every step (FULL_HEALTH, ring
of 1000). The configurations alternate in blocks of ``--block`` steps
(A B C D E, then E D C B A, ...) so that drifting machine load hits them alike; each
captured configuration is enabled for its block and disabled after it, which
appends to one file set per configuration and keeps the step numbers going.
The table shows the median step time and its ratio to uninstrumented; for the
windowed run, the median outside the window (the target: at most 1.05x) and
the traced step.

    python bench/step_windows.py [--steps 1000] [--block 50] [--model mlp|encoder] [--threads 1]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

from capture_workloads import Encoder  # bench/, the script's own folder
from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.demo import torch_mnist


def _workload(name):
    """Returns a function running one training step."""
    if name == "mlp":
        model = torch_mnist.Classifier(fix=True)
        x, labels = torch_mnist.synthetic_batch(torch.Generator().manual_seed(0))
        args = (x, labels)
    else:
        model = Encoder(d_model=64, heads=4, feedforward=128, layers=2)
        args = (torch.randn(8, 32, 64, generator=torch.Generator().manual_seed(0)),)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        optimizer.zero_grad()
        model(*args).backward()
        optimizer.step()

    return step


def _run(step, numbers, handle=None):
    """Per-step wall times (seconds) of the steps ``numbers``; marks them on ``handle``."""
    times = []
    for i in numbers:
        t0 = time.perf_counter()
        if handle is not None:
            handle.step(i)
        step()
        times.append(time.perf_counter() - t0)
    return times


_TRENDS = {"window": False, "trends": True, "trends10": 10}  # windowed configurations


def _block(name, step, numbers, dump_root, last):
    if name == "none":
        return _run(step, numbers)
    kwargs = dict(tensor_debug_mode="FULL_HEALTH", circular_buffer_size=1000)
    if name in _TRENDS:
        kwargs["trace_steps"] = [last]
        kwargs["trends"] = _TRENDS[name]
    with tbn.enable_dump_debug_info(os.path.join(dump_root, name), **kwargs) as handle:
        return _run(step, numbers, handle)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--block", type=int, default=50)
    parser.add_argument("--model", choices=("mlp", "encoder"), default="mlp")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    step = _workload(args.model)
    _run(step, range(20))  # warm-up: allocator, kernels
    names = ["none", "window", "trends", "trends10", "full"]
    times = {n: [] for n in names}
    last = args.steps - 1
    with tempfile.TemporaryDirectory() as dump_root:
        for r, begin in enumerate(range(0, args.steps, args.block)):
            numbers = range(begin, min(begin + args.block, args.steps))
            for name in names if r % 2 == 0 else names[::-1]:
                times[name].extend(_block(name, step, numbers, dump_root, last))
    inside = [times["window"].pop(last)]
    times["trends"].pop(last)
    times["trends10"].pop(last)
    base = statistics.median(times["none"])
    print("model %s, %d steps in blocks of %d, torch %s, %d thread(s)" % (
        args.model, args.steps, args.block, torch.__version__, args.threads))
    print("%-52s %12s %8s" % ("configuration", "median ms", "ratio"))
    rows = [("no capture", times["none"]),
            ("trace_steps=[%d], outside the window, trends off" % last, times["window"]),
            ("trace_steps=[%d], outside the window, trends on" % last, times["trends"]),
            ("trace_steps=[%d], outside the window, trends=10" % last, times["trends10"]),
            ("trace_steps=[%d], the traced step" % last, inside),
            ("full capture (FULL_HEALTH, ring 1000)", times["full"])]
    for label, values in rows:
        med = statistics.median(values)
        print("%-52s %12.3f %7.3fx" % (label, med * 1e3, med / base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
