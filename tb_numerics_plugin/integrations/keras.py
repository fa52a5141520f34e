"""A Keras ``Callback`` that dumps a TF ``model.fit`` with TensorFlow's own tfdbg2.

    from tb_numerics_plugin.integrations.keras import NumericsCallback
    model.fit(x, y, callbacks=[NumericsCallback("/tmp/dump")])
    # raises NonFiniteError after the first batch whose loss is NaN/inf

TensorFlow writes the dump (``tf.debugging.experimental.enable_dump_debug_info``);
tb-numerics reads it. TF dumps carry no step: the exception names the epoch and
batch that stopped the fit. With ``trends`` the callback also writes, per
batch and per layer, a summary of the layer's weights (abs-max, min/max, mean,
std, non-finite count) as the dump's numerics series (``series.py``): Keras's
fit shows a callback neither activations nor gradients. Importing this module
imports Keras (and so TensorFlow), never torch. Docs: ``docs/integrations/keras.md``.
"""

import glob
import logging
import math
import os
import sys

import keras
import numpy as np
import tensorflow as tf

from tb_numerics_plugin import series
from tb_numerics_plugin.integrations import _options, _story

__all__ = ["NumericsCallback", "NonFiniteError", "TENSOR_DEBUG_MODES"]

# TensorFlow's modes (FULL_NUMERICS is ours: TF never implemented it).
TENSOR_DEBUG_MODES = ("NO_TENSOR", "CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH", "SHAPE",
                      "FULL_TENSOR")
_log = logging.getLogger("tb_numerics_plugin.integrations")


class NonFiniteError(RuntimeError):
    """The loss of a Keras fit became NaN or infinite.

    Attributes:
      step: None (TensorFlow dumps record no step).
      epoch, batch: where the fit stopped (0-based, as Keras counts).
      loss: the non-finite loss value.
      report: ``analyze_run`` of the dump (None if it could not be read).
    """

    def __init__(self, message, epoch, batch, loss, report):
        super().__init__(message)
        self.step = None
        self.epoch = epoch
        self.batch = batch
        self.loss = loss
        self.report = report


def _loss_value(logs):
    """``logs["loss"]`` as a float, or None when absent or not a number."""
    value = (logs or {}).get("loss")
    if value is None:
        return None
    try:
        return float(np.asarray(value))
    except (TypeError, ValueError):
        return None


