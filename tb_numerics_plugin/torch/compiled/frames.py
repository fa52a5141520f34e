"""Which frames are compiled code, and whose call runs a compiled frame.

:func:`called_from_compiled` tells the per-op hooks that an op comes from a
compiled graph's generated Python file (recorded with its graph, not one by
one); :func:`calling_module` and :func:`calling_optimizer` name the module or
optimizer whose compiled call opened an execution.
"""

import os

import torch


def calling_optimizer(frame):
    """The optimizer whose method runs ``frame`` or an outer frame (a compiled optimizer
    step: Dynamo compiles ``Optimizer.step``, or its ``_use_grad`` wrapper, as a frame of
    its own), or None."""
    return _calling_self(frame, torch.optim.Optimizer, lambda code: "self" in code.co_varnames)


def calling_module(frame):
    """The module whose call runs ``frame`` or an outer frame (a model compiled in place
    by ``model.compile()``: its ``_call_impl`` frame), or None."""
    return _calling_self(frame, torch.nn.Module, lambda code: code.co_name in _MODULE_CALLS)


_MODULE_CALLS = ("_call_impl", "_wrapped_call_impl", "forward")


def _calling_self(frame, kind, accepts, depth=64):
    """The ``self`` of type ``kind`` of the first frame, ``frame`` outwards, whose code
    ``accepts``, or None (looked for in ``depth`` frames)."""
    while frame is not None and depth > 0:
        if accepts(frame.f_code):
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, kind):
                return candidate
        frame = frame.f_back
        depth -= 1
    return None


_CACHE_DIR = [None]


def generated_dir():
    """The directory of the Python files inductor generates (normalized, ending in a separator)."""
    root = _CACHE_DIR[0]
    if root is None:
        try:
            from torch._inductor.runtime.cache_dir_utils import cache_dir

            root = os.path.normcase(os.path.realpath(cache_dir())) + os.sep
        except Exception:  # an inductor without it: nothing is generated code
            root = "\0"
        _CACHE_DIR[0] = root
    return root


_TORCH_DIR = os.path.normcase(os.path.realpath(os.path.dirname(torch.__file__))) + os.sep
_generated = {}  # id(code object) -> 0 (other code), 1 (generated code) or 2 (torch's own)
_codes = {}  # keeps every key's code object alive
_MAX_HOPS = 16


def called_from_compiled(frame):
    """Whether the op whose dispatch ``frame`` called comes from inductor's generated code
    (the Python file of a compiled graph): the first frame outside torch's own
    files, walking out from ``frame``, is generated code."""
    for _ in range(_MAX_HOPS):
        if frame is None:
            return False
        code = frame.f_code
        kind = _generated.get(id(code))
        if kind is None:
            kind = _classify(code)
        if kind != 2:
            return kind == 1
        frame = frame.f_back
    return False


def _classify(code):
    path = os.path.normcase(os.path.realpath(code.co_filename))
    if path.startswith(generated_dir()):
        kind = 1
    else:
        kind = 2 if path.startswith(_TORCH_DIR) else 0
    _codes[id(code)] = code
    _generated[id(code)] = kind
    return kind
