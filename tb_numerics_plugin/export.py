"""`tb-numerics export`: the digests of a logdir as Parquet, one row per trace and execution.

Past one machine the question "where did the first non-finite value appear,
across 1,024 ranks?" is a query, not a walk through the plugin. The export
writes what the digests hold, partitioned by host (one directory
``host=<label>`` per rank's file set, Hive style), one file per run in it::

    OUT/host=vm.rank0/part-0.parquet     # run 0 of the logdir, rank 0
    OUT/host=vm.rank1/part-0.parquet
    OUT/host=vm.rank0/part-1.parquet     # run 1 ...

so that DuckDB on one machine, or Spark/Dask on a cluster, reads
``OUT/**/*.parquet`` with ``host`` as a column (docs/export.md has the
queries). Rows of one host are in record order: graph execution traces, then
executions. Columns are built from the reader's index columns in bulk (one
Python step per distinct op, none per record); strings are dictionary-encoded.

Needs ``pyarrow`` (``pip install 'tb-numerics[export]'``); the rest of the
package does not.
"""

import os

import numpy as np

from tb_numerics_plugin.analysis import alerts as alerts_lib
from tb_numerics_plugin.analysis.summary import module_of
from tb_numerics_plugin.reader import health as health_lib
from tb_numerics_plugin.reader.steps import NO_STEP

KINDS = ("graph_execution_trace", "execution")
# The columns, in file order (docs/export.md says what each holds). ``host`` is not among
# them: it is the partition (the directory name), as Hive, Spark, Dask and DuckDB expect.
COLUMNS = ("run", "kind", "index", "step", "wall_time", "op_type", "op_name", "module",
           "graph_id", "graph_name", "output_slot", "tensor_debug_mode", "nonfinite", "alert",
           "neg_inf", "pos_inf", "nan", "size", "dtype")

_CODES = health_lib.MODE_CODES
# Per mode: the value slots of (neg_inf, pos_inf, nan, size, dtype); None where the mode has none.
_SLOTS = {
    _CODES["CONCISE_HEALTH"]: (2, 3, 4, 1, None),
    _CODES["FULL_HEALTH"]: (5, 6, 7, 4, 2),
    _CODES["FULL_NUMERICS"]: (5, 6, 7, 4, 2),
    _CODES["FULL_TENSOR"]: (5, 6, 7, 4, 2),  # the reader derived the FULL_HEALTH layout
    _CODES["SHAPE"]: (None, None, None, 3, 1),
    _CODES["REDUCE_INF_NAN_THREE_SLOTS"]: (0, 1, 2, None, None),
}
_THREE_SLOTS = _CODES["REDUCE_INF_NAN_THREE_SLOTS"]
_MAX_COUNT = float(1 << 53)


class ExportError(Exception):
    """The export cannot run (pyarrow missing, OUT not writable); the message says why."""


def _pyarrow():
    try:
        import pyarrow  # pylint: disable=import-outside-toplevel
        import pyarrow.parquet  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError as e:
        raise ExportError("export needs pyarrow (pip install 'tb-numerics[export]'): %s" % e)
    return pyarrow


def _counts(modes, values, nvals):
    """``{neg_inf, pos_inf, nan, size, dtype}``: per row (value, valid) arrays from the health
    vectors; invalid where the mode has no such slot or the record carried no values."""
    n = len(modes)
    out = {}
    for pos, name in enumerate(("neg_inf", "pos_inf", "nan", "size", "dtype")):
        value = np.zeros(n, np.float64)
        valid = np.zeros(n, bool)
        for code, slots in _SLOTS.items():
            slot = slots[pos]
            if slot is None or slot >= values.shape[1]:
                continue
            rows = (modes == code) & (nvals > slot)
            if not rows.any():
                continue
            x = values[rows, slot]
            if code == _THREE_SLOTS:  # the slot holds the value itself: present = 1
                x = (x != 0).astype(np.float64)
            value[rows] = x
            valid[rows] = np.isfinite(x) & (x >= 0) & (x <= _MAX_COUNT)
        out[name] = (value, valid)
    return out


def _host_columns(pa, run, host):
    """The column arrays of one host of ``run`` (call under ``run.lock``)."""
    fs = run.fileset(host)
    parts = []
    traces = fs.traces
    if len(traces):
        keys = traces.keys
        key = traces.cols["key"].astype(np.int32)
        ops = [fs.graphs.op(g, name) for g, name in zip(keys.context, keys.op_name)]
        parts.append({
            "kind": 0, "n": len(traces), "step": traces.cols["step"],
            "wall_time": traces.cols["wall_time"],
            "op_type": (key, [op.op_type if op is not None else None for op in ops]),
            "op_name": (key, list(keys.op_name)),
            "module": (key, [module_of(name) for name in keys.op_name]),
            "graph_id": (key, list(keys.context)),
            "graph_name": (key, [fs.graphs.graph_name(g) for g in keys.context]),
            "output_slot": np.asarray(keys.output_slot, np.int32)[key] if len(keys) else
            np.zeros(0, np.int32),
            "mode": keys.mode_array()[key], "values": traces.cols["values"],
            "alert": alerts_lib.type_column(run, "graph_execution_trace", host),
            "nvals": traces.cols["nvals"].astype(np.int64)})
    ex = fs.executions
    if len(ex):
        c = ex.cols
        strings = list(ex.strings.values)
        graph = c["graph_id"].astype(np.int32)
        no_graph = len(strings)  # eager: -1 in the column, a None entry here
        graph_codes = np.where(graph < 0, no_graph, graph).astype(np.int32)
        graph_ids = strings + [None]
        parts.append({
            "kind": 1, "n": len(ex), "step": c["step"], "wall_time": c["wall_time"],
            "op_type": (c["op_type"].astype(np.int32), strings),
            "op_name": None, "module": None,
            "graph_id": (graph_codes, graph_ids),
            "graph_name": (graph_codes, [fs.graphs.graph_name(g) if g else None
                                         for g in strings] + [None]),
            "output_slot": None, "mode": c["mode"].astype(np.int64), "values": c["values"],
            "alert": alerts_lib.type_column(run, "execution", host),
            "nvals": c["nvals"].astype(np.int64)})
    return [_part_table(pa, run.name, p) for p in parts]


