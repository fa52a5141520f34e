"""The per-op recorders: ``_record.c`` in C, or its twin here in Python.

``Session.on_op`` decides where an op goes (its execution, its name, its call
site); :func:`record_graph_op` and :func:`record_eager_op` append it there.
The C recorder (``_record.record`` and ``_record.native_entry``) does all of
``on_op``'s work for all but the ops that open an execution;
:func:`choose_recorder` picks it unless ``TB_NUMERICS_RECORD=python`` or it
was not built. Both recorders produce the same records.
"""

import collections
import logging
import os
import time

import torch
from torch._C._dynamo.eval_frame import set_eval_frame as _set_eval_frame

from tb_numerics_plugin.torch import health, kernels, kernels_cuda, tags
from tb_numerics_plugin.torch.ops import OpInfo, tensors_in
from tb_numerics_plugin.torch.segments import BACKWARD
from tb_numerics_plugin.torch.tags import (INPUT_NAME, SERIAL, TAG, TENSOR_ID, mark,
                                           producer_tag)

_DTYPE_ENUM = health.DTYPE_ENUM
_log = logging.getLogger("tb_numerics_plugin.torch")
EAGER_BATCH = 256  # eager ops encoded (and health fetched) together
SEQ_MAP_MAX = 200000  # forward autograd nodes remembered for backward attribution


