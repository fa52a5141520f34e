"""Module and optimizer hooks: op scopes and the boundaries of graph executions.

Global module forward hooks give module paths and the boundaries of root
forward calls; global optimizer step hooks mark optimizer steps. The hooks
ignore other threads (the dispatch mode only sees the enabling thread) and
calls made while the session is recording (it holds the recording token).
With ``stop_on_nonfinite`` the hooks are also where a stop is raised into the
training step (``stop.py``), after the token is given back.
"""

import threading

from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

from tb_numerics_plugin.torch import graphs


class ScopeHooks:
    """The hook half of ``capture.Session`` (a mixin: it shares the session's state).

    Uses the session's ``acquire``, ``release``, ``fail``, ``_switch``, ``stacks``, ``_thread``,
    ``_depth``, ``_scopes``, ``_in_optimizer``, ``_paths``, ``_current_paths``
    and ``_param_names``.
    """

    def _register_hooks(self):
        """Registers the global hooks; returns their handles (each removed on stop)."""
        return [
            nn_module.register_module_forward_pre_hook(self._module_pre),
            nn_module.register_module_forward_hook(self._module_post, always_call=True,
                                                  with_kwargs=True),
            optim_module.register_optimizer_step_pre_hook(self._optimizer_pre),
            optim_module.register_optimizer_step_post_hook(self._optimizer_post),
        ]

    def _module_pre(self, module, args):
        if threading.get_ident() != self._thread or not self.acquire():
            return
        self._depth += 1
        try:
            if self._depth == 1:
                self._in_optimizer = False
                self._enter_root(module, args)
            else:
                paths = self._current_paths
                path = paths.get(module) if paths is not None else None
                self._scopes.append(path or type(module).__name__)
        except Exception as exc:
            self.fail("module pre-hook", exc)
        finally:
            self.release()
        if self._stop_reason is not None and self._depth == 1:
            self.raise_pending_stop()

    def _enter_root(self, module, args):
        name = root_name(module)
        self._scopes = [name]
        paths = self._paths.get(module)
        if paths is None:
            paths = module_paths(module)
            for pname, p in list(module.named_parameters()) + list(module.named_buffers()):
                self._param_names.set(p, _user_path(pname))
            self._paths.set(module, paths)
        self._current_paths = paths
        self._switch(name + ".forward", self.stacks.call_site(3)).set_arguments(args)

    def _module_post(self, module, args, kwargs, output):
        if threading.get_ident() != self._thread or self._depth == 0 or not self.acquire():
            return
        self._depth -= 1
        try:
            if self._scopes:
                self._scopes.pop()
            if self._depth == 0:
                seg = self._segment
                if seg is not None:
                    if kwargs:  # the global pre-hook sees positional arguments only
                        seg.set_arguments(kwargs)
                    seg.set_outputs(output)
                self._switch(None, open_new=False)
                if seg is not None and self.watch_nonfinite:
                    self.check_root_outputs(seg)
        except Exception as exc:
            self.fail("module post-hook", exc)
        finally:
            self.release()
        if self._stop_reason is not None and self._depth == 0:
            self.raise_pending_stop()

    def _optimizer_pre(self, optimizer, args, kwargs):
        if threading.get_ident() != self._thread or self._depth > 0 or not self.acquire():
            return
        try:
            self._in_optimizer = True
            self._switch(type(optimizer).__name__ + ".step", self.stacks.call_site(3))
            if self.watch_nonfinite:
                self.check_optimizer(optimizer, grads=True)
        except Exception as exc:
            self.fail("optimizer pre-hook", exc)
        finally:
            self.release()
        if self._stop_reason is not None:
            self.raise_pending_stop()

    def _optimizer_post(self, optimizer, args, kwargs):
        if (threading.get_ident() != self._thread or not self._in_optimizer
                or not self.acquire()):
            return
        try:
            self._in_optimizer = False
            self._switch(None, open_new=False)
            if self.watch_nonfinite:
                self.check_optimizer(optimizer, grads=False)
        except Exception as exc:
            self.fail("optimizer post-hook", exc)
        finally:
            self.release()
        if self._stop_reason is not None:
            self.raise_pending_stop()


def root_name(module):
    """The scope name of a root module call: its class name (a compiled model's own class)."""
    return type(getattr(module, "_orig_mod", module)).__name__


def module_paths(root):
    """Every submodule of ``root`` mapped to its path as scopes name it.

    Returns:
      ``graphs.WeakIdMap``: submodule -> dotted path (``encoder.layers.0``), the
      root itself -> :func:`root_name`; a module reachable by several paths keeps
      the first ``named_modules`` gives.
    """
    name = root_name(root)
    paths = graphs.WeakIdMap()
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

