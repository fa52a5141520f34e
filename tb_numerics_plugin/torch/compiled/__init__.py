"""Compiled regions under the capture: health computed inside the compiled graphs.

Without this, a ``torch.compile``d model runs eagerly under the capture (a
dispatch mode de-compiles what it sees). With it, the dispatch mode lets
Dynamo compile (``mode.CompiledCaptureMode``; the native hook sets no
``force_eager`` stance and records nothing while torch.compile compiles) and
inductor runs two passes:

- :class:`InstrumentPass` (``pre_grad_custom_pass``) on each forward graph
  Dynamo hands it, torch-level, before AOTAutograd: every call node that
  yields tensors becomes an op of the record, with its op type (``linear``,
  ``masked_fill``), its module path (``nn_module_stack``) and its source
  lines (``stack_trace``: the model library's own lines);
- :class:`BackwardPass` (``post_grad_custom_post_pass``) on each backward
  graph AOTAutograd made: every aten node that is not a view becomes an op,
  named by its forward node's module path and pointing at its forward line.

After each traced value the passes add ``custom_ops.health_row`` (the
capture's health kernel, one pass over the value), and at the end of the
graph one op that hands all rows, once per compiled call, to the session's
``record.CompiledCalls``: ``custom_ops.emit`` (an ordered side effect, which
inductor keeps) in forward graphs, ``custom_ops.emit_backward`` (declared as
writing its argument, for the same reason) in backward graphs. The session
records the graph's ops into the open execution as if they had run eagerly.
``emit`` also takes the values the graph returns, which the session tags as
their ops' outputs, and the inputs the graph's ops read, whose tags name
their producers: data flow crosses the compiled call as it crosses eager ops.

Ops that compiled code calls through the dispatcher (inductor's extern
kernels, fallbacks, the health rows and the emits) come from its generated
Python file and are not recorded one by one (``frames.called_from_compiled``).

Code compiled before the capture starts carries no health: the capture drops
Dynamo's caches when it starts and again when it stops
(``torch.compiler.reset``), so compiled regions are compiled again, with the
passes and then without them.

The modules: ``custom_ops`` (the ops graphs call, and the session they reach),
``table`` (a graph's nodes read as the record's ops), ``instrument`` (the
passes' changes to a graph), ``frames`` (which frames are compiled code, and
whose call runs them), ``record`` (a compiled call recorded by the session);
this module installs and removes the passes.
"""

import os
import sys

import torch

from tb_numerics_plugin.torch.compiled.custom_ops import State
from tb_numerics_plugin.torch.compiled.instrument import instrument, instrument_backward
from tb_numerics_plugin.torch.compiled.table import LEVELS

# Modes a compiled region can serve: FULL_TENSOR would copy every value out
# of the graph, so under it compiled regions still run eagerly.
MODES = ("NO_TENSOR", "SHAPE") + tuple(LEVELS)


def _pass_base():
    from torch._inductor.custom_graph_pass import CustomGraphPass

    return CustomGraphPass


class InstrumentPass(_pass_base()):
    """Inductor's ``pre_grad_custom_pass`` while a capture is on: :func:`instrument`."""

    _instrument = staticmethod(instrument)
    _what = "instrumenting a compiled graph"  # the model still compiles, without health

    def __init__(self, session):
        self._session = session

    def __deepcopy__(self, memo):
        # torch.compile copies inductor's config (deepcopy) when it is called: a call made
        # while the capture is on shares this pass instead of copying the session
        return self

    def __call__(self, graph):
        session = State.session
        if session is None:
            return
        try:
            self._instrument(graph, session)
        except Exception as exc:
            session.fail(self._what, exc)

    def uuid(self):
        # Graphs cached by inductor name keys of this process's registry.
        return "tb_numerics:%d:%d:%s" % (os.getpid(), id(self._session),
                                         self._session.encoder.mode)


class BackwardPass(InstrumentPass):
    """Inductor's ``post_grad_custom_post_pass`` while a capture is on:
    :func:`instrument_backward`."""

    _instrument = staticmethod(instrument_backward)
    _what = "instrumenting a compiled backward graph"  # it still compiles, untraced

    def uuid(self):
        return "backward:" + super().uuid()


_CONFIGS = (("pre_grad_custom_pass", InstrumentPass), ("post_grad_custom_post_pass", BackwardPass))


def install(session):
    """Makes compiled regions compile with :class:`InstrumentPass` and
    :class:`BackwardPass` for ``session`` (after any passes already configured)."""
    from torch._inductor import config

    with State.lock:
        if State.installed is None:
            State.installed = [getattr(config, name) for name, _ in _CONFIGS]
            for name, kind in _CONFIGS:
                prior, ours = getattr(config, name), kind(session)
                if prior is None:
                    setattr(config, name, ours)
                elif isinstance(prior, (list, tuple)):
                    setattr(config, name, tuple(prior) + (ours,))
                else:
                    setattr(config, name, (prior, ours))
        State.session = session
    _reset_dynamo()


def uninstall(session):
    """Undoes :func:`install`; code compiled meanwhile is dropped (compiled again, plain)."""
    from torch._inductor import config

    with State.lock:
        if State.session is not session:
            return
        State.session = None
        if State.installed is not None:
            for (name, _), prior in zip(_CONFIGS, State.installed):
                setattr(config, name, prior)
            State.installed = None
    _reset_dynamo()


def _reset_dynamo():
    if "torch._dynamo" in sys.modules:
        torch.compiler.reset()