class PyForwardOps:
    """The forward ops of a session's autograd nodes where the ``_record`` extension is
    missing, ``_record.ForwardOps`` otherwise (``_record_forward.c``: a table by
    sequence number that keeps the newest ``limit`` numbers, rounded up to a power of
    two). Here a dict in insertion order keeps the newest half of ``limit`` nodes once
    it holds more: one rebuild per ``limit // 2`` nodes, where an ``OrderedDict``
    popped its oldest on each (its linked list cost about 150 instructions per op)."""

    __slots__ = ("_ops", "_limit")

    def __init__(self, limit):
        self._ops = {}
        self._limit = limit

    def remember(self, seq, op_name, stack_ids, first_tensor_id):
        """The forward op of node ``seq``, unless one is remembered for it."""
        ops = self._ops
        if seq not in ops:
            ops[seq] = (op_name, stack_ids, first_tensor_id)
            if len(ops) > self._limit:
                newest = list(ops.items())[-(self._limit // 2):]
                ops.clear()
                ops.update(newest)

    def get(self, seq):
        """``(op_name, stack_ids, first_tensor_id)`` of node ``seq``, or None."""
        return self._ops.get(seq)

    def clear(self):
        self._ops.clear()


def forward_ops():
    """A new session's forward ops by autograd node, kept up to ``SEQ_MAP_MAX`` (read now)."""
    make = getattr(_c_record, "ForwardOps", None) or PyForwardOps
    return make(SEQ_MAP_MAX)


# What the session knows of an op, cached per op: its ``ops.OpInfo`` fields, whether
# ``op_regex`` passes it (traced) and the op itself (keeping its id, the cache key, alive).
OpFacts = collections.namedtuple("OpFacts", OpInfo._fields + ("traced", "func"))

# The per-op hot path in C (``_record.c``): an op inside a module call, an
# optimizer step or a backward pass, or an eager op, recorded as on_op records
# it. ``TB_NUMERICS_RECORD=python``, or a build without a compiler, records
# every op in Python.
RECORD_ENV = "TB_NUMERICS_RECORD"
_C_RECORD_FAILURE = None  # why the built _record could not be set up
try:
    from tb_numerics_plugin.torch import _record as _c_record
except ImportError:
    _c_record = None


def configure_c():
    """Hands the C recorder the torch objects, the OpFacts layout and this module's
    ``EAGER_BATCH`` (read now: a test that changes it calls this again)."""
    _c_record.configure(torch.Tensor, torch.is_grad_enabled,
                        torch._C._autograd._get_sequence_nr, torch._C._current_autograd_node,
                        time.time, _DTYPE_ENUM, BACKWARD, EAGER_BATCH,
                        OpFacts._fields, vars(tags), _set_eval_frame)


if _c_record is not None:
    try:
        if not all(hasattr(_c_record, name)
                   for name in ("Token", "Ids", "ForwardOps", "ScopeState", "SessionState",
                                "EncoderState")):
            # its C entries would not know gate.py's and tags.py's objects
            raise ImportError("a stale build of _record (no Token and Ids): rebuild it")
        configure_c()
        if kernels.c_kernel_available():  # dense CPU (and CUDA) tensors' health rows from C
            _c_record.configure_health(kernels.c_api(), torch.device("cpu"), kernels.C_CODES,
                                       kernels_cuda.raw_stream_source())
    except Exception as exc:  # a stale build (other fields): record in Python
        _c_record, _C_RECORD_FAILURE = None, "%s: %s" % (type(exc).__name__, exc)


def record_graph_op(session, seg, op_type, op_name, args, kwargs, outputs, stack_ids, traced):
    """Appends one op of a graph execution to ``seg``: its inputs named by their
    producers, its outputs tagged, its traced outputs' payloads (``Session.on_op``)."""
    serial = seg.serial
    names = []
    for t in tensors_in(args, kwargs):
        tag = getattr(t, TAG, None)
        # fast path: a tensor made earlier in this segment, read directly (not through a view)
        if tag is not None and tag[SERIAL] == serial and not t._is_view():
            names.append(tag[INPUT_NAME])
        else:
            names.append(seg.input_name(t))
    if not outputs:
        seg.ops.append((op_type, op_name, tuple(names), 0, stack_ids, "", ()))
        return
    device = outputs[0].device
    device_name = session.device(device)[0]
    dtypes = tuple([_DTYPE_ENUM.get(t.dtype, 0) for t in outputs])
    seg.ops.append((op_type, op_name, tuple(names), len(outputs), stack_ids, device_name,
                    dtypes))
    wall = time.time()
    enc = session.encoder
    for slot, t in enumerate(outputs):
        tensor_id = session.tensor_ids.take()
        # tags.mark, inlined (the per-output hot path)
        tag = (serial, op_name, slot, t._version, tensor_id, f"{op_name}:{slot}")
        setattr(t, TAG, tag)
        if t._is_view():  # an op that wrote through a view wrote its base too
            setattr(t._base, TAG, tag)
        if not traced:
            continue
        dtype = t.dtype
        ok = enc.dtype_ok.get(dtype)
        if (ok if ok is not None else enc.dtype_traced(dtype)):
            if slot:  # one op's outputs share a device but for rare ops (to/copy across devices)
                device = t.device
                device_name = session.device(device)[0]
            payload, meta = _payload(enc, t, device, dtype) if enc.graph_values else (None, None)
            seg.traces.append((op_name, slot, tensor_id, payload, meta, device_name, wall))


def _payload(enc, t, device, dtype):
    """``Encoder.payload``, through the C recorder's when it records (rows from C)."""
    if enc.c_record is not None:
        return enc.c_record.payload(enc, t, device, dtype)
    return enc.payload(t, device)


def record_eager_op(session, seg, op_type, op_name, args, kwargs, outputs, stack_ids, traced):
    """Appends one eager op to ``seg`` (when traced): its inputs' and outputs' tensor ids
    and its traced outputs' payloads; its outputs are tagged either way."""
    in_ids = []
    for t in tensors_in(args, kwargs):
        tag = producer_tag(t)
        in_ids.append(tag[TENSOR_ID] if tag is not None else -1)
    out_ids, outs, dtypes = [], [], []
    serial, enc = seg.serial, session.encoder
    for slot, t in enumerate(outputs):
        tensor_id = session.tensor_ids.take()
        mark(t, serial, op_name, slot, tensor_id)
        out_ids.append(tensor_id)
        dtypes.append(_DTYPE_ENUM.get(t.dtype, 0))
        if traced and enc.dtype_traced(t.dtype):
            payload, meta = (_payload(enc, t, t.device, t.dtype) if enc.graph_values
                             else (None, None))
            outs.append((payload, meta, session.device(t.device)[1], tensor_id))
    if traced:
        seg.eager.append((op_type, in_ids, out_ids, outs, stack_ids, time.time(), dtypes))


def use_native_facts(capsule, stand_in_tag):
    """Lets the C recorder read a traced tensor's layout, address, shape and device through
    the native hook's ``TENSOR_FACTS`` (``_native_facts.h``) instead of Python calls, and
    the tag an untagged input stands for where ``tags.stand_in_tag`` is the hook module's
    ``stand_in_tag`` (the hook installed)."""
    if _c_record is not None:
        _c_record.configure_facts(capsule, stand_in_tag)


def choose_recorder():
    """The ``_record`` extension when ``TB_NUMERICS_RECORD`` allows it and it was built, else
    None (every op recorded in Python); logs the choice once.

    Raises:
      ValueError: a ``TB_NUMERICS_RECORD`` other than ``c`` or ``python``.
    """
    wanted = os.environ.get(RECORD_ENV, "").strip().lower() or "c"
    if wanted not in ("c", "python"):
        raise ValueError("%s must be c or python, not %r" % (RECORD_ENV, os.environ[RECORD_ENV]))
    if wanted == "python":
        choice, why = None, "%s=python" % RECORD_ENV
    elif _c_record is None:
        choice, why = None, _C_RECORD_FAILURE or "tb_numerics_plugin.torch._record was not built"
    else:
        choice, why = _c_record, "C (_record.c)"
    if why not in _RECORDERS_LOGGED:
        _RECORDERS_LOGGED.add(why)
        _log.info("tb-numerics: ops are recorded in %s",
                  "C" if choice is not None else "Python (%s)" % why)
    return choice


_RECORDERS_LOGGED = set()
