"""What the capture adds to each module call, side by side with torch's own price for hooks.

The capture names ops after the module calls in progress through global module
forward hooks (``hooks.Scopes``). Any global hook sends every module call in the
process down ``nn.Module._call_impl``'s slow path, the capture's or not; this bench
separates that price from the capture's own. A root module of ``--blocks`` blocks,
each calling two leaf submodules, runs a forward that calls no op (the leaves return
their input), so the time is the module calls' alone. Configurations, timed in
interleaved rounds (medians of the rounds' best-of-``--repeat`` forwards):

- ``uninstrumented``;
- ``empty global hooks``: a pre-hook and an always-called post-hook with kwargs (as
  the capture registers them) that do nothing: torch's slow path;
- ``capture (NO_TENSOR)``: the capture's hooks (native hook, C recording).

    python bench/module_calls.py [--rounds 20] [--blocks 50] [--repeat 200]
"""

import argparse
import random
import statistics
import tempfile
import time

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from tb_numerics_plugin import torch as tbn

CONFIGS = ("uninstrumented", "empty global hooks", "capture (NO_TENSOR)")


class _Leaf(nn.Module):
    def forward(self, x):
        return x


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = _Leaf(), _Leaf()

    def forward(self, x):
        return self.b(self.a(x))


def _time(model, x, repeat):
    start = time.perf_counter()
    for _ in range(repeat):
        model(x)
    return (time.perf_counter() - start) / repeat


def _measure(name, model, x, repeat, dump_root):
    """Seconds per forward of ``model`` under configuration ``name``."""
    if name == "uninstrumented":
        return _time(model, x, repeat)
    if name == "empty global hooks":
        handles = [nn_module.register_module_forward_pre_hook(lambda module, args: None),
                   nn_module.register_module_forward_hook(
                       lambda module, args, kwargs, output=None: None, always_call=True,
                       with_kwargs=True)]
        try:
            return _time(model, x, repeat)
        finally:
            for handle in handles:
                handle.remove()
    with tbn.enable_dump_debug_info(tempfile.mkdtemp(dir=dump_root), "NO_TENSOR",
                                    circular_buffer_size=1000) as handle:
        model(x)  # the root's paths learned: first-sight costs are not steady state
        seconds = _time(model, x, repeat)
    if handle._session.errors:
        raise SystemExit("the capture logged errors")
    return seconds


def measure(rounds, blocks, repeat):
    """{configuration: [seconds per module call, one per round]}, and the calls per forward."""
    model, x = nn.Sequential(*[_Block() for _ in range(blocks)]), torch.zeros(4)
    calls = 1 + 3 * blocks
    times = {name: [] for name in CONFIGS}
    shuffler = random.Random(0)
    with tempfile.TemporaryDirectory() as dump_root:
        for _ in range(rounds):
            order = list(CONFIGS)
            shuffler.shuffle(order)
            for name in order:
                times[name].append(_measure(name, model, x, repeat, dump_root) / calls)
    return times, calls


def table(times, calls):
    med = {name: statistics.median(t) * 1e6 for name, t in times.items()}
    base = med["uninstrumented"]
    lines = ["| configuration (%d module calls per forward) | µs per module call | µs added |"
             % calls, "|---|---:|---:|"]
    for name in CONFIGS:
        lines.append("| %s | %.2f | %.2f |" % (name, med[name], med[name] - base))
    lines.append("| the capture's own (capture - empty global hooks) | | %.2f |"
                 % (med["capture (NO_TENSOR)"] - med["empty global hooks"]))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    times, calls = measure(args.rounds, args.blocks, args.repeat)
    print("%d interleaved rounds x %d forwards, torch %s, 1 thread\n"
          % (args.rounds, args.repeat, torch.__version__))
    print(table(times, calls))


if __name__ == "__main__":
    main()
