"""Reads tfdbg2 dumps (TF's or ours) incrementally into compact digests.

Public API (docs/internals.md): :class:`Logdir`, :class:`RunReader`,
:class:`DumpError`, :class:`RecordUnavailable`. Imports neither torch nor tensorflow.
"""

from tb_numerics_plugin.reader.fileset import RecordUnavailable
from tb_numerics_plugin.reader.logdir import DumpError, Logdir
from tb_numerics_plugin.reader.run import RunReader

__all__ = ["DumpError", "Logdir", "RecordUnavailable", "RunReader"]
