"""Argument checks shared by the callbacks (no torch, no TensorFlow)."""

import os


def dump_root(value):
    """Returns ``value`` as a path string; raises ValueError naming ``dump_root``."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise ValueError("dump_root must be a non-empty path, not %r" % (value,))
    return value


def choice(name, value, allowed):
    """Returns ``value`` when it is one of ``allowed``; raises ValueError naming ``name``."""
    if value not in allowed:
        raise ValueError("%s must be one of %s, not %r" % (name, ", ".join(allowed), value))
    return value


def integer(name, value):
    """Returns ``value`` when it is an int (not a bool); raises ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("%s must be an integer, not %r" % (name, value))
    return value


def flag(name, value):
    """Returns ``value`` when it is a bool; raises ValueError naming ``name``."""
    if not isinstance(value, bool):
        raise ValueError("%s must be True or False, not %r" % (name, value))
    return value
