"""TensorProto → numpy, for debug values and FULL_TENSOR dumps.

TF writes health vectors as 1-D float64 ``tensor_content`` (little endian);
other writers may use the typed ``*_val`` fields, with a single value
standing for a whole filled tensor. Both are handled.
"""

import math

import numpy as np

from tb_numerics_plugin.proto import tensor_pb2

# TF DataType number -> (numpy dtype of tensor_content, TensorProto *_val field).
_LAYOUT = {
    1: ("<f4", "float_val"),
    2: ("<f8", "double_val"),
    3: ("<i4", "int_val"),
    4: ("u1", "int_val"),
    5: ("<i2", "int_val"),
    6: ("i1", "int_val"),
    8: ("<c8", "scomplex_val"),
    9: ("<i8", "int64_val"),
    10: ("?", "bool_val"),
    14: ("<u2", "half_val"),  # bfloat16 bits, widened below
    17: ("<u2", "int_val"),
    18: ("<c16", "dcomplex_val"),
    19: ("<f2", "half_val"),
    22: ("<u4", "uint32_val"),
    23: ("<u8", "uint64_val"),
}
BFLOAT16 = 14
HALF = 19
# Most elements a TensorProto may expand to from fewer stored values (a
# single value fills the shape): a hostile 60-byte record claiming shape
# [2**31] must not allocate gigabytes.
MAX_FILLED = 1 << 22


class UnsupportedTensor(ValueError):
    """A TensorProto whose dtype has no numeric numpy equivalent here."""


def shape_of(proto):
    """Returns the shape of a TensorProto as a list of ints."""
    return [int(d.size) for d in proto.tensor_shape.dim]


def _from_vals(proto, np_dtype, field, shape):
    vals = getattr(proto, field)
    if proto.dtype == HALF or proto.dtype == BFLOAT16:
        arr = np.array(vals, np.uint16)  # half_val holds the raw 16 bits
    elif field in ("scomplex_val", "dcomplex_val"):
        flat = np.array(vals, np.float64)
        arr = flat[0::2] + 1j * flat[1::2]
    else:
        arr = np.array(vals)
    arr = arr.astype(np_dtype) if proto.dtype != BFLOAT16 else arr
    if proto.dtype == HALF:
        arr = arr.view("<f2")
    size = math.prod(shape)
    if arr.size == size:
        return arr.reshape(shape)
    if size > MAX_FILLED:
        raise ValueError("TensorProto of shape %s (%d elements) from %d stored values: "
                         "refused" % (shape, size, arr.size))
    if arr.size == 1:
        return np.full(shape, arr[0], arr.dtype)
    if arr.size == 0:
        return np.zeros(shape, arr.dtype)
    raise ValueError("TensorProto has %d values for shape %s" % (arr.size, shape))


def to_array(proto):
    """Decodes a TensorProto.

    Args:
      proto: ``tensor_pb2.TensorProto`` (or serialized bytes).

    Returns:
      numpy array; bfloat16 is widened to float32.

    Raises:
      UnsupportedTensor: string, resource, variant or unknown dtypes.
      ValueError: the value count does not fit the shape.
    """
    if isinstance(proto, (bytes, bytearray, memoryview)):
        proto = tensor_pb2.TensorProto.FromString(bytes(proto))
    layout = _LAYOUT.get(proto.dtype)
    if layout is None:
        raise UnsupportedTensor("unsupported TensorProto dtype %d" % proto.dtype)
    np_dtype, field = layout
    shape = shape_of(proto)
    if any(d < 0 for d in shape):
        raise ValueError("TensorProto shape %s has a negative dimension" % shape)
    if proto.tensor_content:
        content = proto.tensor_content
        if len(content) % np.dtype(np_dtype).itemsize:
            raise ValueError("tensor_content of %d bytes is not a whole number of %s values"
                             % (len(content), np_dtype))
        arr = np.frombuffer(content, np_dtype)
        size = math.prod(shape)
        if arr.size != size:
            raise ValueError(
                "tensor_content holds %d values, shape %s needs %d" % (arr.size, shape, size)
            )
        arr = arr.reshape(shape)
    else:
        arr = _from_vals(proto, np_dtype, field, shape)
    if proto.dtype == BFLOAT16:
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    return arr


def to_json_list(arr):
    """A numpy array as nested lists, non-finite floats as "NaN"/"Infinity"/"-Infinity"."""
    arr = np.asarray(arr)
    if arr.dtype.kind == "c":
        arr = np.abs(arr)
    if arr.dtype.kind != "f":
        return arr.tolist()
    obj = arr.astype(object)
    obj[np.isnan(arr)] = "NaN"
    obj[np.isposinf(arr)] = "Infinity"
    obj[np.isneginf(arr)] = "-Infinity"
    return obj.tolist()
