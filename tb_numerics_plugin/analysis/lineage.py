"""Lineage of non-finite values: does a bad tensor reach what training keeps?

Every tensor holding inf or NaN (a bad graph trace, a bad output of an eager
execution) is either

- **propagating**: some path of readers carries non-finite values to a
  *sink*: a top-level model call's output, a parameter, gradient or state an
  optimizer step reads or writes, or a value whose fate is unknown (nobody
  read it in the captured data, outside the backward pass; a reader that was
  not traced and may hold floats). When in doubt, propagating.
- **masked**: every path ends in finite tensors first (softmax of a row of
  -inf, ``where``, ``masked_fill``, a cast to an integer), in a value a torch
  call made and neither returned nor read again (a mask the attention kernel
  skipped), in an argument a call never read, or the value is a gradient
  nobody read after the backward pass (the step a loss scaler skipped).

Readers come from the recorded data flow only: the consumer edges of the
graphs (torch and TensorFlow), and for torch the tensor ids that join a
value to the eager executions and graph calls that read it (see
:mod:`tb_numerics_plugin.reader.dataflow`). The work starts from bad tensors
and only visits bad tensors: a run with a million healthy traces pays
nothing. docs/lineage.md states the rule and its limits.
"""

from tb_numerics_plugin.analysis import health as health_lib
from tb_numerics_plugin.reader import views

PROPAGATING, MASKED = "propagating", "masked"
BACKWARD = "autograd.backward"
# DataType numbers that can hold inf or NaN (float and complex types).
_FLOAT_DTYPES = frozenset((1, 2, 8, 14, 18, 19, 24, 25, 26, 27, 28))
# TensorFlow ops whose outputs hold no inf/NaN whatever their inputs hold
# (shapes, predicates, indices): an untraced reader of this type ends a path.
_TF_FINITE_OPS = frozenset((
    "Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike", "IsNan", "IsInf", "IsFinite",
    "Equal", "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual", "ArgMax", "ArgMin",
    "LogicalAnd", "LogicalOr", "LogicalNot",
))
# Readers that take only a value's shape, or inspect it without computing
# from it: they neither carry a bad value on nor mask it (backward starts
# with ``ones_like(loss)``; ``isinf(x).any()`` guards a clamp).
_IGNORED_READERS = frozenset((
    "ones_like", "zeros_like", "empty_like", "full_like", "rand_like", "randn_like",
    "randint_like", "new_zeros", "new_ones", "new_full", "new_empty", "new_empty_strided",
    "isinf", "isnan", "isfinite", "isposinf", "isneginf", "sym_size", "sym_numel",
    "Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike", "IsNan", "IsInf", "IsFinite",
))
# Eager torch ops whose unread outputs are the gradients of a skipped step.
_SCALER_OPS = ("aten._amp_foreach_non_finite_check_and_unscale_",)
_MAX_VISITS = 200000  # nodes visited per host before the rest count as propagating

# Terminal outcomes of an edge.
SINK_OUTPUT = "model output"
SINK_OPTIMIZER = "optimizer step"
SINK_UNREAD = "never read"
SINK_UNKNOWN = "untraced reader"
END_FINITE = "finite"
END_SKIPPED = "gradient of a skipped step"
END_UNUSED = "argument the call never read"
END_DEAD = "died unread inside its call"
_MASKING_ENDS = (END_FINITE, END_SKIPPED, END_UNUSED, END_DEAD)


def _ignored(op_type):
    """True for readers in ``_IGNORED_READERS`` (torch ``aten.<name>.<overload>`` or TF)."""
    parts = (op_type or "").split(".")
    return (parts[1] if len(parts) == 3 else parts[0]) in _IGNORED_READERS


def _is_optimizer(graph_name):
    return bool(graph_name) and graph_name.endswith(".step")


