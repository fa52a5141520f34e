"""Analysis of an indexed run: alerts, first bad tensor, root-cause story.

Public API (docs/internals.md): :func:`analyze_run`, :mod:`alerts`,
:mod:`health`. Imports neither torch nor tensorflow.
"""

from tb_numerics_plugin.analysis import alerts, health
from tb_numerics_plugin.analysis.summary import analyze_run

__all__ = ["alerts", "analyze_run", "health"]