class NumericsCallback(keras.callbacks.Callback):
    """Enables tfdbg2 dumping for ``model.fit`` and stops it at a non-finite loss.

    The dump is enabled at ``on_train_begin`` and disabled (which flushes it)
    at ``on_train_end``. With ``stop_on_nonfinite``, a batch whose
    ``logs["loss"]`` is NaN or infinite disables the dump, prints the first
    bad tensor found in it to stderr, sets ``model.stop_training`` and raises
    :class:`NonFiniteError` out of ``model.fit``.

    XLA cannot compile tfdbg2's instrumentation ops (TF 2.21 fails the fit
    with "tf2xla conversion failed"): a model compiled with ``jit_compile=True``
    has its train function rebuilt without XLA for this fit, with a warning.

    Args:
      dump_root: directory of the dump.
      tensor_debug_mode: one of ``TENSOR_DEBUG_MODES`` (default "FULL_HEALTH").
      circular_buffer_size: keep only the last N executions and traces;
        -1 (default) keeps everything.
      stop_on_nonfinite: raise at the first non-finite loss (default True).
      trends: write a weights summary per layer every batch (True), every
        Nth batch (an int N >= 1) or never (False).
      **tf_kwargs: more arguments of TF's ``enable_dump_debug_info``
        (``op_regex``, ``tensor_dtypes``).

    Raises:
      ValueError: a bad argument, naming it.
    """

    def __init__(self, dump_root, tensor_debug_mode="FULL_HEALTH", circular_buffer_size=-1,
                 stop_on_nonfinite=True, trends=True, **tf_kwargs):
        super().__init__()
        self.dump_root = _options.dump_root(dump_root)
        self.tensor_debug_mode = _options.choice("tensor_debug_mode", tensor_debug_mode,
                                                 TENSOR_DEBUG_MODES)
        self.circular_buffer_size = _options.integer("circular_buffer_size",
                                                     circular_buffer_size)
        self.stop_on_nonfinite = _options.flag("stop_on_nonfinite", stop_on_nonfinite)
        self.trends = series.check_trends(trends)
        self._tf_kwargs = dict(tf_kwargs)
        self._enabled = False
        self._epoch = 0
        self._step = 0  # batches seen by this callback, across epochs and fits
        self._series = None
        self._known_sets = set()  # file sets in dump_root before this callback enabled its own

    def on_train_begin(self, logs=None):
        if self.model is not None and getattr(self.model, "jit_compile", False):
            _log.warning("tb-numerics: XLA cannot compile tfdbg2's instrumentation; this "
                         "fit runs without jit_compile")
            self.model.jit_compile = False
            self.model.make_train_function(force=True)
        self._known_sets = set(_metadata_files(self.dump_root))
        tf.debugging.experimental.enable_dump_debug_info(
            self.dump_root, tensor_debug_mode=self.tensor_debug_mode,
            circular_buffer_size=self.circular_buffer_size, **self._tf_kwargs)
        self._enabled = True

    def _write_trends(self, step):
        """Writes the weights summary of ``step`` (never raises into the fit)."""
        if not self.trends or step % self.trends or self.model is None:
            return
        try:
            if self._series is None:
                prefix = _file_set_prefix(self.dump_root, self._known_sets)
                if prefix is None:
                    return  # TF has not created its files yet
                self._series = series.SeriesWriter(series.path_for(prefix))
            self._series.write_step(step, weight_summaries(self.model))
        except Exception as e:  # a summary must never break the fit
            _log.warning("tb-numerics: weights summary of batch %d failed: %r", step, e)
            self.trends = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        step, self._step = self._step, self._step + 1
        self._write_trends(step)
        if not self.stop_on_nonfinite:
            return
        loss = _loss_value(logs)
        if loss is None or math.isfinite(loss):
            return
        self._disable()
        headline = "loss is %s at epoch %d, batch %d; the fit stops" % (loss, self._epoch, batch)
        report = None
        try:
            report = _story.analyze(self.dump_root)
            print("\n".join(_story.lines(report, headline)), file=sys.stderr)
        except Exception as e:  # the stop must happen even if the dump is unreadable
            print("tb-numerics: %s (the dump %s could not be analyzed: %r)"
                  % (headline, self.dump_root, e), file=sys.stderr)
        if self.model is not None:
            self.model.stop_training = True
        raise NonFiniteError("non-finite loss %s at epoch %d, batch %d; dump: %s"
                             % (loss, self._epoch, batch, self.dump_root),
                             self._epoch, batch, loss, report)

    def on_train_end(self, logs=None):
        self._disable()

    def _disable(self):
        if self._series is not None:
            self._series.close()
        if self._enabled:
            self._enabled = False
            tf.debugging.experimental.disable_dump_debug_info()


def _metadata_files(dump_root):
    return glob.glob(os.path.join(glob.escape(dump_root), "*.metadata"))


def _file_set_prefix(dump_root, known):
    """The path prefix of the file set TF created in ``dump_root`` for this fit (the newest
    one not in ``known``, else the newest), or None before TF created one."""
    found = _metadata_files(dump_root)
    new = [f for f in found if f not in known] or found
    if not new:
        return None
    return max(new, key=os.path.getmtime)[: -len(".metadata")]


def _leaf_layers(layer, path=""):
    """``(path, layer)`` of every layer under ``layer`` that holds no sublayers, paths
    joined with dots from the model (``block.dense_1``)."""
    for sub in getattr(layer, "layers", None) or ():
        sub_path = sub.name if not path else path + "." + sub.name
        if getattr(sub, "layers", None):
            yield from _leaf_layers(sub, sub_path)
        else:
            yield sub_path, sub


def weight_summaries(model):
    """``[("weight", layer path, dtype, stats)]`` of every leaf layer that has weights.

    All of a layer's weights (kernel, bias, ...) merge into one summary; its
    dtype is that of the first weight.
    """
    out = []
    for path, layer in _leaf_layers(model):
        weights = list(getattr(layer, "weights", None) or ())
        if not weights:
            continue
        arrays = [np.asarray(keras.ops.convert_to_numpy(w)) for w in weights]
        dtype = str(arrays[0].dtype)
        rows = [series.raw_row(a) for a in arrays]
        out.append(("weight", path, dtype, series.merge_raw(rows, dtype)))
    return out
