"""The torch-side tools of the root-cause bench, each as a fresh object per run.

A tool hooks the model (``attach``), wraps the training loop (``session``)
and, after the program ran (or raised), says what it found (``verdict``):
``{"alarm", "op", "module", "file", "line", "detail"}``, where ``op`` and
``module`` are None when the tool named none and ``alarm`` says whether it
reported inf/NaN at all. Module names are paths of ``model.named_modules()``
("" for the root); ``op`` is whatever the tool names, reduced to a base name
later by :func:`op_base`.

- :class:`Reference`: no tool; records which modules' outputs first held inf/NaN
  (the bench checks each case behaves as labeled with it).
- :class:`TbNumerics`: the capture, then ``tb-numerics report --json --check``.
- :class:`HfOverflow`: transformers' ``DebugUnderflowOverflow``; it raises in the
  forward hook of the first module whose weights, inputs or outputs hold inf/NaN.
- :class:`DetectAnomaly`: ``torch.autograd.detect_anomaly(check_nan=True)``; it
  raises when a backward function returns NaN and warns with the traceback of
  the forward call that created that function.
"""

import contextlib
import io
import json
import os
import re
import tempfile
import traceback
import warnings

import torch

_TORCH_DIR = os.path.dirname(torch.__file__)
_STDLIB_DIR = os.path.dirname(os.__file__)


def op_base(name):
    """The op's base name: aten.log.default, LogBackward0, Log -> "log"; add_ -> "add"."""
    if not name:
        return None
    name = re.sub(r"Backward\d*$", "", name)
    parts = name.split(".")
    if len(parts) >= 2 and parts[0] in ("aten", "prims"):
        name = parts[1]
    return name.rstrip("_").lower() or None


def innermost_outside_torch(frames):
    """``(basename, line)`` of the innermost of ``frames`` ((path, line), outermost first)
    not in torch nor the standard library, or ``(None, None)``."""
    for path, line in reversed(frames):
        if not (path.startswith(_TORCH_DIR) or path.startswith(_STDLIB_DIR)
                or path.startswith("<")):
            return os.path.basename(path), int(line)
    return None, None


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def _nothing(detail=""):
    return {"alarm": False, "op": None, "module": None, "file": None, "line": None,
            "detail": detail}


class Reference:
    """No tool: remembers the order in which modules first output inf/NaN."""

    name = "reference"

    def __init__(self, workdir):
        self.bad_modules = []
        self._handles = []

    def attach(self, model):
        for name, module in model.named_modules():
            self._handles.append(module.register_forward_hook(
                lambda m, args, out, name=name: self._check(name, out)))

    def _check(self, name, out):
        if name not in self.bad_modules and any(
                t.is_floating_point() and not bool(torch.isfinite(t).all())
                for t in _tensors(out)):
            self.bad_modules.append(name)

    def session(self):
        return contextlib.nullcontext()

    def verdict(self, error, facts):
        for handle in self._handles:
            handle.remove()
        if error is not None:
            raise error
        return _nothing()


class TbNumerics:
    """tb-numerics: FULL_HEALTH capture, then ``tb-numerics report DUMP --json --check``."""

    name = "tb-numerics"

    def __init__(self, workdir):
        self.dump = tempfile.mkdtemp(prefix="tbn-", dir=workdir)
        self.handle = None

    def attach(self, model):
        pass

    def session(self):
        from tb_numerics_plugin import torch as tbn

        self.handle = tbn.enable_dump_debug_info(self.dump, tensor_debug_mode="FULL_HEALTH",
                                                 circular_buffer_size=-1)
        return self.handle

    def verdict(self, error, facts):
        if error is not None:
            raise error
        verdict = report_verdict(self.dump, facts)
        if self.handle is not None and self.handle.errors:
            verdict["detail"] += "; %d capture errors" % self.handle.errors
        return verdict


