"""A transformers ``TrainerCallback`` that dumps the numerics of a ``Trainer`` run.

    from tb_numerics_plugin.integrations.transformers import NumericsCallback
    trainer = Trainer(model, args, train_dataset=data,
                      callbacks=[NumericsCallback("/tmp/dump", trace_steps="every:100")])
    trainer.train()   # raises NonFiniteError at the first NaN/inf step

Importing this module imports torch and transformers, never TensorFlow.
Docs: ``docs/integrations/transformers.md``.
"""

import transformers

from tb_numerics_plugin.integrations._capture import CaptureCallback
from tb_numerics_plugin.torch import NonFiniteError

__all__ = ["NumericsCallback", "NonFiniteError"]


class NumericsCallback(CaptureCallback, transformers.TrainerCallback):
    """Captures the training with ``tb_numerics_plugin.torch`` and marks each step.

    The capture is enabled at ``on_train_begin``, each optimizer step is marked
    with ``state.global_step`` at ``on_step_begin``, and the dump is closed at
    ``on_train_end``. With ``stop_on_nonfinite`` the capture raises
    ``NonFiniteError`` from the training step in which a non-finite value
    reaches the loss, a model output or an optimizer step: it propagates out of
    ``trainer.train()`` after the dump was flushed and the first bad tensor
    printed to stderr.

    Args:
      dump_root: directory of the dump.
      tensor_debug_mode: "FULL_HEALTH" (default) or another mode of
        ``tb_numerics_plugin.torch.TENSOR_DEBUG_MODES``.
      trace_steps: None (every step traced), or steps and ranges such as
        ``[0, range(100, 110)]``, ``"2,5,10-20"`` or ``"every:100"``.
      stop_on_nonfinite: raise ``NonFiniteError`` at the first non-finite
        value (default True).
      circular_buffer_size: keep only the last N executions and traces;
        -1 (default) keeps everything.
      trends: numerics over time, per module and step (the Trends view and
        the Scalars tab): True (default) every step, an int N every Nth
        step, False off.
      **capture_kwargs: more arguments of ``enable_dump_debug_info``
        (``op_regex``, ``tensor_dtypes``, ...).

    Raises:
      ValueError: a bad argument, naming it.
    """

    def on_train_begin(self, args, state, control, **kwargs):
        self.capture.open()

    def on_step_begin(self, args, state, control, **kwargs):
        self.capture.mark_step(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self.capture.close()

    def close(self):
        """Closes the dump; for a ``trainer.train()`` that ended with an exception
        (the Trainer calls no callback then: the dump is otherwise closed at exit)."""
        self.capture.close()
