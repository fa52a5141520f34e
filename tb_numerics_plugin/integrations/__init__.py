"""Callbacks that put the numerics capture into the training loops people run.

- :mod:`tb_numerics_plugin.integrations.transformers`: ``NumericsCallback``, a
  transformers ``TrainerCallback`` over the PyTorch capture;
- :mod:`tb_numerics_plugin.integrations.lightning`: ``NumericsCallback``, a
  Lightning ``Callback`` over the PyTorch capture;
- :mod:`tb_numerics_plugin.integrations.keras`: ``NumericsCallback``, a Keras
  ``Callback`` around TensorFlow's own ``enable_dump_debug_info``.

Each module imports its library (and torch or TensorFlow) when it is
imported; this package root imports neither. Docs: ``docs/integrations/``.
"""
