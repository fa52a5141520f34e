"""Query-string parsing: every malformed value becomes a 400 naming its parameter.

Handlers never touch ``request.args`` directly; they ask a :class:`Query`
for typed values, so one place decides what "missing", "malformed" and
"out of range" mean for every route.
"""

import dataclasses
import re

from tb_numerics_plugin.plugin.errors import BadParameterError

_INTEGER = re.compile(r"-?[0-9]+\Z")
# Integers longer than this are not page bounds or indices anyone means;
# refusing them early also keeps int() away from pathological inputs.
_MAX_INTEGER_DIGITS = 40
# Clamp for accepted huge values: indices stay within numpy's int64.
_INT_CLAMP = 1 << 62
_TRUE = ("true", "1")
_FALSE = ("false", "0")


@dataclasses.dataclass(frozen=True)
class Page:
    """A requested index range: ``begin`` inclusive, ``end`` exclusive or None (to the end).

    Attributes:
      begin: first index asked for (>= 0).
      end: index after the last one asked for, or None for "to the end".
      cap: most items one answer may hold.
    """

    begin: int
    end: object
    cap: int

    def clip(self, total):
        """Returns the (begin, end) actually served out of ``total`` items.

        Ranges past the total or longer than the cap are shortened, never
        refused: a client may always ask for "everything" and page on.

        Args:
          total: number of items in the listed table.

        Returns:
          (int, int): ``0 <= begin <= end <= total`` and ``end - begin <= cap``.
        """
        begin = min(self.begin, total)
        end = total if self.end is None else min(self.end, total)
        return begin, min(end, begin + self.cap)

    def capped_end(self):
        """Returns the ``end`` to ask of a source that clips ranges to its own total."""
        stop = self.begin + self.cap
        return stop if self.end is None else min(self.end, stop)


class Query:
    """Typed access to one request's query parameters.

    Args:
      args: the request's ``werkzeug.datastructures.MultiDict`` of arguments.
    """

    def __init__(self, args):
        self._args = args

    def __repr__(self):
        return "Query(%s)" % "&".join("%s=%s" % kv for kv in self._args.items(multi=True))

    def string(self, name, required=False, default=None):
        """Returns a parameter as a string; an empty value counts as missing.

        Raises:
          BadParameterError: ``required`` and the parameter is missing or empty.
        """
        value = self._args.get(name)
        if value is None or value == "":
            if required:
                raise BadParameterError(name, "required parameter is missing")
            return default
        return value

    def integer(self, name, required=False, default=None, minimum=None):
        """Returns a parameter as a base-10 integer.

        Raises:
          BadParameterError: missing while ``required``, not an integer, or below ``minimum``.
        """
        text = self.string(name, required=required)
        if text is None:
            return default
        if len(text) > _MAX_INTEGER_DIGITS or not _INTEGER.match(text):
            raise BadParameterError(name, "expected an integer, got %r" % text[:50])
        value = max(-_INT_CLAMP, min(int(text), _INT_CLAMP))
        if minimum is not None and value < minimum:
            raise BadParameterError(name, "must be >= %d, got %d" % (minimum, value))
        return value

    def boolean(self, name, default=False):
        """Returns a ``true``/``false`` (or ``1``/``0``) parameter.

        Raises:
          BadParameterError: any other value.
        """
        text = self.string(name)
        if text is None:
            return default
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise BadParameterError(name, "expected true or false, got %r" % text[:50])

    def choice(self, name, choices, default=None):
        """Returns a parameter that must be one of ``choices``.

        Raises:
          BadParameterError: a value outside ``choices``.
        """
        text = self.string(name)
        if text is None:
            return default
        if text not in choices:
            raise BadParameterError(
                name, "expected one of %s, got %r" % (", ".join(choices), text[:50])
            )
        return text

    def page(self, cap):
        """Returns the ``begin``/``end`` range asked for, capped at ``cap`` items.

        ``end`` absent or ``-1`` means "to the end".

        Raises:
          BadParameterError: ``begin`` negative or malformed; ``end`` malformed,
            below -1, or before ``begin``.
        """
        begin = self.integer("begin", default=0, minimum=0)
        end = self.integer("end", default=-1, minimum=-1)
        if end == -1:
            return Page(begin, None, cap)
        if end < begin:
            raise BadParameterError("end", "must be >= begin (%d), got %d" % (begin, end))
        return Page(begin, end, cap)

    def id_list(self, name, cap):
        """Returns a required comma-separated list of non-empty ids.

        Raises:
          BadParameterError: missing, holding an empty id, or more than ``cap`` ids.
        """
        ids = self.string(name, required=True).split(",")
        if any(not i for i in ids):
            raise BadParameterError(name, "holds an empty id")
        if len(ids) > cap:
            raise BadParameterError(name, "at most %d ids per request, got %d" % (cap, len(ids)))
        return ids
