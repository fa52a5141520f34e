"""Typed errors of the plugin's HTTP routes.

Both are TensorBoard ``PublicError`` subclasses, so even if one escaped our
own handler wrapper TensorBoard would still answer 400/404 (never 500). The
wrapper in :mod:`responses` turns them into our single JSON error shape.
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
