"""The per-mode work of a capture: what a traced tensor keeps while recorded, and its encoding.

``tensor_debug_mode`` decides what recording a traced tensor costs and what
its records carry:

- the health modes (``health.KERNEL_MODES``): the tensor is queued on a
  ``kernels.HealthBatch`` and keeps its batch token; the rows are fetched
  once per segment (:meth:`Encoder.fetch_rows`), never per op;
- FULL_TENSOR: a CPU copy of the tensor;
- SHAPE: its metadata only; NO_TENSOR: nothing (graph traces carry no values).

Which tensors are traced at all is :meth:`Encoder.dtype_traced`
(``tensor_dtypes``, and the dtypes the health kernels read). When a segment
finishes, :meth:`Encoder.value_bytes` and :meth:`Encoder.trace_prefix` encode
its graph execution traces (pre-serialized, ``wire.py``),
:meth:`Encoder.value_proto` the tensor protos of its eager executions, and
:meth:`Encoder.nonfinite` tells ``stop_on_nonfinite`` which values hold inf/NaN.
"""

import numpy as np
import torch

from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.torch import health, kernels, wire
from tb_numerics_plugin.torch.state import c_base


class Encoder(c_base("EncoderState")):  # graph_values, dtype_ok: fields the C recording reads
    """The mode-dependent half of a capture session (``capture.Session.encoder``).

    Args:
      mode: tensor debug mode name (fixed for the session's life).

    Attributes:
      mode: the mode name.
      mode_enum: its ``TensorDebugMode`` number.
      kernel_mode: a health mode (values come from the health batch).
      graph_values: traced tensors carry values (all modes but NO_TENSOR): without, no
        payload is made for a graph trace or an eager output, (None, None) stands for it.
      batch: the ``kernels.HealthBatch`` of the current enable.
      cpu_rows: its CPU rows in a health mode (``HealthBatch.cpu_rows``), or None: the C
        recorder computes a dense CPU tensor's row into them itself (what
        :meth:`payload` does, without the Python calls).
      cuda_rows: likewise its rows on the first CUDA device (``HealthBatch.cuda_rows``),
        once :meth:`payload` saw a CUDA tensor; the C recorder queues rows into them.
      dtype_ok: torch.dtype -> traced, the cache :meth:`dtype_traced` fills;
        hot paths read it first and call the method on a miss.
      c_record: the ``_record`` extension :meth:`trace_events` and
        :meth:`execution_events` encode with, or None (Python): set per enable by the
        session, with its recorder (``recorder.choose_recorder``).
    """

    def __init__(self, mode):
        self.mode = mode
        self.mode_enum = health.mode_enum(mode)
        self.kernel_mode = mode in health.KERNEL_MODES
        self.graph_values = mode != "NO_TENSOR"
        self._level = health.level_for(mode)
        self._trace_prefixes = {}  # (graph id, op name, slot, device) -> encoded fields
        # graph id -> [(op name, slot, device, prefix) per trace place]: the C encoding's table
        self._trace_places = {}
        self._dtype_filter = None
        self.batch = None
        self.cpu_rows = None
        self.cuda_rows = None
        self.dtype_ok = {}
        self.c_record = None

    def configure(self, dtype_filter, health_backend):
        """Sets the options of one enable: ``tensor_dtypes`` as a predicate (or None)
        and the health backend (``kernels.BACKENDS`` item); the trace prefixes carry on."""
        self._dtype_filter = dtype_filter
        self.batch = kernels.HealthBatch(health_backend)
        self.cpu_rows = self.batch.cpu_rows(self._level) if self.kernel_mode else None
        self.cuda_rows = None  # the batch's, once a CUDA tensor came (payload)
        self.dtype_ok = {}

    # ---- while recording ---------------------------------------------------------
    def dtype_traced(self, dtype):
        """Whether tensors of ``dtype`` are traced (``tensor_dtypes`` and the mode allow it)."""
        ok = self.dtype_ok.get(dtype)
        if ok is None:
            ok = self._dtype_filter is None or bool(self._dtype_filter(dtype))
            if self.kernel_mode:
                ok = ok and dtype in health.HEALTH_DTYPES
            self.dtype_ok[dtype] = ok
        return ok

    def payload(self, t, device):
        """What a traced tensor keeps until its segment finishes.

        Returns:
          (payload, meta): the health batch token (health modes), a CPU copy
          (FULL_TENSOR) or None; and ``health.tensor_meta``.
        """
        meta = health.tensor_meta(t, device)
        if self.kernel_mode:
            token = self.batch.add(t, self._level)
            if self.cuda_rows is None:  # the first CUDA tensor made them: the C recorder's
                self.cuda_rows = self.batch.cuda_rows(self._level)
            return token, meta
        if self.mode == "FULL_TENSOR":
            return t.detach().to("cpu", copy=True), meta
        return None, meta

    def fetch_rows(self):
        """The health rows of every payload queued since the last fetch, a list indexed
        by a token's first item: float64 ``[n, 12]`` arrays that the C encoding
        (:attr:`c_record`) reads in place, or nested lists for the Python encoding
        (Python floats in one call per block: it reads every value of every row)."""
        blocks = self.batch.fetch()
        if not blocks:
            return blocks
        if self.c_record is not None:
            return [np.ascontiguousarray(block, dtype=np.float64) for block in blocks]
        return [block.tolist() for block in blocks]

    # ---- when a segment finishes ---------------------------------------------------
    def _debug_values(self, tensor_id, payload, meta, rows):
        """The debug values of one traced tensor in a health mode or SHAPE, else None."""
        if self.kernel_mode:
            return health.debug_values(self.mode, tensor_id, rows[payload[0]][payload[1]], meta)
        if self.mode == "SHAPE":
            return health.debug_values("SHAPE", tensor_id, None, meta)
        return None

    def value_proto(self, tensor_id, payload, meta, rows):
        """Returns the TensorProto of one traced tensor, or None in NO_TENSOR mode."""
        if self.mode == "FULL_TENSOR":
            return health.full_tensor_proto(payload)
        values = self._debug_values(tensor_id, payload, meta, rows)
        return None if values is None else health.values_proto(values)

    def value_bytes(self, tensor_id, payload, meta, rows):
        """Like :meth:`value_proto`, already serialized (the per-trace hot path)."""
        if self.mode == "FULL_TENSOR":
            return health.full_tensor_proto(payload).SerializeToString()
        values = self._debug_values(tensor_id, payload, meta, rows)
        return None if values is None else wire.values_tensor_proto(values)

    def trace_events(self, traces, graph_id, rows, step_bytes):
        """The serialized DebugEvents of a graph segment's traces (``Segment.traces``
        items), in C (``_record.encode_traces``) with :attr:`c_record`."""
        if self.c_record is not None and self.mode != "FULL_TENSOR":
            return self.c_record.encode_traces(traces, rows, graph_id, self.mode, step_bytes,
                                               self._trace_places, self._trace_prefixes,
                                               self.trace_prefix)
        events = []
        for op_name, slot, tensor_id, payload, meta, device, wall in traces:
            prefix = self.trace_prefix(graph_id, op_name, slot, device)
            values = self.value_bytes(tensor_id, payload, meta, rows)
            events.append(wire.trace_event(wall, prefix, values, step_bytes))
        return events

    def execution_events(self, eager, rows, host_name, step):
        """The serialized DebugEvents of a run's eager ops (``Segment.eager`` items), in
        C (``_record.encode_executions``) with :attr:`c_record`."""
        if self.c_record is not None and self.mode != "FULL_TENSOR":
            return self.c_record.encode_executions(eager, rows, self.mode, self.mode_enum,
                                                   host_name, step)
        events = []
        for op_type, in_ids, out_ids, outs, stack_ids, wall, dtypes in eager:
            event = debug_event_pb2.DebugEvent(wall_time=wall)
            ex = event.execution
            ex.op_type = op_type
            ex.num_outputs = len(out_ids)
            ex.input_tensor_ids.extend(in_ids)
            ex.output_tensor_ids.extend(out_ids)
            ex.output_dtypes.extend(dtypes)
            ex.tensor_debug_mode = self.mode_enum
            ex.code_location.host_name = host_name
            ex.code_location.stack_frame_ids.extend(stack_ids)
            for payload, meta, device_id, _ in outs:
                ex.output_tensor_device_ids.append(device_id)
                proto = self.value_proto(-1, payload, meta, rows)
                if proto is not None:
                    ex.tensor_protos.append(proto)
            if step is not None:
                ex.step = step
            events.append(event.SerializeToString())
        return events

    def graph_execution_event(self, op_type, graph_id, input_ids, output_ids, host_name,
                              stack_ids, wall_time, step):
        """The serialized DebugEvent of a graph segment's ``Execution`` (its call: the
        tensor ids it read and returned), in C (``_record.encode_graph_execution``)
        with :attr:`c_record`."""
        if self.c_record is not None:
            return self.c_record.encode_graph_execution(
                op_type, graph_id, input_ids, output_ids, self.mode_enum, host_name,
                stack_ids, wall_time, step)
        event = debug_event_pb2.DebugEvent(wall_time=wall_time)
        ex = event.execution
        ex.op_type = op_type
        ex.graph_id = graph_id
        ex.input_tensor_ids.extend(input_ids)
        ex.output_tensor_ids.extend(output_ids)
        ex.num_outputs = len(output_ids)
        ex.tensor_debug_mode = self.mode_enum
        ex.code_location.host_name = host_name
        ex.code_location.stack_frame_ids.extend(stack_ids)
        if step is not None:
            ex.step = step
        return event.SerializeToString()

    def trace_prefix(self, graph_id, op_name, slot, device_name):
        """The encoded constant fields of a trace, cached per (graph, op, slot, device)."""
        key = (graph_id, op_name, slot, device_name)
        prefix = self._trace_prefixes.get(key)
        if prefix is None:
            prefix = self._trace_prefixes[key] = wire.trace_prefix(
                graph_id, op_name, slot, self.mode_enum, device_name)
        return prefix

    def nonfinite(self, payload, rows):
        """Whether a traced value holds inf or NaN; False in modes that record no values."""
        if self.kernel_mode:
            raw = rows[payload[0]][payload[1]]
            return bool(raw[0] or raw[1] or raw[2])
        if self.mode == "FULL_TENSOR":
            return _nonfinite_tensor(payload)
        return False


def _nonfinite_tensor(t):
    return (t is not None and t.is_floating_point() and t.numel() > 0
            and not bool(torch.isfinite(t).all()))
