"""Data-flow queries over one file set: which record holds a value, who read it.

Built lazily, only when an analysis asks (a run without bad values never
pays for it), and dropped with the run's caches when ``update()`` indexes new
data. Three indexes, each one sort:

- traces by key (graph, op, slot): the latest trace of an op at or before a
  position, the next one after it;
- execution inputs by tensor id: which executions read a tensor;
- graph executions (calls) by wall time: which call a trace belongs to.
  A torch capture writes a call's Execution before its traces (its wall time
  is the call's start); TensorFlow writes it after them (the call's end).

Tensor ids join records across calls: an Execution lists the ids it read
and wrote, a torch health trace carries its tensor's id in element 0, and a
torch graph Execution lists the ids of its Placeholder values in Placeholder
order (docs/format.md). TensorFlow's graph-trace ids live in another space
than its eager ids, so across TF calls only the call order is known.
"""

import numpy as np

from tb_numerics_plugin.reader import health as health_lib

# Modes whose health vector starts with the tensor id.
_ID_MODES = frozenset(health_lib.MODE_CODES[m] for m in
                      ("CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH", "SHAPE", "FULL_NUMERICS"))


def writer_of(fs):
    """``"torch"`` for a tb-numerics torch capture, else ``"tensorflow"``."""
    version = (fs.metadata or {}).get("tensorflow_version") or ""
    return "torch" if version.startswith("torch") else "tensorflow"


def _positions(index):
    """``index`` (positions into a table) as int32 when they fit: these arrays are kept."""
    return index.astype(np.int32) if len(index) < 2**31 - 1 else index


