"""The ``numerics`` TensorBoard plugin: one route table, one handler per route.

Every JSON handler parses its query through :class:`params.Query`, opens
the run's shared reader, calls one paged or vectorized reader/analysis
method and returns a body; :func:`responses.json_route` serializes it or
turns typed errors into the JSON error shape. The contract is
``docs/http_api.md``.

A run or record the reader cannot serve fails only the answer that touches
it: :meth:`NumericsPlugin._open` logs the traceback and answers 422 naming
the run and host, ``runs`` lists such a run with its ``error``
(:mod:`listing`), and a page holding one unreadable record serves the others
(:mod:`items`).
"""

import contextlib
import logging

from tensorboard import errors as tb_errors
from tensorboard.plugins import base_plugin

from tb_numerics_plugin import analysis, series
from tb_numerics_plugin.analysis import alerts as alerts_lib
from tb_numerics_plugin.analysis import growth as growth_lib
from tb_numerics_plugin.analysis.source import frame_kind
from tb_numerics_plugin.plugin import health_marks, listing, metadata, trends_route
from tb_numerics_plugin.plugin.errors import NotFoundError, UnreadableDataError, failure_text
from tb_numerics_plugin.plugin.items import decorate, read_page, readable
from tb_numerics_plugin.plugin.responses import json_route, paged
from tb_numerics_plugin.plugin.runs import RunRegistry
from tb_numerics_plugin.plugin.static import StaticFiles

_STATIC_PREFIX = "/data/plugin/%s/static/" % metadata.PLUGIN_NAME
_TRACE = "graph_execution_trace"

logger = logging.getLogger(__name__)


