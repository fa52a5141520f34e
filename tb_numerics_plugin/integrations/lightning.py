"""A Lightning ``Callback`` that dumps the numerics of a ``Trainer.fit`` run.

    from tb_numerics_plugin.integrations.lightning import NumericsCallback
    trainer = lightning.Trainer(callbacks=[NumericsCallback("/tmp/dump")])
    trainer.fit(model, data)   # raises NonFiniteError at the first NaN/inf step

Importing this module imports torch and lightning, never TensorFlow.
Docs: ``docs/integrations/lightning.md``.
"""

import lightning.pytorch as pl

from tb_numerics_plugin.integrations._capture import CaptureCallback
from tb_numerics_plugin.torch import NonFiniteError

__all__ = ["NumericsCallback", "NonFiniteError"]


class NumericsCallback(CaptureCallback, pl.Callback):
    """Captures the fit with ``tb_numerics_plugin.torch`` and marks each step.

    The capture is enabled at ``on_train_start``, each batch is marked with
    ``trainer.global_step`` at ``on_train_batch_start``, and the dump is closed
    at ``on_train_end`` or, when the fit ends with an exception (such as the
    ``NonFiniteError`` that ``stop_on_nonfinite`` raises from the training
    step), at ``on_exception``. Lightning re-raises that exception from
    ``trainer.fit()``.

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
      **capture_kwargs: more arguments of ``enable_dump_debug_info``.

    Raises:
      ValueError: a bad argument, naming it.
    """

    def on_train_start(self, trainer, pl_module):
        self.capture.open()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.capture.mark_step(trainer.global_step)

    def on_train_end(self, trainer, pl_module):
        self.capture.close()

    def on_exception(self, trainer, pl_module, exception):
        self.capture.close()