class DataFlow:
    """The data-flow indexes of one :class:`FileSet` (see the module docstring)."""

    def __init__(self, fs):
        self.fs = fs
        self.writer = writer_of(fs)
        traces, execs = fs.traces, fs.executions
        key = traces.cols["key"]
        self._by_key = _positions(np.argsort(key, kind="stable"))
        sorted_keys = key[self._by_key]
        self._key_start = np.searchsorted(sorted_keys, np.arange(len(traces.keys) + 1))
        keys = traces.keys
        self._key_ids = {(keys.context[k], keys.op_name[k], keys.output_slot[k]): k
                         for k in range(len(keys))}
        ids = execs.inputs["id"]
        self._in_order = _positions(np.argsort(ids, kind="stable"))
        self._in_sorted = ids[self._in_order]
        self._in_owner = _positions(np.searchsorted(
            execs.cols["in_begin"], np.arange(len(ids), dtype=self._in_order.dtype),
            side="right") - 1)
        c = execs.cols
        # Calls: executions of a graph. TensorFlow leaves Execution.graph_id empty
        # for function calls (their op_type, "__inference_f_123", names no graph):
        # there every execution may be a call, and a trace belongs to the first
        # execution written after it.
        if self.writer == "torch":
            self.calls = np.flatnonzero(c["graph_id"] >= 0)
        else:
            self.calls = np.arange(len(execs))
        call_wall = c["wall_time"][self.calls]
        # monotone: TensorFlow's parallel ops may write traces slightly out of time order
        trace_wall = np.maximum.accumulate(traces.cols["wall_time"]) if len(traces) \
            else traces.cols["wall_time"]
        if self.writer == "torch":  # a call's traces follow its Execution
            self._call_begin = np.searchsorted(trace_wall, call_wall, side="left")
            self._call_end = np.append(self._call_begin[1:], len(traces))
        else:  # TensorFlow: a call's traces precede its Execution
            self._call_end = np.searchsorted(trace_wall, call_wall, side="right")
            self._call_begin = np.concatenate([[0], self._call_end[:-1]]).astype(np.int64)
        modes = traces.modes()
        self._trace_ids = np.where(np.isin(modes, list(_ID_MODES)) & (traces.cols["nvals"] > 0),
                                   traces.cols["values"][:, 0] if len(traces) else 0, np.nan)

    # -- traces ---------------------------------------------------------------

    def _positions(self, graph_id, op_name, slot):
        k = self._key_ids.get((graph_id, op_name, slot))
        if k is None:
            return self._by_key[:0]
        return self._by_key[self._key_start[k]:self._key_start[k + 1]]

    def latest_trace(self, graph_id, op_name, slot, at_or_before):
        """Index of the latest trace of ``op_name:slot`` in ``graph_id`` at or before
        an index, or None."""
        pos = self._positions(graph_id, op_name, slot)
        i = np.searchsorted(pos, at_or_before, side="right") - 1
        return int(pos[i]) if i >= 0 else None

    def next_trace(self, graph_id, op_name, slot, after, before=None):
        """Index of the first trace of ``op_name:slot`` in ``graph_id`` after an index
        (and before ``before``), or None."""
        pos = self._positions(graph_id, op_name, slot)
        i = np.searchsorted(pos, after, side="right")
        if i >= len(pos) or (before is not None and pos[i] >= before):
            return None
        return int(pos[i])

    def trace_tensor_id(self, index):
        """The tensor id a trace carries (torch captures), or None."""
        if self.writer != "torch":
            return None
        v = self._trace_ids[index]
        return None if np.isnan(v) else int(v)

    def trace_with_tensor_id(self, tensor_id, before):
        """Index of the latest trace before ``before`` holding ``tensor_id``, or None."""
        if self.writer != "torch":
            return None
        hits = np.flatnonzero(self._trace_ids[:before] == tensor_id)
        return int(hits[-1]) if len(hits) else None

    # -- calls ----------------------------------------------------------------

    def call_of_trace(self, index):
        """Index of the graph Execution (call) a trace belongs to, or None."""
        k = np.searchsorted(self._call_end, index, side="right")
        if k < len(self.calls) and self._call_begin[k] <= index:
            return int(self.calls[k])
        return None

    def call_traces(self, execution):
        """``(begin, end)`` trace range of a graph Execution's call."""
        k = np.searchsorted(self.calls, execution)
        if k >= len(self.calls) or self.calls[k] != execution:
            raise IndexError("execution %d is not a graph execution" % execution)
        return int(self._call_begin[k]), int(self._call_end[k])

    def call_trace_bound(self, index):
        """End of the trace range of the call holding trace ``index`` (len(traces) if none)."""
        k = np.searchsorted(self._call_end, index, side="right")
        if k < len(self.calls) and self._call_begin[k] <= index:
            return int(self._call_end[k])
        return len(self.fs.traces)

    # -- executions by tensor id ---------------------------------------------------

    def readers_of(self, tensor_id, after=-1):
        """``[(execution index, input position)]`` of executions after ``after`` that read
        ``tensor_id``."""
        lo = np.searchsorted(self._in_sorted, tensor_id, side="left")
        hi = np.searchsorted(self._in_sorted, tensor_id, side="right")
        out = []
        begins = self.fs.executions.cols["in_begin"]
        for flat in sorted(self._in_order[lo:hi].tolist()):
            owner = int(self._in_owner[flat])
            if owner > after:
                out.append((owner, flat - int(begins[owner])))
        return out

    def producer_execution(self, tensor_id, before):
        """``(execution index, output slot)`` of the latest execution before ``before``
        that output ``tensor_id``, or None."""
        execs = self.fs.executions
        if before <= 0:
            return None
        end = execs.cols["out_end"][before - 1]
        hits = np.flatnonzero(execs.outputs["id"][:end] == tensor_id)
        if not len(hits):
            return None
        pos = int(hits[-1])
        index = int(np.searchsorted(execs.cols["out_begin"][:before], pos, side="right") - 1)
        return index, pos - int(execs.cols["out_begin"][index])

    def placeholders(self, graph_id):
        """Names of the Placeholder ops of a graph, in creation order."""
        gi = self.fs.graphs
        return [n for n in gi.ops_by_graph.get(graph_id, ())
                if gi.ops[(graph_id, n)].op_type == "Placeholder"]
