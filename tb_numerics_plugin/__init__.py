"""tb-numerics: a numerics debugger for deep-learning training.

The package root stays light: importing it pulls in neither torch nor
tensorflow. The PyTorch capture lives in ``tb_numerics_plugin.torch``.
"""

__version__ = "0.1.0"
