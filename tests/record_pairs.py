"""Records of one program on the C recorder and on the Python recorder, for comparison.

Shared by the ``test_torch_record_c*`` modules (tests/ is on ``sys.path``):
``both`` runs a program's training under each recorder and reads the files
whose records must agree; ``events`` reads one TFRecord file into ``Event``s
that compare byte for byte after their wall time.
"""

import glob
import os

import torch
from torch import nn

from tb_numerics_plugin import records
from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.torch import recorder

# the files whose records must agree (metadata carries a run id, source files are shared)
COMPARED = ("execution", "graph_execution_traces", "graphs", "stack_frames")


class Event:
    """One record: its bytes after the wall time (field 1, a double: protobuf writes it
    first), compared byte for byte, and the parsed DebugEvent."""

    def __init__(self, payload):
        assert payload[:1] == b"\x09"  # every event the capture writes carries a wall time
        self.rest = payload[9:]
        self.event = debug_event_pb2.DebugEvent.FromString(payload)

    def __eq__(self, other):
        return self.rest == other.rest

    def __repr__(self):
        return repr(self.event)

    def __getattr__(self, name):
        return getattr(self.event, name)


def events(path):
    """The records of one TFRecord file, as a list of ``Event``s in file order."""
    return [Event(payload) for _, payload in records.scan(path).records]


def both(tmp_path, mode, program, monkeypatch):
    """The records of ``program()``'s training run on each recorder, run from one line
    (call sites are part of the records).

    Args:
      tmp_path: the folder under which the runs are dumped (``c/`` and ``python/``).
      mode: the tensor debug mode, e.g. ``"FULL_HEALTH"``.
      program: called once per recorder; returns the ``train()`` to run under capture.
      monkeypatch: sets ``TB_NUMERICS_RECORD`` for each run (left at ``"python"``).

    Returns:
      ``(c, python)``: for each, the ``Event``s of each kind in ``COMPARED``, by kind.
    """
    dumps = {}
    for which in ("c", "python"):
        monkeypatch.setenv(recorder.RECORD_ENV, which)
        root = tmp_path / which
        train = program()
        with tbn.enable_dump_debug_info(str(root), mode, circular_buffer_size=-1) as handle:
            train()
        assert handle._session.errors == 0
        dumps[which] = {}
        for kind in COMPARED:
            (path,) = glob.glob(os.path.join(str(root), "**", "*." + kind), recursive=True)
            dumps[which][kind] = events(path)
    return dumps["c"], dumps["python"]


def same_ops(tmp_path, program, monkeypatch):
    """The NO_TENSOR records of ``program`` on each recorder (as ``both`` runs it),
    checked equal.

    Returns:
      The input names of each op the C run created, as ``{op name: [input names]}``.
    """
    c, py = both(tmp_path, "NO_TENSOR", program, monkeypatch)
    for kind in COMPARED:
        assert c[kind] == py[kind], kind
    return {e.graph_op_creation.op_name: list(e.graph_op_creation.input_names)
            for e in c["graphs"] if e.HasField("graph_op_creation")}


def mlp():
    """A seeded two-layer Tanh MLP (4 -> 6 -> 2) and a batch of 3 inputs for it."""
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2)), torch.randn(3, 4)
