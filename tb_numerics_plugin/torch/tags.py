"""Data flow: which recorded op produced a tensor, and user objects found again by identity.

Every output tensor the capture records gets a *tag*, an attribute stored on
the tensor itself, never in an ``id()``-keyed map (ids are reused as soon as
tensors die)::

    (serial, op_name, slot, version, tensor_id, input_name)

``serial`` numbers the segment (``segments.Segment``) that produced it,
``op_name`` and ``slot`` name the output in that segment's graph, ``version``
is the tensor's version counter when it was written, ``tensor_id`` its id in
the dump's executions and ``input_name`` the ``"op_name:slot"`` a consumer in
the same segment lists as its input. Fields are read by the index constants
below (``tag[TENSOR_ID]``). The tag is a plain tuple on purpose: it travels
with the tensor through ``deepcopy`` and ``torch.save`` (a checkpoint taken
during a capture), and a plain tuple pickles without naming this package,
so such a checkpoint loads without it and under ``torch.load(weights_only=True)``.

In-place ops re-tag the tensor (and the base of a view), and a view is
resolved through its base with the shared version counter
(:func:`producer_tag`), so the producer named in a graph's ``input_names``
is the op that last wrote the values.

Modules and parameters cannot carry attributes of ours as freely, so the
capture finds them with :class:`WeakIdMap`, keyed by identity without keeping
them alive.
"""

import weakref

import torch

TAG = "_tbn_tag"  # the tensor attribute holding the tag
SERIAL, OP_NAME, SLOT, VERSION, TENSOR_ID, INPUT_NAME = range(6)  # fields of a tag

# The tag an untagged tensor stands for, or None; set while one of these is in use:
# - the native hook (``native.NativeHook``). It keeps alias outputs (``detach``,
#   ``_unsafe_view``) in C++, untagged, because torch may attach a subclass object
#   to them next (``nn.Parameter``): they stand for the input they alias.
#   Autograd's copies of saved outputs, made without an op, stand for the output
#   they copy.
# - a :class:`StorageTags` of the dispatch mode's session, once a compiled call
#   returned values (``compiled/``): AOTAutograd may hand the caller another
#   tensor object over the memory of the value the graph returned.
stand_in_tag = None


class PyIds:
    """A session's tensor ids (``Session.tensor_ids``) where the ``_record`` extension is
    missing, ``_record.Ids`` otherwise (whose count the C recording reads and moves
    without a Python call): ``take`` hands out the next id and counts one on,
    ``peek`` reads it."""

    __slots__ = ("_next",)

    def __init__(self):
        self._next = 0

    def take(self):
        tensor_id = self._next
        self._next = tensor_id + 1
        return tensor_id

    def peek(self):
        return self._next


try:
    from tb_numerics_plugin.torch._record import Ids
except ImportError:  # the extension was not built
    Ids = PyIds


def mark(t, serial, op_name, slot, tensor_id):
    """Tags ``t`` (and, when written through a view, its base) as output ``slot`` of
    ``op_name`` in segment ``serial``; returns the tag."""
    tag = (serial, op_name, slot, t._version, tensor_id, f"{op_name}:{slot}")
    setattr(t, TAG, tag)
    if t._is_view():
        setattr(t._base, TAG, tag)
    return tag


def producer_tag(t):
    """The tag of the op that last wrote the values of ``t``, or None (an outside value).

    A view's own tag is stale once its base was written after it (the shared
    version counter moved past the view's tag): then the base's tag names the producer.
    Under the native hook an alias output has the tag of the tensor it aliases,
    and a copy autograd saved of an output the tag of that output: a view's base
    too (GPT-2's logits are a view of the ``_unsafe_view`` of the head's ``mm``).
    """
    tag = _own_or_stand_in(t)
    if t._is_view():
        base_tag = _own_or_stand_in(t._base)
        if base_tag is not None:
            version = t._version
            if tag is None or (tag[VERSION] != version and (
                    base_tag[VERSION] == version or base_tag[TENSOR_ID] > tag[TENSOR_ID])):
                return base_tag
    return tag


def _own_or_stand_in(t):
    tag = getattr(t, TAG, None)
    if tag is None and stand_in_tag is not None:
        tag = stand_in_tag(t)
    return tag


def inherit_tag(args, out):
    """Gives an alias op's output its input's tag (see ``ops._ALIAS_OPS``)."""
    if isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor):
        tag = producer_tag(args[0])
        if tag is not None:
            setattr(out, TAG, tag)


class WeakIdMap:
    """Values for objects (tensors, modules) found by identity without keeping the objects alive.

    An ``id()``-keyed dict whose entries hold a weak reference checked on
    lookup: cheaper than ``WeakIdKeyDictionary``, which builds a reference
    object per query (hundreds per step). A dead object's entry is dropped by
    its reference's callback, so a reused id never finds a stale value.

    Attributes:
      table: ``id(obj) -> (weak reference, value)``; the C recorder reads a
        ``Scopes``' parameter names from it directly (``_record_input.c``).
    """

    def __init__(self):
        self.table = {}

    def set(self, obj, value):
        """Maps ``obj`` to ``value`` (replacing an earlier value)."""
        key, items = id(obj), self.table

        def drop(ref):
            if items.get(key, (None,))[0] is ref:
                del items[key]

        items[key] = (weakref.ref(obj, drop), value)

    def get(self, obj):
        """The value of ``obj``, or None."""
        known = self.table.get(id(obj))
        return known[1] if known is not None and known[0]() is obj else None


class StorageTags:
    """Tags found by the memory a tensor covers: ``(storage, offset, shape, strides, dtype)``.

    A compiled call's returned values are tagged inside the graph (``compiled.custom_ops.emit``),
    but the caller may get a different tensor object over the same memory (AOTAutograd
    regenerates an output that aliases an intermediate). Storage objects live exactly
    as long as their memory, so an entry never outlives it and freed memory reused by
    a new tensor is never mistaken for the old value. Called as ``stand_in_tag``.
    """

    def __init__(self):
        self._by_storage = WeakIdMap()  # storage -> {layout: tag}

    @staticmethod
    def _layout(t):
        return (t.storage_offset(), t.shape, t.stride(), t.dtype)

    def remember(self, t, tag):
        """Notes ``tag`` for the memory ``t`` covers."""
        storage = t.untyped_storage()
        known = self._by_storage.get(storage)
        if known is None:
            known = {}
            self._by_storage.set(storage, known)
        known[self._layout(t)] = tag

    def __call__(self, t):
        """The tag remembered for the memory ``t`` covers, or None."""
        try:
            known = self._by_storage.get(t.untyped_storage())
        except (RuntimeError, NotImplementedError):  # no storage (sparse, some subclasses)
            return None
        return known.get(self._layout(t)) if known is not None else None
