"""Hand-encoded protobuf bytes for the one record written per traced tensor.

A ``GraphExecutionTrace`` event differs from the previous call of the same op
only in its wall time and values, so its constant fields are encoded once per
(graph, op, slot, device) and the event is assembled by concatenation: about
three times cheaper than building and serializing the message each time.
Field numbers are those of ``debug_event.proto`` and ``tensor.proto``; a test
checks that protobuf parses these bytes back into the same messages.
"""

import struct

_DOUBLE = struct.Struct("<d")
_DT_DOUBLE = 2
_ONE_BYTE = tuple(bytes((i,)) for i in range(0x80))


def varint(n):
    """Encodes a non-negative int as a protobuf varint."""
    if n < 0x80:
        return _ONE_BYTE[n]  # tags and most lengths: no loop, no new object
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number, payload):
    """A length-delimited field (wire type 2)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def trace_prefix(graph_id, op_name, slot, mode_enum, device_name):
    """Encodes the constant fields of a GraphExecutionTrace (all but tensor_proto).

    Returns:
      (fields 1-4, field 6) as bytes: :func:`trace_event` puts field 5 between
      them, so fields come in number order as protobuf itself writes them
      (some fast readers rely on that order).
    """
    head = _field(1, graph_id.encode()) + _field(2, op_name.encode())
    if slot:
        head += varint(3 << 3) + varint(slot)
    if mode_enum:
        head += varint(4 << 3) + varint(mode_enum)
    return head, _field(6, device_name.encode()) if device_name else b""


_VALUES_HEADERS = {}  # n -> (encoded dtype, shape and content tag, struct for n doubles)


def values_tensor_proto(values):
    """Encodes debug values as a 1-D float64 TensorProto (little-endian content)."""
    n = len(values)
    cached = _VALUES_HEADERS.get(n)
    if cached is None:
        dim = _field(2, varint(1 << 3) + varint(n)) if n else _field(2, b"")
        head = varint(1 << 3) + varint(_DT_DOUBLE) + _field(2, dim)
        head += varint(4 << 3 | 2) + varint(8 * n)
        cached = _VALUES_HEADERS[n] = (head, struct.Struct("<%dd" % n))
    head, packer = cached
    return head + packer.pack(*values)


def step_field(step):
    """Encodes the extension field ``step = 101`` (an int64 varint), or b"" for None.

    Appended after field 6, it keeps the fields of a trace in number order.
    """
    if step is None:
        return b""
    return _STEP_TAG + varint(step if step >= 0 else step + (1 << 64))


def trace_event(wall_time, prefix, tensor_proto=None, step=b""):
    """Encodes a DebugEvent holding one GraphExecutionTrace.

    Args:
      wall_time: seconds since the epoch.
      prefix: the pair from :func:`trace_prefix`.
      tensor_proto: encoded TensorProto bytes, or None (NO_TENSOR).
      step: the encoded step field (:func:`step_field`), b"" for none.

    Returns:
      bytes of the serialized DebugEvent.
    """
    head, tail = prefix
    if tensor_proto is None:
        body = head + tail + step
    else:
        body = b"".join((head, _TENSOR_PROTO_TAG, varint(len(tensor_proto)), tensor_proto, tail,
                         step))
    return b"".join((b"\x09", _DOUBLE.pack(wall_time), _TRACE_TAG, varint(len(body)), body))


_TENSOR_PROTO_TAG = varint(5 << 3 | 2)  # GraphExecutionTrace.tensor_proto
_TRACE_TAG = varint(10 << 3 | 2)  # DebugEvent.graph_execution_trace
_STEP_TAG = varint(101 << 3)  # GraphExecutionTrace.step (b"\xa8\x06")
