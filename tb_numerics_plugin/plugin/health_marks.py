"""What the routes add to the health they serve, so the browser decodes and judges nothing.

- ``overflow_limit``: on a health dict whose tensor is an OverflowHeadroom
  alert, its dtype's largest finite value. Which tensors are alerts is the
  alerts module's answer (its rule runs over the raw health rows); this
  module only looks it up for the rows of one answer.
- ``output_health``: an execution's health per output slot, decoded from its
  debug values with the slot mapping of the lineage analysis (a dump may
  trace only the float outputs).
"""

from tb_numerics_plugin.analysis import alerts as alerts_lib
from tb_numerics_plugin.analysis import health as health_lib

_HEADROOM = "OverflowHeadroom"


def mark_headroom(reader, host, kind, items):
    """Adds ``overflow_limit`` to the ``health`` of items that are OverflowHeadroom alerts.

    Only FULL_NUMERICS records magnitudes: other items cost nothing (not even
    the alerts analysis). Then one ``next_alert`` lookup per flagged item
    (plus one per gap between them), none when the host has no such alert.

    Args:
      reader: the run's RunReader, locked by the caller.
      host: the host label.
      kind: ``"graph_execution_trace"`` or ``"execution"``.
      items: digest-like dicts with ``index`` and ``health``, sorted by index;
        their health dicts are changed in place (the reader builds new ones
        for every call).

    Returns:
      ``items``.
    """
    numeric = [it for it in items if (it.get("health") or {}).get("mode") == "FULL_NUMERICS"]
    if not numeric or not alerts_lib.counts(reader, host)[_HEADROOM]:
        return items
    upcoming = None  # index of the first alert at or after the current item
    for item in numeric:
        health = item["health"]
        index = item["index"]
        if upcoming is None or upcoming < index:
            alert = alerts_lib.next_alert(reader, index - 1, +1, kind, host, _HEADROOM)
            upcoming = alert["index"] if alert else float("inf")
        if upcoming == index:
            health["overflow_limit"] = health_lib.DTYPE_MAX[health["dtype"]]
    return items


def mark_alerts(items):
    """Adds ``overflow_limit`` to the health of OverflowHeadroom alert dicts (in place)."""
    for alert in items:
        if alert and alert["alert_type"] == _HEADROOM and alert.get("health"):
            health = alert["health"]
            health["overflow_limit"] = health_lib.DTYPE_MAX[health["dtype"]]
    return items


def add_output_health(reader, host, execution):
    """Adds ``output_health`` (a decoded Health or None per output slot) to an execution.

    The execution's own ``health`` (its digest's, already marked by
    :func:`mark_headroom`) is the first output's that shows inf/NaN, else the
    first recorded one; an ``overflow_limit`` on it goes to that output too.

    Args:
      reader: the run's RunReader, locked by the caller.
      host: the host label.
      execution: an ``execution/data`` item, changed in place.

    Returns:
      ``execution``.
    """
    outputs = alerts_lib.lineage(reader, host).execution_outputs(execution["index"])
    # Copies: the lineage analysis caches its dicts.
    healths = [None if h is None else dict(h) for _, _, h in outputs]
    own = execution.get("health") or {}
    if "overflow_limit" in own:
        plain = {k: v for k, v in own.items() if k != "overflow_limit"}
        for h in healths:
            if h == plain:
                h["overflow_limit"] = own["overflow_limit"]
                break
    execution["output_health"] = healths
    return execution
