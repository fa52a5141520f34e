"""Pages that survive one unreadable record: the good items are served, the bad one says why.

The reader builds a page of digests in one vectorized call, so one record it
cannot decode would fail the whole page. Only then are the page's indices
read one by one; an index that still fails becomes an error item
``{"index", "host", "error"}`` in its place (docs/http_api.md). What the
routes add on top (overflow marks, output health) is decoration: when it
fails the items are served without it and the page says so in ``warnings``.
Every failure is logged with its traceback.
"""

import logging

from tb_numerics_plugin.plugin.errors import failure_text

logger = logging.getLogger(__name__)


def read_page(read, begin, end, host, what):
    """Returns the items ``[begin, end)``, an error item in place of each unreadable one.

    Args:
      read: ``read(begin, end) -> list of dict``, one dict per index.
      begin: first index (already clipped to the table).
      end: index after the last one.
      host: the host label, copied into error items.
      what: the kind of item for messages (``"trace"``, ``"execution"``).

    Returns:
      list of dict: ``end - begin`` items in index order.
    """
    try:
        return read(begin, end)
    except Exception:  # pylint: disable=broad-except
        logger.exception("numerics plugin: reading %ss [%d, %d) of host %r failed; "
                         "reading them one by one", what, begin, end, host)
    items = []
    for index in range(begin, end):
        try:
            items.extend(read(index, index + 1))
        except Exception as e:  # pylint: disable=broad-except
            items.append({"index": index, "host": host,
                          "error": "%s #%d cannot be read: %s" % (what, index, failure_text(e))})
    return items


def readable(items):
    """Returns the items that are not error items."""
    return [item for item in items if "error" not in item]


def decorate(warnings, what, mark, *args):
    """Calls ``mark(*args)``; on failure logs it and appends a warning instead of failing the page.

    Args:
      warnings: the page's warning list, appended to.
      what: what the decoration adds, for the warning (``"overflow marks"``).
      mark: the decorating function.
      *args: its arguments.
    """
    try:
        mark(*args)
    except Exception as e:  # pylint: disable=broad-except
        logger.exception("numerics plugin: adding %s failed", what)
        warnings.append("%s unavailable: %s" % (what, failure_text(e)))