class Lineage:
    """Classifies the bad tensors of one host of a run (see the module docstring).

    Nodes: ``("t", trace index)`` and ``("e", execution index, output slot)``.
    """

    def __init__(self, run, host):
        self.run = run
        self.fs = run.fileset(host)
        self.host = self.fs.label
        self.flow = run.dataflow(host)
        self.bad_traces = run.bad_trace_indices(host)
        self.bad_executions = run.bad_execution_indices(host)
        self._trace_bad = set(self.bad_traces.tolist())
        self._memo = {}  # node -> (propagating, next hop: node or terminal str)
        self._outputs = {}  # execution index -> [(tensor id, dtype, health)]
        self._visits = 0

    # -- values -------------------------------------------------------------

    def _trace(self, index):
        return self.run.graph_execution_trace_digests(index, index + 1, host=self.host)[0]

    def execution_outputs(self, index):
        """``[(tensor id, dtype enum or None, health or None)]`` per output of an execution."""
        cached = self._outputs.get(index)
        if cached is not None:
            return cached
        ex = self.run.execution(index, host=self.host)
        mode = ex["tensor_debug_mode"]
        vectors = views.execution_health_vectors(self.fs, index)
        ids = ex["output_tensor_ids"]
        dtypes = views.execution_output_dtypes(self.fs, index)
        n = max(len(ids), len(vectors), int(ex.get("num_outputs") or 0))
        # Health protos cover the traced outputs: all of them, or the float ones.
        slots = list(range(n))
        if len(vectors) < n and len(dtypes) == n:
            slots = [k for k in range(n) if dtypes[k] in _FLOAT_DTYPES]
        healths = [None] * n
        for k, vec in zip(slots, vectors):
            healths[k] = None if vec is None else health_lib.decode(mode, vec)
        out = [(ids[k] if k < len(ids) else None, dtypes[k] if k < len(dtypes) else None,
                healths[k]) for k in range(n)]
        self._outputs[index] = out
        return out

    # -- edges --------------------------------------------------------------

    def _op_outcomes(self, graph_id, op_name, after, before):
        """Outcomes of graph op ``op_name`` reading a bad value: its traces after ``after``
        (and before ``before``, the end of the call) or, untraced, what its dtype says."""
        op = self.fs.graphs.op(graph_id, op_name)
        if op is not None and _ignored(op.op_type):
            return []
        if op is None or op.num_outputs == 0:
            return [("end", SINK_UNKNOWN)]
        out = []
        for k in range(op.num_outputs):
            j = self.flow.next_trace(graph_id, op_name, k, after, before)
            if j is not None:
                out.append(("node", ("t", j)) if j in self._trace_bad else ("end", END_FINITE))
            elif k < len(op.output_dtypes) and op.output_dtypes[k] not in _FLOAT_DTYPES:
                out.append(("end", END_FINITE))
            elif not len(op.output_dtypes) and op.op_type in _TF_FINITE_OPS:
                out.append(("end", END_FINITE))
            else:
                out.append(("end", SINK_UNKNOWN))
        return out

    def _reader_outcomes(self, execution, position):
        """Outcomes of execution ``execution`` reading a bad value as input ``position``."""
        digest = views.execution_digest(self.fs, execution)
        graph_id = digest["graph_id"]
        if graph_id is None:
            if _ignored(digest["op_type"]):
                return []
            out = []
            for k, (_, dtype, h) in enumerate(self.execution_outputs(execution)):
                if h is not None:
                    out.append(("node", ("e", execution, k)) if h.get("any_inf_or_nan")
                               else ("end", END_FINITE))
                elif dtype is not None and dtype not in _FLOAT_DTYPES:
                    out.append(("end", END_FINITE))
                else:
                    out.append(("end", SINK_UNKNOWN))
            return out
        name = self.fs.graphs.graph_name(graph_id)
        if _is_optimizer(name):
            return [("end", SINK_OPTIMIZER)]
        names = self.flow.placeholders(graph_id)
        if position >= len(names):  # an argument the call never read (docs/format.md)
            return [("end", END_UNUSED)]
        begin, end = self.flow.call_traces(execution)
        readers = self.fs.graphs.consumers(graph_id).get((names[position], 0), ())
        out = []
        for op_name in dict.fromkeys(r[0] for r in readers):
            out.extend(self._op_outcomes(graph_id, op_name, begin - 1, end))
        return out or [("end", SINK_UNKNOWN)]

    def edges(self, node):
        """``[("node", node) | ("end", terminal)]``: where a bad value goes next."""
        if node[0] == "t":
            return self._trace_edges(node[1])
        return self._execution_edges(node[1], node[2])

    def _trace_edges(self, index):
        d = self._trace(index)
        graph_id, op_name, slot = d["graph_id"], d["op_name"], d["output_slot"]
        call = self.flow.call_of_trace(index)
        if _is_optimizer(d["graph_name"]) and self.flow.writer == "torch":
            return [("end", SINK_OPTIMIZER)]
        tensor_id = self.flow.trace_tensor_id(index)
        if tensor_id is not None and call is not None and \
                tensor_id in self.fs.executions.output_ids(call):
            return [("end", SINK_OUTPUT)]
        out = []
        end = self.flow.call_trace_bound(index)
        readers = self.fs.graphs.consumers(graph_id).get((op_name, slot), ())
        for reader in dict.fromkeys(r[0] for r in readers):
            out.extend(self._op_outcomes(graph_id, reader, index, end))
        if tensor_id is not None:
            for execution, position in self.flow.readers_of(
                    tensor_id, after=-1 if call is None else call):
                out.extend(self._reader_outcomes(execution, position))
        if not out:
            later = call is not None and call + 1 < len(self.fs.executions)
            if not later or self.flow.writer != "torch":
                out.append(("end", SINK_UNREAD))
            elif d["graph_name"] == BACKWARD:
                out.append(("end", END_SKIPPED))
            else:  # not returned, read by nothing in this call or any later one
                out.append(("end", END_DEAD))
        return out

    def _execution_edges(self, index, slot):
        outputs = self.execution_outputs(index)
        tensor_id = outputs[slot][0] if slot < len(outputs) else None
        out = []
        if tensor_id is not None and tensor_id >= 0:
            for execution, position in self.flow.readers_of(tensor_id, after=index):
                out.extend(self._reader_outcomes(execution, position))
        if not out:
            op_type = views.execution_digest(self.fs, index)["op_type"]
            skipped = op_type.startswith(_SCALER_OPS) and index + 1 < len(self.fs.executions)
            out.append(("end", END_SKIPPED if skipped else SINK_UNREAD))
        return out

    # -- classification -----------------------------------------------------------

    def classify(self, node):
        """``(propagating, next hop)`` of a node; next hop is a node or a terminal name."""
        memo = self._memo
        if node in memo:
            return memo[node]
        stack = [node]
        pending_edges = {}
        while stack:
            n = stack[-1]
            if n in memo:
                stack.pop()
                continue
            edges = pending_edges.get(n)
            if edges is None:
                self._visits += 1
                if self._visits > _MAX_VISITS:
                    memo[n] = (True, "analysis limit")
                    stack.pop()
                    continue
                edges = pending_edges[n] = self.edges(n)
                terminal = next((t for kind, t in edges
                                 if kind == "end" and t not in _MASKING_ENDS), None)
                if terminal is not None:
                    memo[n] = (True, terminal)
                    stack.pop()
                    continue
            todo = [m for kind, m in edges if kind == "node" and m not in memo]
            if todo:
                stack.extend(todo)
                continue
            hop = next((m for kind, m in edges if kind == "node" and memo[m][0]), None)
            if hop is not None:
                memo[n] = (True, hop)
            else:
                ends = [t for kind, t in edges if kind == "end"]
                memo[n] = (False, next((t for t in (END_SKIPPED, END_UNUSED, END_DEAD)
                                        if t in ends), END_FINITE))
            del pending_edges[n]
            stack.pop()
        return memo[node]

    def path(self, node, limit=200):
        """``(nodes from ``node`` to the sink, terminal name)`` along propagating hops."""
        nodes = [node]
        hop = self.classify(node)[1]
        while isinstance(hop, tuple) and len(nodes) < limit:
            nodes.append(hop)
            hop = self.classify(hop)[1]
        return nodes, hop if isinstance(hop, str) else "path cut at %d hops" % limit

    def execution_status(self, index):
        """``(propagating, first propagating slot or None)`` of a bad execution."""
        first = None
        for k, (_, _, h) in enumerate(self.execution_outputs(index)):
            if h is not None and h.get("any_inf_or_nan") and self.classify(("e", index, k))[0]:
                return True, k
            if h is not None and h.get("any_inf_or_nan") and first is None:
                first = k
        return False, first

    def node_name(self, node):
        """Op name of a node (traces) or op type of an execution."""
        if node[0] == "t":
            return self._trace(node[1])["op_name"]
        return views.execution_digest(self.fs, node[1])["op_type"]

    def node_wall_time(self, node):
        if node[0] == "t":
            return float(self.fs.traces.wall_times()[node[1]])
        return float(self.fs.executions.wall_times()[node[1]])
