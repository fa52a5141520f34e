"""Op scopes: module and optimizer hooks, and the boundaries of graph executions.

A :class:`Scopes` (``capture.Session.scopes``) owns what the capture knows
about the calls in progress: the nesting depth of module calls, the scope
stack that names ops (``Net/encoder.layers.0``), whether an optimizer step is
running, and the module paths and parameter names of each root module.
Its global module forward hooks give module paths and the boundaries of root
forward calls; its global optimizer step hooks mark optimizer steps. The
hooks ignore other threads (the dispatch mode only sees the enabling thread)
and calls made while the session is recording (it holds the recording token).
With ``stop_on_nonfinite`` the hooks are also where a stop is raised into the
training step (``stop.py``), after the token is given back.
"""

from threading import get_ident as _get_ident

from torch.compiler import is_compiling as _is_compiling
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

from tb_numerics_plugin.torch.state import c_base
from tb_numerics_plugin.torch.tags import WeakIdMap

_RAISED = object()  # the forward post-hook's output when the forward raised


class Scopes(c_base("ScopeState")):  # depth, in_optimizer and stack: fields the C recording reads
    """The scope state of a capture session and the hooks that keep it.

    The session reads ``depth``, ``stack`` and ``in_optimizer`` on every op
    (an op runs inside a module call when ``depth > 0 or in_optimizer``; its
    scope is ``stack[-1]``), and :meth:`param_name` to name outside inputs.

    Args:
      session: the ``capture.Session``. The hooks use its recording token
        (``gate``, and ``acquire`` when it is not free), ``fail``, ``_thread`` (the capturing
        thread), ``_segment`` (the open execution) and ``switch`` (finish it,
        open the next), ``call_site``, and with ``watch_nonfinite``
        the stop checks of ``stop.NonFiniteWatch`` (``check_root_outputs``,
        ``check_optimizer``, ``raise_pending_stop``).

    A submodule's call inside a root call is the hooks' common case: the C base
    (``enter_sub``, ``leave_sub``) pushes and pops its path without the Python
    hooks' body, and declines (False) whatever else, which the Python hooks do.

    Attributes:
      depth: module calls in progress (0 outside any).
      stack: scope names of the calls in progress, the root module's class name first.
      in_optimizer: an optimizer step is running.
      thread, gate: the session's capturing thread and recording token (``register``).
      paths: the module paths of the root call in progress (a ``WeakIdMap``'s table).
    """

    def __init__(self, session):
        self._session = session
        self.depth = 0
        self.stack = []
        self.in_optimizer = False
        # root module -> (its scope name, its execution's name, WeakIdMap(module -> path))
        self._paths = WeakIdMap()
        self._current_paths = None  # the paths of the root call in progress
        self.paths = None  # its table, read by enter_sub
        self._param_names = WeakIdMap()  # parameter/buffer -> name
        self.param_table = self._param_names.table  # what the C recorder reads

    def reset(self):
        """Forgets the calls in progress (the capture starts, pauses, resumes or raised
        a stop from a boundary); the paths and names of known modules stay."""
        self.depth = 0
        self.stack = []
        self.in_optimizer = False
        self._current_paths = self.paths = None

    def param_name(self, t):
        """The parameter or buffer name of ``t`` under the root modules seen, or None."""
        return self._param_names.get(t)

    def register(self):
        """Registers the global hooks; returns their handles (each removed on stop)."""
        self.thread, self.gate = self._session._thread, self._session.gate
        return [
            nn_module.register_module_forward_pre_hook(self._module_pre),
            nn_module.register_module_forward_hook(self._module_post, always_call=True,
                                                  with_kwargs=True),
            optim_module.register_optimizer_step_pre_hook(self._optimizer_pre),
            optim_module.register_optimizer_step_post_hook(self._optimizer_post),
        ]

    def _module_pre(self, module, args):
        # (Dynamo traces global hooks: inside a compiled region they do nothing)
        if _is_compiling() or self.enter_sub(module):
            return
        s = self._session
        if _get_ident() != s._thread:
            return
        if self.depth == 0 and s.watch_nonfinite:  # a stop decided before the root call
            s.raise_pending_stop()
        gate = s.gate
        if not (gate.take() or s.acquire()):
            return
        self.depth += 1
        try:
            if self.depth == 1:
                self.in_optimizer = False
                self._enter_root(module, args)
            else:  # a submodule's call: its scope only
                paths = self._current_paths
                path = paths.get(module) if paths is not None else None
                self.stack.append(path or type(module).__name__)
        except Exception as exc:
            s.fail("module pre-hook", exc)
        finally:
            gate.give()

    def _enter_root(self, module, args):
        s = self._session
        known = self._paths.get(module)
        if known is None:
            for pname, p in list(module.named_parameters()) + list(module.named_buffers()):
                self._param_names.set(p, _user_path(pname))
            name = root_name(module)
            known = (name, name + ".forward", module_paths(module))
            self._paths.set(module, known)
        name, execution, self._current_paths = known
        self.paths = self._current_paths.table
        self.stack = [name]
        s.switch(execution, s.call_site()).set_arguments(args)

    def _module_post(self, module, args, kwargs, output=_RAISED):
        # When the forward raised, torch calls an always_call hook as hook(module, args,
        # result), without kwargs even for a hook registered with_kwargs: the scope still
        # ends (the execution is written with what it recorded), and nothing is raised.
        raised = output is _RAISED
        if _is_compiling() or self.leave_sub():
            return
        s = self._session
        if _get_ident() != s._thread or self.depth == 0:
            return
        gate = s.gate
        if not (gate.take() or s.acquire()):
            return
        self.depth -= 1
        try:
            if self.stack:
                self.stack.pop()
            if self.depth == 0:
                seg = s._segment
                if seg is not None and not raised:
                    if kwargs:  # the global pre-hook sees positional arguments only
                        seg.set_arguments(kwargs)
                    seg.set_outputs(output)
                s.switch(None, open_new=False)
                if seg is not None and s.watch_nonfinite and not raised:
                    s.check_root_outputs(seg)
        except Exception as exc:
            s.fail("module post-hook", exc)
        finally:
            gate.give()
        if self.depth == 0 and not raised and s.watch_nonfinite:
            s.raise_pending_stop()

    def _optimizer_pre(self, optimizer, args, kwargs):
        s = self._session
        if _is_compiling() or _get_ident() != s._thread or self.depth > 0:
            return
        gate = s.gate
        if not (gate.take() or s.acquire()):
            return
        name, stack_ids = type(optimizer).__name__ + ".step", ()
        try:
            stack_ids = s.call_site()
            self.in_optimizer = True
            seg = s.switch(name, stack_ids)
            if s.watch_nonfinite and s.check_optimizer(optimizer, grads=True):
                # The step is about to read them: on disk before the decision, or the
                # analysis takes an inf gradient nobody read yet for a skipped step's.
                seg.set_arguments(gradients(optimizer))
        except Exception as exc:
            s.fail("optimizer pre-hook", exc)
        finally:
            gate.give()
        if s.watch_nonfinite and s.raise_pending_stop():  # decided, and training goes on
            self._reopen_step(name, stack_ids)  # (the step still runs)

    def _reopen_step(self, name, stack_ids):
        """Opens the optimizer step's execution again (a stop decision closed it)."""
        s = self._session
        if not s.acquire():
            return
        try:
            self.in_optimizer = True
            s.switch(name, stack_ids)
        except Exception as exc:
            s.fail("optimizer pre-hook", exc)
        finally:
            s.release()

    def _optimizer_post(self, optimizer, args, kwargs):
        s = self._session
        if _is_compiling() or _get_ident() != s._thread or not self.in_optimizer:
            return
        gate = s.gate
        if not (gate.take() or s.acquire()):
            return
        try:
            self.in_optimizer = False
            s.switch(None, open_new=False)
            if s.watch_nonfinite:
                s.check_optimizer(optimizer, grads=False)
        except Exception as exc:
            s.fail("optimizer post-hook", exc)
        finally:
            gate.give()
        if s.watch_nonfinite:
            s.raise_pending_stop()