class NumericsPlugin(base_plugin.TBPlugin):
    """Serves tfdbg2 dumps (TensorFlow's or our PyTorch capture's) to the Numerics tab.

    Args:
      context: the ``base_plugin.TBContext`` TensorBoard builds; only
        ``context.logdir`` is used.
    """

    plugin_name = metadata.PLUGIN_NAME
    # Least time between two incremental re-reads of a run (a subclass may lower it).
    update_interval_s = 1.0

    def __init__(self, context):
        self._runs = RunRegistry(context.logdir, update_interval_s=self.update_interval_s)
        self._static = StaticFiles(_STATIC_PREFIX)
        # Start reading while TensorBoard and the browser are still starting up.
        self._runs.read_in_background()

    def get_plugin_apps(self):
        """The route table: debugger-v2's route names plus ours (docs/http_api.md)."""
        return {
            "/runs": self._serve_runs,
            "/summary": self._serve_summary,
            "/alerts": self._serve_alerts,
            "/alerts/next": self._serve_next_alert,
            "/execution/digests": self._serve_execution_digests,
            "/execution/data": self._serve_execution_data,
            "/graph_execution/digests": self._serve_graph_execution_digests,
            "/graph_execution/data": self._serve_graph_execution_data,
            "/graph_execution/search": self._serve_graph_execution_search,
            "/steps": self._serve_steps,
            "/steps/find": self._serve_find_step,
            "/trends": self._serve_trends,
            "/graphs/graph_info": self._serve_graph_info,
            "/graphs/op_info": self._serve_op_info,
            "/source_files/list": self._serve_source_files_list,
            "/source_files/file": self._serve_source_file,
            "/stack_frames/stack_frames": self._serve_stack_frames,
            "/static/*": self._static,
        }

    def is_active(self):
        """True once the logdir holds a dump (cheap: stops at the first ``*.metadata``)."""
        return self._runs.has_dumps()

    def frontend_metadata(self):
        """An iframed ES-module tab: TensorBoard imports ``static/index.js`` and calls render()."""
        return base_plugin.FrontendMetadata(
            es_module_path=metadata.ES_MODULE_PATH, tab_name=metadata.TAB_NAME
        )

    @contextlib.contextmanager
    def _open(self, query, per_host=True):
        """Yields ``(reader, host)`` for the request's ``run`` and ``host``, the reader locked.

        Args:
          query: the request's Query.
          per_host: whether the answer is about one host (named in errors)
            rather than the whole run.

        Raises:
          BadParameterError: ``run`` is missing, or the body raised it.
          NotFoundError: unknown run or host, or the body raised it.
          UnreadableDataError: anything else the body raised (the reader or
            the analysis failed on this run's data); its traceback is logged.
        """
        name = query.string("run", required=True)
        with self._runs.open(name) as reader:
            if reader is None:
                raise NotFoundError("no run named %r" % name, "run")
            hosts = list(reader.hosts)
            host = query.string("host")
            if host is None:
                host = hosts[0] if hosts else None
            elif host not in hosts:
                raise NotFoundError("run %r has no host %r" % (name, host), "host")
            try:
                yield reader, host
            except tb_errors.PublicError:
                raise
            except Exception as e:  # pylint: disable=broad-except
                where = "run %r host %r" % (name, host) if per_host else "run %r" % name
                logger.exception("numerics plugin: %s: serving %s failed", where, query)
                raise UnreadableDataError(
                    "%s holds data that cannot be served (%s); the server log has the traceback"
                    % (where, failure_text(e)), "host" if per_host and len(hosts) > 1 else "run",
                ) from e

    @json_route
    def _serve_runs(self, query):
        """GET runs: every run under the logdir with its hosts and counts."""
        del query  # no parameters
        runs = []
        for name in self._runs.names():
            try:
                with self._runs.open(name) as reader:
                    if reader is not None:
                        runs.append(listing.run_entry(name, reader))
            except Exception as e:  # pylint: disable=broad-except
                logger.exception("numerics plugin: opening run %r failed", name)
                runs.append(listing.unreadable_entry(name, e))
        return {"runs": runs}

    @json_route
    def _serve_summary(self, query):
        """GET summary: the run's report plus its alert counts per host."""
        with self._open(query, per_host=False) as (reader, _):
            # analyze_run's dict is cached: the answer is a copy.
            body = dict(analysis.analyze_run(reader))
            body["alerts_by_host"] = {h: alerts_lib.counts(reader, h) for h in reader.hosts}
            body["steps_by_host"] = {h: _steps_of(reader, h) for h in reader.hosts}
            body["growth_by_host"] = {h: len(growth_lib.host_alerts(reader.trends(h)))
                                      for h in reader.hosts}
            return body

    @json_route
    def _serve_alerts(self, query):
        """GET alerts: a page of the host's alerts plus counts per alert type."""
        with self._open(query) as (reader, host):
            alert_type = query.choice("alert_type", alerts_lib.TYPES)
            page = query.page(metadata.DIGEST_PAGE_CAP)
            total, items = alerts_lib.list_alerts(
                reader, host, alert_type, page.begin, page.capped_end()
            )
            begin = min(page.begin, total)
            counts = {
                t: alerts_lib.list_alerts(reader, host, t, 0, 0)[0] for t in alerts_lib.TYPES
            }
            health_marks.mark_alerts(items)
            return paged(begin, begin + len(items), total, items, counts=counts)

    @json_route
    def _serve_next_alert(self, query):
        """GET alerts/next: the first alert strictly after (or before) ``index``."""
        with self._open(query) as (reader, host):
            index = query.integer("index", required=True, minimum=-1)
            direction = query.choice("direction", tuple(metadata.DIRECTIONS), "next")
            kind = query.choice("kind", alerts_lib.KINDS, "graph_execution_trace")
            alert_type = query.choice("alert_type", alerts_lib.TYPES)
            alert = alerts_lib.next_alert(
                reader, index, direction=metadata.DIRECTIONS[direction], kind=kind, host=host,
                alert_type=alert_type,
            )
            health_marks.mark_alerts([alert])
            return {"alert": alert}

    @json_route
    def _serve_execution_digests(self, query):
        """GET execution/digests: a page of execution digests."""
        with self._open(query) as (reader, host):
            page = query.page(metadata.DIGEST_PAGE_CAP)
            begin, end = page.clip(reader.num_executions(host))
            items = read_page(lambda b, e: reader.execution_digests(b, e, host),
                              begin, end, host, "execution")
            return _marked(reader, host, "execution", begin, end,
                           reader.num_executions(host), items)

    @json_route
    def _serve_execution_data(self, query):
        """GET execution/data: a page of full executions (read by offset)."""
        with self._open(query) as (reader, host):
            page = query.page(metadata.DATA_PAGE_CAP)
            begin, end = page.clip(reader.num_executions(host))
            items = read_page(lambda b, e: [reader.execution(i, host) for i in range(b, e)],
                              begin, end, host, "execution")
            body = _marked(reader, host, "execution", begin, end,
                           reader.num_executions(host), items)
            for item in readable(items):
                item["output_health"] = None
                decorate(body["warnings"], "output health of execution #%d" % item["index"],
                         health_marks.add_output_health, reader, host, item)
            return body

    @json_route
    def _serve_graph_execution_digests(self, query):
        """GET graph_execution/digests: a page of trace digests."""
        with self._open(query) as (reader, host):
            page = query.page(metadata.DIGEST_PAGE_CAP)
            total = reader.num_graph_execution_traces(host)
            begin, end = page.clip(total)
            items = read_page(lambda b, e: reader.graph_execution_trace_digests(b, e, host),
                              begin, end, host, "trace")
            return _marked(reader, host, _TRACE, begin, end, total, items)

    @json_route
    def _serve_graph_execution_data(self, query):
        """GET graph_execution/data: a page of full traces (read by offset)."""
        with self._open(query) as (reader, host):
            page = query.page(metadata.DATA_PAGE_CAP)
            total = reader.num_graph_execution_traces(host)
            begin, end = page.clip(total)
            items = read_page(
                lambda b, e: [reader.graph_execution_trace(i, host) for i in range(b, e)],
                begin, end, host, "trace")
            return _marked(reader, host, _TRACE, begin, end, total, items)

    @json_route
    def _serve_graph_execution_search(self, query):
        """GET graph_execution/search: a page of the digests of matching traces."""
        with self._open(query) as (reader, host):
            op_type = query.string("op_type")
            name = query.string("name")
            bad_only = query.boolean("bad_only")
            step = query.integer("step")
            page = query.page(metadata.DIGEST_PAGE_CAP)
            indices = reader.find_graph_execution_traces(
                op_type=op_type, name_contains=name, bad_only=bad_only, host=host, step=step
            )
            begin, end = page.clip(len(indices))
            items = _trace_digests_at(reader, indices[begin:end], host)
            health_marks.mark_headroom(reader, host, _TRACE, items)
            return paged(begin, end, len(indices), items)

    @json_route
    def _serve_steps(self, query):
        """GET steps: a page of the host's training steps, each with where it starts."""
        with self._open(query) as (reader, host):
            page = query.page(metadata.DIGEST_PAGE_CAP)
            index = reader.step_index(host)
            begin, end = page.clip(len(index))
            return paged(begin, end, len(index), index.rows(begin, end))

    @json_route
    def _serve_find_step(self, query):
        """GET steps/find: per kind, the first record of the first step at or after ``step``."""
        with self._open(query) as (reader, host):
            step = query.integer("step", required=True)
            body = {}
            for kind in ("execution", _TRACE):
                found = reader.first_at_step(step, kind, host)
                body[kind] = None if found is None else {"step": found[0], "index": found[1]}
            return body

    @json_route
    def _serve_trends(self, query):
        """GET trends: one kind and stat of the host's numerics series, modules x steps."""
        with self._open(query) as (reader, host):
            kind = query.choice("kind", series.KINDS, "output")
            stat = query.choice("stat", series.STATS, "abs_max")
            max_steps = query.integer("max_steps", default=trends_route.DEFAULT_MAX_STEPS,
                                      minimum=1)
            return trends_route.trends_body(reader, host, kind, stat,
                                            min(max_steps, trends_route.MAX_STEPS_CAP))

    @json_route
    def _serve_graph_info(self, query):
        """GET graphs/graph_info: one graph's name, nesting and op count."""
        with self._open(query) as (reader, host):
            graph_id = query.string("graph_id", required=True)
            _check_graph(reader, graph_id, host)
            return reader.graph_info(graph_id, host)

    @json_route
    def _serve_op_info(self, query):
        """GET graphs/op_info: one op with its inputs, consumers and stack."""
        with self._open(query) as (reader, host):
            graph_id = query.string("graph_id", required=True)
            op_name = query.string("op_name", required=True)
            _check_graph(reader, graph_id, host)
            try:
                return reader.op_info(graph_id, op_name, host)
            except KeyError:
                raise NotFoundError(
                    "graph %r has no op %r" % (graph_id, op_name), "op_name"
                ) from None

    @json_route
    def _serve_source_files_list(self, query):
        """GET source_files/list: the dump's source file snapshots (no text)."""
        with self._open(query) as (reader, host):
            return {"items": reader.source_files(host)}

    @json_route
    def _serve_source_file(self, query):
        """GET source_files/file: one snapshot's lines, from the dump only."""
        with self._open(query) as (reader, host):
            index = query.integer("index", required=True, minimum=0)
            if index >= len(reader.source_files(host)):
                raise NotFoundError("no source file with index %d" % index, "index")
            return reader.source_file(index, host)

    @json_route
    def _serve_stack_frames(self, query):
        """GET stack_frames/stack_frames: frames by id."""
        with self._open(query) as (reader, host):
            ids = query.id_list("stack_frame_ids", metadata.STACK_FRAME_IDS_CAP)
            try:
                frames = reader.stack_frames(ids, host)
            except KeyError as e:
                raise NotFoundError("unknown stack frame id %s" % e, "stack_frame_ids") from None
            for frame in frames:  # framework / model / user (analysis/source.py)
                frame["kind"] = frame_kind(frame["file_path"])
            return {"stack_frames": frames}


