"""Training steps of one file set: the ``step`` extension field, indexed per table.

``Execution.step`` and ``GraphExecutionTrace.step`` (field 101, ``optional
int64``, docs/format.md) say which training step a record belongs to. The
tables keep it in an int64 column where :data:`NO_STEP` stands for "not
marked" (TF's dumps, records written before the first mark). A
:class:`StepIndex` answers "which steps", "how many records per step" and
"first record at or after step S" with one ``np.unique`` per table, built
once per reader generation.
"""

import numpy as np

# Column value of a record without a step (a step of exactly -2**63 reads as unmarked).
NO_STEP = np.iinfo(np.int64).min


def value(raw):
    """A step column entry as JSON: an int, or None for :data:`NO_STEP`."""
    raw = int(raw)
    return None if raw == NO_STEP else raw


class _TableSteps:
    """Distinct steps of one table with the first index and the count of each."""

    def __init__(self, column):
        marked = column != NO_STEP
        if marked.all():
            steps, first, counts = np.unique(column, return_index=True, return_counts=True)
        else:
            rows = np.flatnonzero(marked)
            steps, first, counts = np.unique(column[rows], return_index=True,
                                             return_counts=True)
            first = rows[first]
        self.steps, self.first, self.counts = steps, first.astype(np.int64), counts

    def at_or_after(self, step):
        """``(step, first index)`` of the smallest step >= ``step`` in this table, or None."""
        k = int(np.searchsorted(self.steps, step, side="left"))
        if k == len(self.steps):
            return None
        return int(self.steps[k]), int(self.first[k])


class StepIndex:
    """The steps of one file set's executions and graph execution traces.

    Args:
      executions: the int64 step column of the executions.
      traces: the int64 step column of the traces.
    """

    KINDS = ("execution", "graph_execution_trace")

    def __init__(self, executions, traces):
        self._tables = {"execution": _TableSteps(executions),
                        "graph_execution_trace": _TableSteps(traces)}
        self.steps = np.union1d(self._tables["execution"].steps,
                                self._tables["graph_execution_trace"].steps)

    def __len__(self):
        return len(self.steps)

    def rows(self, begin, end):
        """Per-step dicts of ``steps[begin:end]``: the first index and count in each table.

        Returns:
          list of dict: ``step``, ``first_execution`` / ``first_graph_execution_trace``
          (None when that table has no record of the step), ``num_executions``,
          ``num_graph_execution_traces``.
        """
        chosen = self.steps[begin:end]
        out = [{"step": int(s)} for s in chosen]
        for kind, table in self._tables.items():
            k = np.searchsorted(table.steps, chosen)
            k_safe = np.minimum(k, max(len(table.steps) - 1, 0))
            present = (k < len(table.steps)) & (
                table.steps[k_safe] == chosen if len(table.steps) else False)
            for row, here, j in zip(out, np.atleast_1d(present).tolist(), k_safe.tolist()):
                row["first_" + kind] = int(table.first[j]) if here else None
                row["num_%ss" % kind] = int(table.counts[j]) if here else 0
        return out

    def at_or_after(self, step, kind):
        """``(step, index)``: the first record of ``kind`` in the smallest step >= ``step``
        that ``kind``'s table holds, or None.

        Raises:
          KeyError: an unknown kind.
        """
        return self._tables[kind].at_or_after(step)
