"""Where the native capture's step time goes: its parts taken away one at a time, side by side.

``capture_overhead.py`` times whole captures; this bench splits one (native hook,
C recording) on a training step of ``capture_workloads``' workloads into what
each part adds, from six configurations timed in interleaved rounds, all on one
instance of the workload (its model and optimizer):

- ``uninstrumented``;
- ``empty native hook`` (``capture_overhead.EmptyHook``): the hook's dispatch-key
  fallback, its verdicts, and each op it would record handed to a Python
  function that does nothing;
- ``empty global hooks``: module forward pre- and post-hooks and optimizer step
  pre- and post-hooks that do nothing, registered as the capture registers its own
  (torch's slow path for modules and optimizers with global hooks);
- ``capture, no ops``: the capture with its native hook uninstalled after
  enabling it: the module and optimizer hooks open and finish their executions,
  no op is recorded;
- ``capture, executions not finished``: every op recorded, ``Segment.finish``
  (encoding and writing an execution's records) replaced by a no-op;
- ``capture``: all of it.

The second table derives the parts from the medians: the hook's floor (empty
hook - uninstrumented), the executions without their ops (no ops -
uninstrumented; of which torch's slow path for global hooks is empty global hooks -
uninstrumented), recording the ops (capture - no ops - floor; per recorded op,
with the recorded outputs counted per step from the session's tensor ids), and
finishing the executions (capture - not finished). The parts come from
differences of medians: they need not add up exactly, and a part near the
noise (a few µs) says only that it is small.

One instance, not one per configuration: instances built alike ran apart by
2-3% in one process (docs/benchmarks.md, the 2026-12-06 eighth session's section),
as much as a part of a few tens of µs. The captures leave
their tags on the instance's parameters; a later session reads them as values from
outside its executions, as it reads the earlier steps' own.

The two capture variants reach into the session (its hook handle, the
``Segment`` class); the bench is the only place that does.

    python bench/capture_parts.py [--rounds 60] [--steps 10] [--mode NO_TENSOR] \
        [--workload "MLP (demo)"]
"""

import argparse
import contextlib
import random
import statistics
import tempfile
import time

import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

import capture_overhead  # bench/, the script's own folder
import capture_workloads
from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.torch import native, segments

CONFIGS = ("uninstrumented", "empty native hook", "empty global hooks", "capture, no ops",
           "capture, executions not finished", "capture")


@contextlib.contextmanager
def _configured(name, mode, dump_root):
    """Runs its body under configuration ``name``; yields the session (None outside a capture)."""
    if name == "uninstrumented":
        yield None
        return
    if name == "empty native hook":
        with capture_overhead.EmptyHook(native.load()):
            yield None
        return
    if name == "empty global hooks":
        with _empty_global_hooks():
            yield None
        return
    with capture_overhead._variable(capture_overhead.PATH_VARIABLE, "native"), \
            capture_overhead._variable(capture_overhead.RECORDER_VARIABLE, "c"):
        handle = tbn.enable_dump_debug_info(tempfile.mkdtemp(dir=dump_root), mode,
                                            circular_buffer_size=1000)
    session = handle._session
    finish = segments.Segment.finish
    try:
        if handle.capture_path != "native":
            raise SystemExit("the capture ran on the %s path" % handle.capture_path)
        if name == "capture, no ops":
            hook = session._mode
            hook._module.uninstall(hook._handle)
            hook._handle = None
        elif name == "capture, executions not finished":
            segments.Segment.finish = lambda self, rows: None
        yield session
    finally:
        segments.Segment.finish = finish
        handle.close()
    if session.errors:
        raise SystemExit("%s: %d capture errors" % (name, session.errors))


@contextlib.contextmanager
def _empty_global_hooks():
    """Global module and optimizer hooks that do nothing, registered with the capture's
    options (``hooks.Scopes.register``)."""
    handles = [
        nn_module.register_module_forward_pre_hook(lambda module, args: None),
        nn_module.register_module_forward_hook(lambda module, args, kwargs, output=None: None,
                                              always_call=True, with_kwargs=True),
        optim_module.register_optimizer_step_pre_hook(lambda opt, args, kwargs: None),
        optim_module.register_optimizer_step_post_hook(lambda opt, args, kwargs: None),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def measure(workload, mode, rounds, steps):
    """Returns ({configuration: [seconds per step]}, recorded outputs per step)."""
    step = capture_workloads.WORKLOADS[workload][0]()[1]  # one instance for all (see above)
    times = {name: [] for name in CONFIGS}
    outputs = []
    shuffler = random.Random(0)
    with tempfile.TemporaryDirectory() as dump_root:
        for _ in range(rounds):
            order = list(CONFIGS)
            shuffler.shuffle(order)  # no configuration always runs right after another
            for name in order:
                with _configured(name, mode, dump_root) as session:
                    step()  # warm: first-sight costs are not steady state
                    first = session.tensor_ids.peek() if name == "capture" else None
                    for _ in range(steps):
                        start = time.perf_counter()
                        step()
                        times[name].append(time.perf_counter() - start)
                    if first is not None:
                        outputs.append((session.tensor_ids.peek() - first) / steps)
    return times, statistics.median(outputs)


def tables(times, outputs, workload, mode):
    """The two markdown tables: the configurations, then the parts derived from them."""
    med = {name: statistics.median(t) * 1e6 for name, t in times.items()}
    base = med["uninstrumented"]
    lines = ["| configuration (%s, %s) | µs / step | × | µs added |" % (workload, mode),
             "|---|---:|---:|---:|"]
    for name in CONFIGS:
        lines.append("| %s | %.0f | %.3f | %.0f |" % (name, med[name], med[name] / base,
                                                     med[name] - base))
    floor = med["empty native hook"] - base
    recording = med["capture"] - med["capture, no ops"] - floor
    parts = [
        ("the hook's floor (empty hook)", floor),
        ("executions without their ops (module and optimizer hooks, switches)",
         med["capture, no ops"] - base),
        ("  of which torch's slow path for global hooks (empty global hooks)",
         med["empty global hooks"] - base),
        ("recording the ops (%.0f recorded outputs per step: %.1f µs each)"
         % (outputs, recording / outputs if outputs else float("nan")), recording),
        ("finishing the executions (encoding, writing)",
         med["capture"] - med["capture, executions not finished"]),
    ]
    lines += ["", "| part | µs / step |", "|---|---:|"]
    lines += ["| %s | %.0f |" % part for part in parts]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--mode", default="NO_TENSOR")
    parser.add_argument("--workload", default="MLP (demo)",
                        choices=[w for w, (_, kind) in capture_workloads.WORKLOADS.items()
                                 if kind == "step"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if native.load() is None:
        raise SystemExit("the native hook is unavailable: %s" % native.failure())
    times, outputs = measure(args.workload, args.mode, args.rounds, args.steps)
    print("%d interleaved rounds x %d steps, torch %s, 1 thread\n"
          % (args.rounds, args.steps, torch.__version__))
    print(tables(times, outputs, args.workload, args.mode))


if __name__ == "__main__":
    main()
