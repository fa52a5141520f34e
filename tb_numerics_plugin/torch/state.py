"""The C bases of the capture's per-op state (``_record_state.c``), where built."""


class _ScopeStateTwin:
    """``ScopeState``'s stand-in without the extension: its module hooks' common case is
    never taken here, and the Python hooks do all of it."""

    def enter_sub(self, module):
        return False

    def leave_sub(self):
        return False


_TWINS = {"ScopeState": _ScopeStateTwin}


def c_base(name, twin=None):
    """``_record.<name>``: the C base of ``hooks.Scopes``, ``capture.Session``,
    ``segments.Segment`` or ``encoder.Encoder``, whose fields the C recording reads without
    a dict lookup; where the extension was not built (or lacks it), a Python stand-in
    (``twin``, else ``object``, or for ``ScopeState`` one whose fast paths decline): plain
    attributes. A build older than the stand-in's methods gets them from it."""
    twin = twin or _TWINS.get(name, object)
    try:
        from tb_numerics_plugin.torch import _record
    except ImportError:
        return twin
    base = getattr(_record, name, None)
    if base is None:
        return twin
    if any(not hasattr(base, attr) for attr in vars(twin) if not attr.startswith("_")):
        return type(name, (twin, base), {})
    return base