def _dict_column(pa, codes, dictionary):
    """A dictionary-encoded string column; a None entry of the dictionary is a null."""
    codes = np.asarray(codes, np.int32)
    nulls = np.array([d is None for d in dictionary], bool)
    mask = nulls[codes] if nulls.any() and len(codes) else None
    safe = ["" if d is None else d for d in dictionary]
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=mask),
                                          pa.array(safe, pa.string()))


def _part_table(pa, run_name, p):
    n = p["n"]
    modes, values, nvals = p["mode"], p["values"], p["nvals"]
    if values.ndim != 2:
        values = values.reshape(n, -1)
    step = np.asarray(p["step"], np.int64)
    counts = _counts(modes, values, nvals)
    mode_names = [health_lib.MODE_NAMES.get(code, "UNSPECIFIED") for code in range(9)]
    cols = {
        "run": _dict_column(pa, np.zeros(n, np.int32), [run_name]),
        "kind": _dict_column(pa, np.zeros(n, np.int32), [KINDS[p["kind"]]]),
        "index": pa.array(np.arange(n, dtype=np.int64)),
        "step": pa.array(step, pa.int64(), mask=step == NO_STEP),
        "wall_time": pa.array(np.asarray(p["wall_time"], np.float64)),
    }
    for name in ("op_type", "op_name", "module", "graph_id", "graph_name"):
        if p[name] is None:
            cols[name] = pa.nulls(n, pa.dictionary(pa.int32(), pa.string()))
        else:
            cols[name] = _dict_column(pa, *p[name])
    cols["output_slot"] = (pa.array(p["output_slot"], pa.int32()) if p["output_slot"] is not None
                           else pa.nulls(n, pa.int32()))
    cols["tensor_debug_mode"] = _dict_column(pa, np.clip(modes, 0, 8), mode_names)
    cols["nonfinite"] = pa.array(health_lib.bad_mask(modes, values) & (nvals > 0))
    alert = p["alert"].astype(np.int32)
    cols["alert"] = _dict_column(pa, np.where(alert < 0, len(alerts_lib.TYPES), alert),
                                 list(alerts_lib.TYPES) + [None])
    for name in ("neg_inf", "pos_inf", "nan", "size"):
        value, valid = counts[name]
        cols[name] = pa.array(value.astype(np.int64), pa.int64(), mask=~valid)
    code, valid = counts["dtype"]
    unique = np.unique(code[valid])
    names = [health_lib.dtype_name(float(u)) for u in unique] + [None]  # None: no dtype
    cols["dtype"] = _dict_column(pa, np.where(valid, np.searchsorted(unique, code), len(unique)),
                                 names)
    return pa.table([cols[c] for c in COLUMNS], names=list(COLUMNS))


def export_logdir(logdir, out, run_names=None, progress=None):
    """Writes the digests of the runs of ``logdir`` under ``out`` (see the module docstring).

    Args:
      logdir: a ``reader.Logdir``.
      out: the output directory (created; files of the same names are replaced).
      run_names: the runs to export, among ``logdir.runs()`` (default: every run); run i of
        that listing is written as ``part-<i>.parquet``.
      progress: optional callable ``(run, host, rows)`` after each file written.

    Returns:
      ``{"files": [path], "rows": n, "runs": [run names]}``.

    Raises:
      ExportError: pyarrow is missing, or ``out`` cannot be written (the message names it).
    """
    pa = _pyarrow()
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel

    every = list(logdir.runs())
    names = every if run_names is None else list(run_names)
    files, rows = [], 0
    for name in names:
        number = every.index(name)  # the file name stays the same whichever runs are asked
        run = logdir.run(name)
        run.update()
        with run.lock:
            for host in run.hosts:
                tables = _host_columns(pa, run, host)
                if not tables:
                    continue
                table = pa.concat_tables(tables, promote_options="permissive")
                folder = os.path.join(out, "host=%s" % host)
                path = os.path.join(folder, "part-%d.parquet" % number)
                try:
                    os.makedirs(folder, exist_ok=True)
                    pq.write_table(table, path)
                except OSError as e:
                    raise ExportError("cannot write %s: %s" % (path, e.strerror or e))
                files.append(path)
                rows += table.num_rows
                if progress is not None:
                    progress(name, host, table.num_rows)
    return {"files": files, "rows": rows, "runs": names}
