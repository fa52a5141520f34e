"""The project's one vocabulary: debug modes, health layouts, dtypes, the
counts phrase and whose code a stack frame is.

A leaf module (standard library only). The writers (``torch/``), the reader,
the analysis, the CLI and the routes all read these tables from here, so they
cannot drift apart; the browser gets decoded health and a per-frame ``kind``
from the routes and decodes nothing itself.

Health layouts, as TF's kernels write them (index: meaning):

- CURT_HEALTH ``[tensor_id, any_inf_or_nan]``
- CONCISE_HEALTH ``[tensor_id, size, n_neg_inf, n_pos_inf, n_nan]``
- FULL_HEALTH ``[tensor_id, device_id, dtype_enum, rank, size, n_neg_inf,
  n_pos_inf, n_nan, n_neg, n_zero, n_pos]``
- SHAPE ``[tensor_id, dtype_enum, rank, size, d0..d5]``
- FULL_NUMERICS (ours, see docs/format.md) the 11 FULL_HEALTH values then
  ``[min, max, abs_min_nonzero, abs_max, mean, std]``
- FULL_TENSOR: the tensor itself; the reader derives a FULL_HEALTH-layout
  vector from it so alerts work there too.
- REDUCE_INF_NAN_THREE_SLOTS ``[-inf or 0, +inf or 0, NaN or 0]``
- NO_TENSOR: nothing.
"""

import re

# TensorDebugMode (tensorflow/core/protobuf/debug_event.proto).
MODE_NAMES = {
    0: "UNSPECIFIED",
    1: "NO_TENSOR",
    2: "CURT_HEALTH",
    3: "CONCISE_HEALTH",
    4: "FULL_HEALTH",
    5: "SHAPE",
    6: "FULL_NUMERICS",
    7: "FULL_TENSOR",
    8: "REDUCE_INF_NAN_THREE_SLOTS",
}
MODE_CODES = {name: code for code, name in MODE_NAMES.items()}
# Modes whose values say whether a tensor holds inf or NaN.
HEALTH_MODES = frozenset(
    ("CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH", "FULL_NUMERICS", "FULL_TENSOR",
     "REDUCE_INF_NAN_THREE_SLOTS")
)
FULL_HEALTH_WIDTH = 11
# Slots after the tensor id/device/dtype/rank prefix of FULL_HEALTH, and the
# ones FULL_NUMERICS appends.
FULL_KEYS = ("size", "neg_inf", "pos_inf", "nan", "neg", "zero", "pos")
NUMERIC_KEYS = ("min", "max", "abs_min_nonzero", "abs_max", "mean", "std")
# Which value slots hold the inf/NaN flag or counts, per mode: a vector is bad
# when any of them is > 0 (NaN, i.e. absent, compares False). Mode 8 is the
# exception: its slots hold -inf, +inf and NaN themselves (0 when absent).
BAD_SLOTS = {"CURT_HEALTH": (1,), "CONCISE_HEALTH": (2, 3, 4), "FULL_HEALTH": (5, 6, 7),
             "FULL_NUMERICS": (5, 6, 7), "FULL_TENSOR": (5, 6, 7),
             "REDUCE_INF_NAN_THREE_SLOTS": (0, 1, 2)}

# TensorFlow's DataType numbers (tensorflow/core/framework/types.proto), by
# the numpy-style names torch and the reader use.
DTYPE_NAMES = {
    1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 7: "string",
    8: "complex64", 9: "int64", 10: "bool", 11: "qint8", 12: "quint8", 13: "qint32",
    14: "bfloat16", 15: "qint16", 16: "quint16", 17: "uint16", 18: "complex128",
    19: "float16", 20: "resource", 21: "variant", 22: "uint32", 23: "uint64",
    24: "float8_e5m2", 25: "float8_e4m3fn", 26: "float8_e4m3fnuz", 27: "float8_e4m3b11fnuz",
    28: "float8_e5m2fnuz", 29: "int4", 30: "uint4",
}
DTYPE_ENUMS = {name: enum for enum, name in DTYPE_NAMES.items()}
# Largest finite value per dtype, for the overflow-headroom rule.
DTYPE_MAX = {
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
    "float32": 3.4028234663852886e38,
    "float64": 1.7976931348623157e308,
}
# OverflowHeadroom: a finite |max| at or above DTYPE_MAX / HEADROOM_FACTOR.
HEADROOM_FACTOR = 2.0


def dtype_name(enum):
    """The numpy-style name of a TF DataType number ("dtype_<n>" if unknown)."""
    return DTYPE_NAMES.get(int(enum), "dtype_%d" % int(enum))


def counts_phrase(health):
    """The non-finite counts of a decoded health dict, in the words every surface uses.

    "823 -inf, 2 NaN of 1000 elements" (zero counts left out); "inf or NaN
    (CURT_HEALTH records no counts)" when the mode records only a flag.
    """
    if "nan" not in health:
        return "inf or NaN (%s records no counts)" % health.get("mode")
    parts = ["%d %s" % (health[k], label) for k, label in
             (("neg_inf", "-inf"), ("pos_inf", "+inf"), ("nan", "NaN")) if health.get(k)]
    text = ", ".join(parts) or "no inf or NaN"
    return text + (" of %d elements" % health["size"] if "size" in health else "")


# Whose code a stack frame is:
# - framework: torch, TensorFlow, Keras, NumPy, JAX, the Python standard
#   library, interpreter pseudo-files (<string>) and this package (its demos
#   excepted);
# - model: other installed packages (site-packages/dist-packages), such as
#   transformers: the code that defines the model;
# - user: everything else, the user's own files.
FRAMEWORK, MODEL, USER = "framework", "model", "user"
FRAME_KINDS = (FRAMEWORK, MODEL, USER)
_FRAMEWORK_PARTS = ("/tensorflow/", "/torch/", "/keras/", "/tf_keras/", "/numpy/", "/jax/")
_INSTALLED_PARTS = ("/site-packages/", "/dist-packages/")
# Python's standard library: .../lib/python3.11/<module>.py (not site-packages).
_STDLIB = re.compile(r"/lib/python\d+(\.\d+)?/(?!(site|dist)-packages)")
_OURS = "/tb_numerics_plugin/"
_OUR_DEMOS = "/tb_numerics_plugin/demo/"


def frame_kind(path):
    """``"framework"``, ``"model"`` or ``"user"`` for a frame's file path."""
    p = (path or "").replace("\\", "/")
    if not p or p.startswith("<") or "/<" in p:
        return FRAMEWORK  # <string>, <frozen importlib._bootstrap>: nothing to show
    if _OURS in p:
        return USER if _OUR_DEMOS in p else FRAMEWORK
    if any(part in p for part in _FRAMEWORK_PARTS) or _STDLIB.search(p):
        return FRAMEWORK
    if any(part in p for part in _INSTALLED_PARTS):
        return MODEL
    return USER
