"""JSON answers, the single error shape, and the wrapper every JSON route uses.

JSON never carries bare ``NaN``/``Infinity`` (browsers' ``JSON.parse``
rejects them): :func:`json_safe` turns non-finite floats into the strings
``"NaN"``, ``"Infinity"``, ``"-Infinity"`` and numpy values into plain
Python ones, and serialization runs with ``allow_nan=False`` so that a value
that slipped through fails loudly here instead of in the browser.
"""

import functools
import json
import logging
import math

import numpy as np
from tensorboard.backend import http_util
from werkzeug import wrappers

from tb_numerics_plugin.plugin import errors
from tb_numerics_plugin.plugin.params import Query

logger = logging.getLogger(__name__)

_JSON = "application/json"
_SEPARATORS = (",", ":")


def _float(value):
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def json_safe(obj):
    """Returns ``obj`` with only JSON-representable values.

    Args:
      obj: dicts, lists, tuples, strings, numbers, bools, None, numpy scalars
        and arrays, nested arbitrarily.

    Returns:
      The same structure with tuples and arrays as lists, numpy scalars as
      Python ones, and non-finite floats as strings.
    """
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (float, np.floating)):
        return _float(float(obj))
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    return obj


def json_response(request, body, code=200):
    """Returns a werkzeug response holding ``body`` as strict JSON.

    Raises:
      ValueError: ``body`` holds something :func:`json_safe` cannot make
        JSON (a bug in the caller, reported rather than sent).
    """
    try:
        # Fast path: the reader's dicts are JSON-safe already; walking a
        # 1000-row page in Python first would double the cost of a page.
        text = json.dumps(body, allow_nan=False, separators=_SEPARATORS)
    except (ValueError, TypeError):
        # A non-finite float (ValueError) or a numpy value (TypeError).
        text = json.dumps(json_safe(body), allow_nan=False, separators=_SEPARATORS)
    return http_util.Respond(request, text, _JSON, code=code)


def error_response(request, code, message, parameter=None):
    """Returns the single error shape: ``{"error": {"code", "message", "parameter"}}``."""
    body = {"error": {"code": code, "message": message, "parameter": parameter}}
    return json_response(request, body, code=code)


def paged(begin, end, total, items, **extra):
    """Returns the single paged shape ``{"begin", "end", "total", "items"}`` plus ``extra`` keys."""
    body = {"begin": begin, "end": end, "total": total, "items": items}
    body.update(extra)
    return body


def json_route(handler):
    """Wraps a route method ``handler(self, query) -> body`` into a WSGI app.

    Typed errors become 400/404/422 in the JSON error shape (a 422's
    traceback was logged where it was raised). Anything else is a bug on our
    side: it is logged with its traceback and answered as a JSON 500.

    Args:
      handler: a method taking a :class:`params.Query` and returning a
        JSON-able body.

    Returns:
      A method usable as a TensorBoard plugin route.
    """

    @functools.wraps(handler)
    @wrappers.Request.application
    def route(self, request):
        try:
            body = handler(self, Query(request.args))
            return json_response(request, body)
        except errors.BadParameterError as e:
            return error_response(request, 400, e.message, e.parameter)
        except errors.NotFoundError as e:
            return error_response(request, 404, e.message, e.parameter)
        except errors.UnreadableDataError as e:
            return error_response(request, 422, e.message, e.parameter)
        except Exception:  # pylint: disable=broad-except
            logger.exception("numerics plugin: %s failed on %s", handler.__name__, request.url)
            return error_response(request, 500, "internal error (logged by the server)")

    return route
