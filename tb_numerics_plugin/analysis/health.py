"""Health vectors: decoding and badness (``decode(mode, values, dtype=None) -> Health``).

The implementation lives in :mod:`tb_numerics_plugin.reader.health`, because
the reader builds digests with it and dependencies point from analysis to
reader, never back. This module is the name docs/internals.md gives it.
"""

from tb_numerics_plugin.reader.health import (
    DTYPE_MAX,
    DTYPE_NAMES,
    FULL_HEALTH_WIDTH,
    HEALTH_MODES,
    MODE_CODES,
    MODE_NAMES,
    bad_mask,
    counts_of_array,
    decode,
    dtype_name,
    json_float,
    mode_name,
)

__all__ = [
    "DTYPE_MAX", "DTYPE_NAMES", "FULL_HEALTH_WIDTH", "HEALTH_MODES", "MODE_CODES", "MODE_NAMES",
    "bad_mask", "counts_of_array", "decode", "dtype_name", "json_float", "mode_name",
]
