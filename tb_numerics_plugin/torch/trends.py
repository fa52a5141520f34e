"""Numerics over time: one small summary per module and step of outputs and their gradients.

With ``enable_dump_debug_info(..., trends=True)`` (or ``trends=N``: steps
divisible by N) every module call of the enabling thread adds the raw health
row (``health.LEVEL_MOMENTS``) of its primary floating output (kind
``output``) and, in backward, of the gradient flowing into that tensor (kind
``grad``). When the step ends, the rows of each (kind, module) are merged
(``series.merge_raw``: several calls of a module in a step give one summary)
and written as one event of the series file beside the file set
(``series.py`` is the format).

It runs beside the capture, not through it: its own global module forward
hooks, an optimizer step post hook and tensor hooks, installed at enable and
removed at disable, never by a pause between ``trace_steps`` windows. Rows
are computed by a ``kernels.HealthBatch`` of its own: one C pass per tensor on
CPU; queued on the device and fetched once per step on CUDA (no sync per
module). While it computes it holds the session's recording token, so the
capture never records its ops. Errors are counted by ``session.fail`` and
never reach the training step.

A step ends at the next ``DumpHandle.step()`` mark and at disable. A program
that never marks steps gets implicit ones: each ``optimizer.step()`` ends one,
numbered 0, 1, 2, ... (its tfdbg records then carry no step). Rows of module
calls made before the first mark (after the last optimizer step) are dropped.
"""

import functools
import os
import threading
import weakref

import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

from tb_numerics_plugin import series
from tb_numerics_plugin.torch import health, hooks, kernels
from tb_numerics_plugin.torch.tags import WeakIdMap

_current_autograd_node = torch._C._current_autograd_node
_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled
_get_ident = threading.get_ident
_STRIDED = torch.strided
_DTYPE_NAMES = {d: str(d).replace("torch.", "") for d in health.HEALTH_DTYPES}
_SEARCH_DEPTH = 3  # nesting levels of tuples/lists/dicts searched for the primary output
_LIVE = weakref.WeakSet()


def primary_output(output, depth=0):
    """The first floating tensor of a module's output, or None.

    Searched in order: a tensor; the items of a tuple or list; the values of a
    dict (a transformers ``ModelOutput`` is one), up to three levels deep.
    """
    if isinstance(output, torch.Tensor):
        return output if output.is_floating_point() else None
    if depth >= _SEARCH_DEPTH:
        return None
    if isinstance(output, (tuple, list)):
        items = output
    elif isinstance(output, dict):
        items = output.values()
    else:
        return None
    for item in items:
        found = primary_output(item, depth + 1)
        if found is not None:
            return found
    return None


def _summarizable(t):
    return t.dtype in _DTYPE_NAMES and t.layout == _STRIDED and not t.is_meta