def report_verdict(dump, facts):
    """Runs ``tb-numerics report DUMP --json --check`` in-process and reads its answer.

    Args:
      facts: the reference run's facts (``modules``, ``root``) to map op names to
        module paths; None for TF dumps (no modules).
    """
    from tb_numerics_plugin import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["report", dump, "--json", "--check"])
    if rc not in (0, 1):
        raise RuntimeError("tb-numerics report exited %d: %s" % (rc, err.getvalue().strip()))
    run = json.loads(out.getvalue())["runs"][0]
    infnan = run["alerts"].get("InfNan", 0)
    fb = run["first_bad_tensor"]
    verdict = _nothing("InfNan %d, --check exit %d" % (infnan, rc))
    verdict["alarm"] = bool(infnan) or rc == 1
    if fb is None:
        return verdict
    op_name = fb["op_name"]
    verdict["op"], scope = fb["op_type"], None
    if op_name.startswith("backward/") and op_name.count("/") >= 2:
        forward = op_name[len("backward/"):].rsplit("/", 1)[0]  # the forward op's name
        scope, _, short = forward.rpartition("/")
        verdict["op"] = re.sub(r"_\d+$", "", short)
    elif "/" in op_name:
        scope = op_name.rsplit("/", 1)[0]
    verdict["module"] = _module_of_scope(scope, facts)
    if fb["source"]:
        verdict["file"] = os.path.basename(fb["source"]["file"])
        verdict["line"] = fb["source"]["line"]
    verdict["detail"] += "; first bad: %s (%s)" % (op_name, fb["op_type"])
    return verdict


def _module_of_scope(scope, facts):
    """Module path of an op-name scope; None when it is no module (eager, optimizer)."""
    if not scope or facts is None:
        return None
    if scope in facts["modules"]:
        return scope
    return "" if scope == facts["root"] else None


class HfOverflow:
    """transformers' DebugUnderflowOverflow; the module it stops at, from its hook's frame."""

    name = "HF DebugUnderflowOverflow"

    def __init__(self, workdir):
        self.debug = None
        self.out = io.StringIO()

    def attach(self, model):
        from transformers.debug_utils import DebugUnderflowOverflow

        self.debug = DebugUnderflowOverflow(model)

    def session(self):
        return contextlib.redirect_stdout(self.out)  # it prints its frames

    def verdict(self, error, facts):
        if not (isinstance(error, ValueError) and "DebugUnderflowOverflow" in str(error)):
            if error is not None:
                raise error
            return _nothing()
        for frame, _ in traceback.walk_tb(error.__traceback__):
            if frame.f_code.co_name == "forward_hook" and frame.f_locals.get("self") is self.debug:
                module = frame.f_locals["module"]
                verdict = _nothing(self.out.getvalue().strip().splitlines()[0][:200])
                verdict.update(alarm=True, module=self.debug.module_names[module])
                return verdict
        raise RuntimeError("DebugUnderflowOverflow raised outside its hook") from error


_NAN_ERROR = re.compile(r"Function '(\w+)' returned nan values")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


class DetectAnomaly:
    """torch.autograd.detect_anomaly(check_nan=True): the function named and its forward line."""

    name = "torch detect_anomaly"

    def __init__(self, workdir):
        self.messages = []

    def attach(self, model):
        pass

    @contextlib.contextmanager
    def session(self):
        with warnings.catch_warnings(record=True) as caught, \
                torch.autograd.detect_anomaly(check_nan=True):
            warnings.simplefilter("always")
            try:
                yield
            finally:
                self.messages = [str(w.message) for w in caught]

    def verdict(self, error, facts):
        found = _NAN_ERROR.search(str(error)) if isinstance(error, RuntimeError) else None
        if found is None:
            if error is not None:
                raise error
            return _nothing()
        verdict = _nothing(found.group(0))
        verdict.update(alarm=True, op=found.group(1))
        trace = next((m for m in self.messages if "Error detected in %s" % found.group(1) in m),
                     "")
        verdict["file"], verdict["line"] = innermost_outside_torch(
            [(path, line) for path, line in _FRAME.findall(trace)])
        return verdict


TOOLS = (TbNumerics, HfOverflow, DetectAnomaly)
