"""The PyTorch capture as the torch callbacks drive it: open, mark steps, close.

The transformers and Lightning callbacks are thin adapters over this class;
it owns the one rule they share: instrumentation never breaks the training
step, except the opt-in ``NonFiniteError`` that ``stop_on_nonfinite`` asks for.
"""

import logging

from tb_numerics_plugin.integrations import _options

_log = logging.getLogger("tb_numerics_plugin.integrations")


class TorchCapture:
    """One capture per training run, opened at its start and closed at its end.

    Args:
      dump_root: directory of the dump (one run; several trainings into the
        same root append to it).
      tensor_debug_mode: a mode of ``tb_numerics_plugin.torch.TENSOR_DEBUG_MODES``.
      trace_steps: None (trace every step), or steps and ranges, "2,5,10-20",
        "every:100" (see ``docs/torch.md``).
      stop_on_nonfinite: raise ``NonFiniteError`` from the training step when a
        non-finite value reaches the loss, a model output or an optimizer step.
      circular_buffer_size: keep the last N executions and traces (0 or -1:
        everything).
      trends: numerics over time (per module and step summaries of outputs and
        gradients, also between ``trace_steps`` windows): True every step, an
        int N every Nth step, False off.
      **capture_kwargs: more arguments of ``enable_dump_debug_info``.

    Raises:
      ValueError: a bad argument, naming it.
    """

    def __init__(self, dump_root, tensor_debug_mode, trace_steps, stop_on_nonfinite,
                 circular_buffer_size, trends, capture_kwargs):
        from tb_numerics_plugin import torch as tbn
        from tb_numerics_plugin import series
        from tb_numerics_plugin.torch import steps

        self.dump_root = _options.dump_root(dump_root)
        self.tensor_debug_mode = _options.choice("tensor_debug_mode", tensor_debug_mode,
                                                 tbn.TENSOR_DEBUG_MODES)
        steps.parse_trace_steps(trace_steps)  # refused now rather than when training starts
        self.trace_steps = trace_steps
        self.stop_on_nonfinite = _options.flag("stop_on_nonfinite", stop_on_nonfinite)
        self.circular_buffer_size = _options.integer("circular_buffer_size",
                                                     circular_buffer_size)
        series.check_trends(trends)
        self.trends = trends
        self._kwargs = dict(capture_kwargs)
        self._tbn = tbn
        self.handle = None
        self._warned = False

    def open(self):
        """Enables the capture (closing one this object left open by an exception)."""
        self.close()
        self.handle = self._tbn.enable_dump_debug_info(
            self.dump_root, tensor_debug_mode=self.tensor_debug_mode,
            circular_buffer_size=self.circular_buffer_size, trace_steps=self.trace_steps,
            stop_on_nonfinite=self.stop_on_nonfinite, trends=self.trends, **self._kwargs)
        return self.handle

    def mark_step(self, step):
        """Marks the start of training step ``step``.

        Raises:
          NonFiniteError: a non-finite value was seen (``stop_on_nonfinite``);
            the dump is closed first.
        """
        if self.handle is None:
            return
        try:
            self.handle.step(int(step))
        except self._tbn.NonFiniteError:
            self.close()
            raise
        except Exception as e:  # never break the user's step for our own failure
            if not self._warned:
                self._warned = True
                _log.warning("tb-numerics: could not mark step %s: %r", step, e)

    def close(self):
        """Flushes and closes the dump; does nothing when none is open."""
        handle, self.handle = self.handle, None
        if handle is None:
            return
        try:
            handle.close()
        except Exception as e:  # closing must not hide the exception being handled
            _log.warning("tb-numerics: could not close the dump %s: %r", self.dump_root, e)


class CaptureCallback:
    """What the torch callbacks share: their arguments and the handle; mixed in before the
    library's callback base class (docs in each callback)."""

    def __init__(self, dump_root, tensor_debug_mode="FULL_HEALTH", trace_steps=None,
                 stop_on_nonfinite=True, circular_buffer_size=-1, trends=True,
                 **capture_kwargs):
        self.capture = TorchCapture(dump_root, tensor_debug_mode, trace_steps,
                                    stop_on_nonfinite, circular_buffer_size, trends,
                                    capture_kwargs)

    @property
    def handle(self):
        """The active ``DumpHandle``, or None outside training."""
        return self.capture.handle

