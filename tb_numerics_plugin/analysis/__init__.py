"""Analysis of an indexed run: alerts, first bad tensor, root-cause story.

Public API (docs/internals.md): :func:`analyze_run`, :mod:`alerts`,
:mod:`health`. Imports neither torch nor tensorflow.
"""