def gradients(optimizer):
    """The gradients an optimizer step reads: those of its parameters that have one."""
    return [p.grad for group in optimizer.param_groups for p in group["params"]
            if p.grad is not None]


def root_name(module):
    """The scope name of a root module call: its class name (a compiled model's own class).

    ``torch.compile``'s wrapper registers the model as its submodule ``_orig_mod``; it is
    read from ``_modules``, since ``getattr`` on a module without one runs
    ``nn.Module.__getattr__`` and raises inside (about 3,000 instructions per root call).
    """
    modules = getattr(module, "_modules", None)
    inner = modules.get("_orig_mod") if modules else None
    return type(module if inner is None else inner).__name__


def module_paths(root):
    """Every submodule of ``root`` mapped to its path as scopes name it.

    Returns:
      ``tags.WeakIdMap``: submodule -> dotted path (``encoder.layers.0``), the
      root itself -> :func:`root_name`; a module reachable by several paths keeps
      the first ``named_modules`` gives.
    """
    name = root_name(root)
    paths = WeakIdMap()
    for path, sub in root.named_modules():
        paths.set(sub, _user_path(path) or name)
    return paths


def _user_path(path):
    """A module or parameter path as the user's model names it.

    ``torch.compile`` wraps a model in an ``OptimizedModule`` that holds it as ``_orig_mod``, so
    its paths read ``_orig_mod.0.weight``; the segment is dropped (``0.weight``).
    """
    if "_orig_mod" not in path:
        return path
    return ".".join(part for part in path.split(".") if part != "_orig_mod")

