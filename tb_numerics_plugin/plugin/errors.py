"""Typed errors of the plugin's HTTP routes.

All are TensorBoard ``PublicError`` subclasses, so even if one escaped our
own handler wrapper TensorBoard would still answer 400/404/422 (never 500).
The wrapper in :mod:`responses` turns them into our single JSON error shape.
"""

from tensorboard import errors as tb_errors


class BadParameterError(tb_errors.InvalidArgumentError):
    """A query parameter is missing or malformed (HTTP 400).

    Args:
      parameter: name of the offending query parameter.
      message: what is wrong with it, for a human.
    """

    def __init__(self, parameter, message):
        super().__init__("%s: %s" % (parameter, message))
        self.parameter = parameter
        self.message = message


class NotFoundError(tb_errors.NotFoundError):
    """A named run, host, graph, op, index or file does not exist (HTTP 404).

    Args:
      message: what was not found, for a human.
      parameter: the query parameter that named it, or None.
    """

    def __init__(self, message, parameter=None):
        super().__init__(message)
        self.parameter = parameter
        self.message = message


class UnreadableDataError(tb_errors.PublicError):
    """The run's dump holds data the reader cannot serve (HTTP 422).

    Nothing the client sent is wrong, and the server is not broken either: a
    record of this run (or of this host) failed to decode or to analyze. Other
    runs and hosts are unaffected. The route that raises it logs the original
    traceback first, so a bug behind it stays visible in the server log.

    Args:
      message: which run/host failed and why, for a human.
      parameter: the query parameter naming what could not be read
        (``"run"`` or ``"host"``), or None.
    """

    http_code = 422

    def __init__(self, message, parameter=None):
        super().__init__(message)
        self.parameter = parameter
        self.message = message


def failure_text(exc):
    """Returns ``"<ExceptionType>: <message>"`` of ``exc``, cut to 300 characters."""
    text = "%s: %s" % (type(exc).__name__, exc)
    return text if len(text) <= 300 else text[:299] + "…"