class Trends:
    """The per-step series of one capture session (``capture.Session.trends``).

    Args:
      session: the owning ``capture.Session``; uses its ``acquire``,
        ``release``, ``fail``, ``step``, ``_thread`` and ``writer.prefix``.
      part: the writer's part (``rank3``) or None.

    Attributes:
      every: N of ``trends=N``; 0 when off.
      writer: the ``series.SeriesWriter``, or None before the first start.
    """

    def __init__(self, session, part=None):
        self._session = session
        self._part = part
        self.every = 0
        self.writer = None
        # batch and pending rows: grad hooks may run on other threads
        self._lock = threading.Lock()
        self._batch = None
        self._pending = []  # (kind, module, dtype name, batch token)
        self._step = 0  # the step being summarized (the implicit count until the first mark)
        self._marked = False  # a step() mark was seen: optimizer steps no longer end steps
        self._collecting = False
        self._depth = 0
        self._root_paths = None  # module paths of the root call in progress
        self._paths = WeakIdMap()  # root module -> hooks.module_paths
        self._module_handles = []
        self._optimizer_handle = None
        _LIVE.add(self)

    def configure(self, every, backend):
        """Sets ``trends`` (as ``series.check_trends`` returns it) and the health backend."""
        self.every = every
        with self._lock:
            self._batch = kernels.HealthBatch(backend)
            self._pending = []

    # ---- lifecycle ---------------------------------------------------------------
    def start(self):
        """Installs the hooks (nothing when off)."""
        if not self.every:
            return
        if self.writer is None:
            self.writer = series.SeriesWriter(series.path_for(self._session.writer.prefix),
                                              self._part)
        if self._session.step is not None:  # a later enable: wait for the next mark
            self._marked = True
            self._set_step(None)
        else:
            self._set_step(self._step)
        self._optimizer_handle = optim_module.register_optimizer_step_post_hook(
            self._optimizer_post)

    def stop(self):
        """Writes the open step, removes every hook and closes the series file."""
        if self._optimizer_handle is None:
            return
        self._optimizer_handle.remove()
        self._optimizer_handle = None
        wrote = self._end_step()
        self._step = None if self._marked else self._step + int(wrote)
        self._set_collecting(False)
        self.writer.close()

    def mark(self, step):
        """A ``step()`` mark: ends the step being summarized and opens ``step``.

        A mark of the step already open (Lightning marks each batch of a
        gradient accumulation with the same step) keeps it open: its calls merge.
        """
        if self._optimizer_handle is None or (self._marked and step == self._step):
            return
        if not self._marked:  # rows before the first mark belong to no step: dropped
            self._marked = True
            self._step = None
        self._end_step()
        self._set_step(step)

    def _optimizer_post(self, optimizer, args, kwargs):
        if self._marked or _get_ident() != self._session._thread:
            return
        self._end_step()
        self._set_step(self._step + 1)

    def _set_step(self, step):
        self._step = step
        self._set_collecting(step is not None and self.every > 0 and step % self.every == 0)

    def _set_collecting(self, on):
        # Module hooks only while a summarized step is open: other steps pay nothing per module.
        self._collecting = on
        self._depth = 0
        self._root_paths = None
        if on and not self._module_handles:
            self._module_handles = [
                nn_module.register_module_forward_pre_hook(self._module_pre),
                nn_module.register_module_forward_hook(self._module_post, always_call=True),
            ]
        elif not on:
            for handle in self._module_handles:
                handle.remove()
            self._module_handles = []

    # ---- rows --------------------------------------------------------------------
    def _module_pre(self, module, args):
        # is_compiling first: Dynamo folds it to True, so a compiled region traces nothing here
        if _is_compiling() or _get_ident() != self._session._thread:
            return
        self._depth += 1
        if self._depth == 1:
            try:
                paths = self._paths.get(module)
                if paths is None:
                    paths = hooks.module_paths(module)
                    self._paths.set(module, paths)
                self._root_paths = paths
            except Exception as exc:
                self._root_paths = None
                self._session.fail("trends.output hook", exc)

    def _module_post(self, module, args, output):
        if _is_compiling() or _get_ident() != self._session._thread or self._depth == 0:
            return
        self._depth -= 1
        paths = self._root_paths
        # a forward recomputed in backward (activation checkpointing) was summarized already
        if paths is None or _current_autograd_node() is not None:
            return
        t = primary_output(output)
        if t is None or not _summarizable(t):
            return
        path = paths.get(module) or type(module).__name__
        session = self._session
        acquired = session.acquire()
        try:
            self._add("output", path, t)
            if t.requires_grad and _is_grad_enabled():
                t.register_hook(functools.partial(self._on_grad, path))
        except Exception as exc:
            session.fail("trends.output hook", exc)
        finally:
            if acquired:
                session.release()

    def _on_grad(self, path, grad):
        if not self._collecting or grad is None or not _summarizable(grad):
            return
        session = self._session
        acquired = session.acquire()
        try:
            self._add("grad", path, grad)
        except Exception as exc:
            session.fail("trends.grad hook", exc)
        finally:
            if acquired:
                session.release()

    def _add(self, kind, path, t):
        with self._lock:
            token = self._batch.add(t, health.LEVEL_MOMENTS)
            self._pending.append((kind, path, _DTYPE_NAMES[t.dtype], token))

    # ---- steps -------------------------------------------------------------------
    def _end_step(self):
        """Writes the summary of the step being summarized; True when it had rows."""
        session = self._session
        acquired = session.acquire()  # fetching CUDA rows is a torch op
        try:
            with self._lock:
                pending, self._pending = self._pending, []
                blocks = self._batch.fetch() if pending else None
            if not pending or self._step is None:
                return False
            blocks = [block.tolist() for block in blocks]  # rows as floats: merge_raw's fast path
            groups = {}  # (kind, module) -> (dtype of the first call, rows); first-seen order
            for kind, module, dtype, (b, i) in pending:
                group = groups.get((kind, module))
                if group is None:
                    groups[(kind, module)] = (dtype, [blocks[b][i]])
                else:
                    group[1].append(blocks[b][i])
            self.writer.write_step(self._step, [
                (kind, module, dtype, series.merge_raw(rows, dtype))
                for (kind, module), (dtype, rows) in groups.items()])
            return True
        except Exception as exc:
            session.fail("trends.step summary", exc)
            return False
        finally:
            if acquired:
                session.release()


def _after_fork_in_child():
    # A forked child (a DataLoader worker) shares the parent's series file: it writes nothing.
    for trends in list(_LIVE):
        trends._lock = threading.Lock()  # another thread may have held it at the fork
        trends._pending = []
        handle, trends._optimizer_handle = trends._optimizer_handle, None
        if handle is not None:  # the child's copy of the global hooks: mark() and stop() stay off
            handle.remove()
        trends._set_collecting(False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
