"""Capture overhead on CPU: one training step, uninstrumented vs instrumented.

Workloads: the torch demo's MLP (784-500-10, batch 100, SGD) and a small
transformer encoder (``nn.TransformerEncoder``, d_model 256, 4 heads, 4
layers, batch 16x128, Adam). Configurations: uninstrumented, every
tb-numerics mode but FULL_TENSOR (circular buffer 1000, the default), Hugging
Face's ``DebugUnderflowOverflow`` and ``torch.autograd.detect_anomaly``.
Rounds are interleaved (each round times every configuration once) so that
drifting machine load hits all of them alike; the table shows medians of the
per-step times and their ratio to uninstrumented.

    python bench/capture_overhead.py [--rounds 5] [--steps 2] [--threads 1] \
        [--docs docs/benchmarks.md]

``--docs`` rewrites the "Capture overhead" section of that file in place.
"""

import argparse
import contextlib
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time

import torch

import docs_section  # bench/, the script's own folder
from torch import nn

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.demo import torch_mnist

MODES = ("NO_TENSOR", "CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH", "SHAPE", "FULL_NUMERICS")


class _Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, dropout=0.0,
                                           batch_first=True)
        # the nested-tensor fast path is inference-only; keep training semantics explicit
        self.encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)

    def forward(self, x):
        return self.encoder(x).pow(2).mean()


def _mlp_workload():
    model = torch_mnist.Classifier(fix=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, labels = torch_mnist.synthetic_batch(torch.Generator().manual_seed(0))

    def step():
        optimizer.zero_grad()
        model(x, labels).backward()
        optimizer.step()

    return model, step


def _transformer_workload():
    torch.manual_seed(0)
    model = _Encoder()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(16, 128, 256)

    def step():
        optimizer.zero_grad()
        model(x).backward()
        optimizer.step()

    return model, step


WORKLOADS = {"MLP (demo)": _mlp_workload, "Transformer encoder": _transformer_workload}


def _configs(dump_root):
    """Returns [(name, setup(model) -> context manager factory)]."""
    configs = [("uninstrumented", lambda model: contextlib.nullcontext)]
    for mode in MODES:
        def setup(model, mode=mode):
            return lambda: tbn.enable_dump_debug_info(
                tempfile.mkdtemp(dir=dump_root), mode, circular_buffer_size=1000)
        configs.append((mode, setup))

    def hf(model):
        from transformers.debug_utils import DebugUnderflowOverflow

        DebugUnderflowOverflow(model)  # hooks stay on this model copy only
        return contextlib.nullcontext
    configs.append(("HF DebugUnderflowOverflow", hf))
    configs.append(("torch.autograd.detect_anomaly",
                    lambda model: lambda: torch.autograd.detect_anomaly(check_nan=True)))
    return configs


def measure(workload, rounds, steps, dump_root):
    """Returns {config name: [seconds per step]} for one workload."""
    prepared = []
    for name, setup in _configs(dump_root):
        model, step = WORKLOADS[workload]()
        prepared.append((name, step, setup(model)))
    times = {name: [] for name, _, _ in prepared}
    for _ in range(rounds):
        for name, step, context in prepared:
            with context() as handle:
                step()  # warm: first-sight costs (graphs, source files) are not steady state
                for _ in range(steps):
                    start = time.perf_counter()
                    step()
                    times[name].append(time.perf_counter() - start)
            if getattr(handle, "errors", 0):  # a timing of a failing capture means nothing
                raise RuntimeError("%s: %d capture errors" % (name, handle.errors))
    return times


def table(results):
    """Markdown table of medians and ratios, one column pair per workload."""
    workloads = list(results)
    head = "| configuration | " + " | ".join("%s ms | ×" % w for w in workloads) + " |"
    rule = "|---|" + "---:|---:|" * len(workloads)
    rows = [head, rule]
    for name in results[workloads[0]]:
        cells = []
        for w in workloads:
            base = statistics.median(results[w]["uninstrumented"])
            med = statistics.median(results[w][name])
            cells += ["%.1f" % (med * 1e3), "%.2f" % (med / base)]
        rows.append("| %s | %s |" % (name, " | ".join(cells)))
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--docs", default="")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = {}
    with tempfile.TemporaryDirectory() as dump_root:
        for workload in args.workloads.split(","):
            results[workload] = measure(workload, args.rounds, args.steps, dump_root)
    text = table(results)
    stamp = "%s, %s, %s, torch %s, %d thread(s), %d interleaved rounds x %d steps" % (
        datetime.date.today().isoformat(), platform.node(), platform.processor() or
        platform.machine(), torch.__version__, args.threads, args.rounds, args.steps)
    print(stamp)
    print(text)
    if args.docs:
        docs_section.write_section(
            args.docs, "Capture overhead",
            "Measured %s with `python bench/capture_overhead.py`.\n\n%s\n" % (stamp, text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
