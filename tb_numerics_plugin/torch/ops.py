"""What an aten op is to the capture: its name, whether it is recorded, which tensors it touched.

:func:`analyze_op` classifies an ``OpOverload`` once from its schema (the
session caches the answer per op); :func:`tensors_in` and :func:`outputs_of`
pick the tensors an op read and produced out of its arguments and result;
:func:`nested_tensors` finds the tensors of a module call's arguments and
return value, nested in containers.
"""

import collections

import torch

# Ops whose outputs carry no values of their own: uninitialized memory (which
# can hold NaN bit patterns), storage plumbing, or scalars read back.
_NO_VALUE_OPS = frozenset((
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
    "resize_", "set_", "_local_scalar_dense", "lift_fresh", "_to_copy_meta",
))

# Ops whose output shares its input's storage without being a view to
# autograd (no ``_base``): skipped like views, their output inherits the
# input's tag so data flow still reaches the real producer (``detach`` is how
# autograd stores a gradient into ``.grad``; ``tags.inherit_tag``).
_ALIAS_OPS = frozenset(("_unsafe_view", "_reshape_alias", "alias", "detach"))

OpInfo = collections.namedtuple("OpInfo", "op_type short skip writes alias")


def analyze_op(func):
    """Classifies an ``OpOverload`` once: name, skipped (view/metadata) or not, written args.

    Returns:
      OpInfo(op_type, short, skip, writes, alias) where ``writes`` are the
      indexes of arguments the op mutates (in-place and ``out=`` ops) and
      ``alias`` marks ops in ``_ALIAS_OPS``.
    """
    schema = func._schema
    short = func.overloadpacket.__name__
    writes = tuple(i for i, a in enumerate(schema.arguments)
                   if a.alias_info is not None and a.alias_info.is_write)
    is_view = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    # Ops returning no tensor (profiler records, scalars) and writing none carry no values.
    no_tensor_out = not writes and not any("Tensor" in str(r.type) for r in schema.returns)
    alias = short in _ALIAS_OPS
    skip = is_view or alias or no_tensor_out or short in _NO_VALUE_OPS
    return OpInfo("%s.%s.%s" % (func.namespace, short, func._overloadname), short, skip, writes,
                  alias)


def _collect_tensors(items, found):
    """Appends the tensors among ``items``, and in lists/tuples of them, to ``found``."""
    for a in items:
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif type(a) in (list, tuple):
            found.extend(x for x in a if isinstance(x, torch.Tensor))
    return found


def tensors_in(args, kwargs):
    """Returns the tensors among positional/keyword args and lists of them, in order."""
    found = _collect_tensors(args, [])
    return _collect_tensors(kwargs.values(), found) if kwargs else found


def outputs_of(writes, args, out):
    """Returns the tensors an op produced: its returns, or the args it wrote when it returns none.

    Args:
      writes: ``OpInfo.writes`` of the op.
    """
    if isinstance(out, torch.Tensor):
        return [out]
    if type(out) in (list, tuple) and out:
        return _collect_tensors(out, [])
    if writes:
        return tensors_in([args[i] for i in writes if i < len(args)], None)
    return []


def nested_tensors(value, found, depth=0):
    """Appends the tensors in ``value`` and its nested containers (tuples, lists, dicts,
    dataclasses; 4 levels) to ``found``."""
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif depth < 4:
        if isinstance(value, dict):
            value = value.values()
        elif hasattr(value, "__dataclass_fields__"):
            value = [getattr(value, f, None) for f in value.__dataclass_fields__]
        elif not isinstance(value, (list, tuple)):
            return
        for item in value:
            nested_tensors(item, found, depth + 1)
