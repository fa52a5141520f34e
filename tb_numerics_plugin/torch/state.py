"""The C bases of the capture's per-op state (``_record_state.c``), where built."""


def c_base(name):
    """``_record.<name>``: the C base of ``hooks.Scopes``, ``capture.Session`` or
    ``encoder.Encoder``, whose fields the C recording reads without a dict lookup; where
    the extension was not built (or lacks it), ``object``: plain attributes."""
    try:
        from tb_numerics_plugin.torch import _record
    except ImportError:
        return object
    return getattr(_record, name, object)
