"""One run's entry in the ``runs`` route: counts, writer status and warnings, or what failed.

A run whose records cannot be read must not take the list down with it:
every field is read on its own, a field that raises is logged with its
traceback and listed as ``null``, and the entry says why in ``error``. The
other runs of the logdir are listed as usual.
"""

import logging

from tb_numerics_plugin.plugin.errors import failure_text

logger = logging.getLogger(__name__)

# Most warnings one entry carries; ``num_warnings`` tells how many there are.
MAX_WARNINGS = 50


def _counts(reader, hosts):
    """The entry's summed fields, each a thunk so that one failing leaves the others."""
    return {
        "tensor_debug_mode": lambda: reader.tensor_debug_mode,
        "num_executions": lambda: sum(reader.num_executions(h) for h in hosts),
        "num_graph_execution_traces": lambda: sum(
            reader.num_graph_execution_traces(h) for h in hosts),
        "num_graphs": lambda: sum(len(reader.graph_ids(h)) for h in hosts),
    }


def run_entry(name, reader):
    """Returns the ``runs`` route's entry for one run, counts summed over its hosts.

    Args:
      name: the run name.
      reader: the run's RunReader, locked by the caller.

    Returns:
      dict: ``run``, ``hosts``, ``tensor_debug_mode``, the three counts (each
      ``None`` when it could not be read), ``writer_status`` (host -> the
      sidecar status with its ``notes``, or None), ``warnings`` (the first
      :data:`MAX_WARNINGS`), ``num_warnings`` and ``error`` (None, or what
      could not be read).
    """
    problems = []
    try:
        hosts = list(reader.hosts)
    except Exception as e:  # pylint: disable=broad-except
        logger.exception("numerics plugin: listing the hosts of run %r failed", name)
        hosts = []
        problems.append("hosts: " + failure_text(e))
    entry = {"run": name, "hosts": hosts}
    for key, read in _counts(reader, hosts).items():
        try:
            entry[key] = read()
        except Exception as e:  # pylint: disable=broad-except
            logger.exception("numerics plugin: reading %s of run %r failed", key, name)
            entry[key] = None
            problems.append("%s: %s" % (key, failure_text(e)))
    entry["writer_status"] = writer_status(name, reader, hosts, problems)
    warnings = _warnings(name, reader, problems)
    entry["warnings"] = warnings[:MAX_WARNINGS]
    entry["num_warnings"] = len(warnings)
    entry["error"] = None if not problems else (
        "run %r is partly unreadable (%s); the server log has the traceback"
        % (name, "; ".join(problems)))
    return entry


def unreadable_entry(name, exc):
    """Returns the entry of a run that could not even be opened."""
    return {"run": name, "hosts": [], "tensor_debug_mode": None, "num_executions": None,
            "num_graph_execution_traces": None, "num_graphs": None, "writer_status": {},
            "warnings": [], "num_warnings": 0,
            "error": "run %r cannot be opened (%s); the server log has the traceback"
                     % (name, failure_text(exc))}


def writer_status(name, reader, hosts, problems):
    """Returns ``{host: status or None}`` from ``reader.writer_status`` where the reader has it.

    A status is the writer's sidecar (docs/http_api.md) with ``notes``, human
    sentences about history that may be lost; None for a dump without one
    (TensorFlow's). A host whose status raises gets None and a problem.
    """
    status_of = getattr(reader, "writer_status", None)
    if status_of is None:
        return {h: None for h in hosts}
    out = {}
    for host in hosts:
        try:
            out[host] = status_of(host)
        except Exception as e:  # pylint: disable=broad-except
            logger.exception("numerics plugin: writer status of %r host %r failed", name, host)
            out[host] = None
            problems.append("writer_status of %s: %s" % (host, failure_text(e)))
    return out


def _warnings(name, reader, problems):
    try:
        return list(reader.warnings)
    except Exception as e:  # pylint: disable=broad-except
        logger.exception("numerics plugin: warnings of run %r failed", name)
        problems.append("warnings: " + failure_text(e))
        return []
