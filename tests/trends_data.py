"""Numerics series for tests, written with the real encoder (series.SeriesWriter) beside a
real dump of tests/dumps.py.

Stats come from numpy arrays through the raw health layout (docs/format.md)
and ``series.merge_raw``, the path the torch capture takes.
"""

import os

import numpy as np

import dumps
from tb_numerics_plugin import series

GROWING = "model.layers.0.mlp"
STEADY = "model.layers.1.mlp"


def stats(values, dtype):
    """The summary of one tensor, as the capture writes it."""
    return series.merge_raw([series.raw_row(values)], dtype)


def tensor(step, scale=1.0, rate=1.0):
    """A small tensor whose abs max is ``scale * rate ** step``."""
    return np.array([-0.5, 0.25, 1.0, -0.75]) * scale * rate ** step


def write_steps(path, steps, modules, kind="output", part=None):
    """Writes one event per step.

    Args:
      path: the series file.
      steps: iterable of ints.
      modules: ``{module: (dtype, f(step) -> numpy array or None)}``; None skips
        the module at that step.

    Returns:
      the (closed) SeriesWriter.
    """
    writer = series.SeriesWriter(path, part)
    for step in steps:
        summaries = []
        for module, (dtype, make) in modules.items():
            values = make(step)
            if values is not None:
                summaries.append((kind, module, dtype, stats(values, dtype)))
        writer.write_step(step, summaries, wall_time=1000.0 + step)
    writer.close()
    return writer


def dump_with_series(root, steps=range(10, 61), host="testhost", part=None, rate=1.1):
    """A dumps.write_dump dump plus its series: GROWING (float16, abs max 120 * rate**(s-10))
    and STEADY (float32, constant), output kind. Returns the series path."""
    writer = dumps.write_dump(root, host=host, part=part)
    path = series.path_for(writer.prefix)
    write_steps(path, steps, {
        GROWING: ("float16", lambda s: tensor(s - 10, 120.0, rate)),
        STEADY: ("float32", lambda s: tensor(0, 3.0)),
    })
    return path


def prefix_of(root):
    """The file-set prefix of the one dump under ``root``."""
    (name,) = [n for n in os.listdir(root) if n.endswith(".metadata")]
    return os.path.join(root, name[: -len(".metadata")])