def _marked(reader, host, kind, begin, end, total, items):
    """The paged body of digest/data ``items``, overflow-marked, with the page's ``warnings``."""
    warnings = []
    decorate(warnings, "overflow marks", health_marks.mark_headroom, reader, host, kind,
             readable(items))
    return paged(begin, end, total, items, warnings=warnings)


def _steps_of(reader, host):
    """``{"count", "first", "last"}`` of one host's marked training steps."""
    steps = reader.steps(host)
    return {"count": len(steps), "first": steps[0] if steps else None,
            "last": steps[-1] if steps else None}


def _check_graph(reader, graph_id, host):
    """Raises NotFoundError unless ``graph_id`` names a graph of ``host``."""
    if graph_id not in reader.graph_ids(host):
        raise NotFoundError("no graph with id %r" % graph_id, "graph_id")


def _trace_digests_at(reader, indices, host):
    """Returns the trace digests at sorted ``indices``, one reader call per contiguous stretch.

    Args:
      reader: the run's RunReader.
      indices: sorted int array of trace indices (at most a page of them).
      host: the host label.

    Returns:
      list of dict: one digest per index, in order.
    """
    items = []
    start = 0
    for k in range(1, len(indices) + 1):
        if k == len(indices) or indices[k] != indices[k - 1] + 1:
            first, last = int(indices[start]), int(indices[k - 1])
            items.extend(reader.graph_execution_trace_digests(first, last + 1, host))
            start = k
    return items
