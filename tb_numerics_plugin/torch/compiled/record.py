"""A compiled call recorded by the capture session, as if its ops had run eagerly.

:class:`CompiledCalls` is the session's part that ``custom_ops.emit`` and
``emit_backward`` reach once per compiled call. It works on the session's
own state, as ``Session.on_op`` does: the open execution (``_segment``,
``switch``) and the tensor ids (``tensor_ids``, shared with the C
recorder, which reads it by that name).
"""

import os
import sys
import threading
import time

from tb_numerics_plugin.torch import hooks, tags
from tb_numerics_plugin.torch.compiled import frames
from tb_numerics_plugin.torch.segments import BACKWARD
from tb_numerics_plugin.torch.tags import TENSOR_ID, mark, producer_tag


class CompiledCalls:
    """Records compiled calls into a session's executions.

    Args:
      session: the ``capture.Session``.

    Attributes:
      site: ``(root scope, call site ids)`` of the last forward call: a compiled
        backward's ops are named after it and point at it.
    """

    def __init__(self, session):
        self._session = session
        self.site = ("compiled", ())
        self._storage_tags = None  # tags.StorageTags of returned values (dispatch mode)

    def traced(self, op_type):
        """Whether ``op_regex`` passes a compiled graph's op (asked when it compiles)."""
        rx = self._session.op_regex
        return rx is None or bool(rx.match(op_type))

    def stop(self):
        """Forgets the tags of returned values (the session stops)."""
        if self._storage_tags is not None:
            if tags.stand_in_tag is self._storage_tags:
                tags.stand_in_tag = None
            self._storage_tags = None

    def on_compiled(self, graph, rows, values=(), inputs=()):
        """Records the ops of one compiled call (``custom_ops.emit``, after its kernels
        ran) under the recording token; an ``Exception`` is counted, never raised.

        Args:
          graph: the call's ``table.CompiledGraph`` (None: not one of this process's).
          rows: its raw health rows, ``[n, 12]`` on the graph's device.
          values: the tensors the call returns (a backward's gradients), in
            ``graph.returned`` order; they are tagged as their ops' outputs.
          inputs: the tensors a forward call's ops read, in ``graph.placeholders`` order;
            their tags give the execution's input tensor ids.
        """
        session = self._session
        if graph is None or threading.get_ident() != session._thread:
            return
        gate = session.gate
        if gate.take() or session.acquire():
            try:
                self._record(graph, rows, values, inputs)
            except Exception as exc:  # never break the user's step
                session.fail("compiled graph", exc)
            finally:
                gate.give()
            session.raise_pending_stop()  # (stop_on_nonfinite: a compiled call's own output)

    def _record(self, graph, rows, values, read):
        session = self._session
        seg, scope_of, outer, own, optimizer = self._place(graph)
        enc = session.encoder
        block = enc.batch.add_rows(rows) if enc.kernel_mode and rows.shape[0] else None
        names, ids = self._record_ops(seg, graph, scope_of, outer, block,
                                      session.device(rows.device)[0], self._producers(graph, read))
        for k, (j, slot) in enumerate(graph.returned):  # what the call returned
            tensor_id = ids[j][slot or 0]
            if tensor_id is not None:
                if not graph.backward:  # model outputs (a backward's gradients are not)
                    seg.output_ids.append(tensor_id)
                if k < len(values):  # tagged: later ops name it as its producer's output
                    self._mark_returned(values[k], seg.serial, names[j], slot or 0, tensor_id)
        if own:  # no root module call to end it: the compiled call was the whole execution
            session.switch(None, open_new=False)
            if session.watch_nonfinite:
                session.check_root_outputs(seg)
                if optimizer is not None:  # its pre-hook did not run: the step has run
                    session.check_optimizer(optimizer, grads=True)

    def _place(self, graph):
        """Where a compiled call's ops go: ``(segment, scope of an op's module path,
        call site ids, whether the call is its own execution, optimizer or None)``.
        Ops are named by prefix + base.path, or by the root's name."""
        session = self._session
        scopes, seg = session.scopes, session._segment
        prefix, base, own, optimizer = "", None, False, None
        if graph.backward:  # named after the forward's module paths, at the forward's call site
            root, outer = self.site
            if seg is None or seg.name != BACKWARD:
                seg = session.switch(BACKWARD)
            prefix = "backward/"
        else:
            outer = self._call_site(graph)
            if scopes.depth > 0 and seg is not None and seg.is_graph and seg.name != BACKWARD:
                base = scopes.stack[-1] if scopes.depth > 1 else None
                root = scopes.stack[0]
            elif scopes.in_optimizer and seg is not None and seg.is_graph:
                root = seg.name  # a compiled part of an eager optimizer step
            else:  # compiled in place (model.compile()), an optimizer step or a function:
                name, root, optimizer = self._execution(sys._getframe(3))
                seg = session.switch(name, outer)
                own = True
            self.site = (root, outer)

        def scope_of(path):
            return prefix + ((base + "." + path if path else base) if base else (path or root))

        return seg, scope_of, outer, own, optimizer

    def _record_ops(self, seg, graph, scope_of, outer, block, device_name, producers):
        """Appends the graph's ops and traces to ``seg``; returns each op's name and its
        outputs' tensor ids (None where not traced)."""
        session = self._session
        wall = time.time()
        stack_ids = graph.stack_ids.get((id(session), outer))
        if stack_ids is None:
            frame_ids = session.stacks.frame_ids
            stack_ids = graph.stack_ids[(id(session), outer)] = [
                outer + frame_ids(op.frames) for op in graph.ops]
        names, ids = [], []
        for i, op in enumerate(graph.ops):
            op_name = seg.op_name(scope_of(op.path), op.short)
            names.append(op_name)
            inputs = tuple(
                "%s:%d" % (names[j], slot or 0) if j is not None
                else seg.named_input(slot, graph.placeholders.get(slot, 0),
                                     producers.get(slot, -1))
                for j, slot in op.inputs)
            seg.ops.append((op.op_type, op_name, inputs, len(op.metas), stack_ids[i],
                            device_name, op.dtypes))
            op_ids = []
            for slot, row in enumerate(op.rows):
                if row is None:
                    op_ids.append(None)
                    continue
                tensor_id = session.tensor_ids.take()
                op_ids.append(tensor_id)
                payload = (block, row) if block is not None else None
                seg.traces.append((op_name, slot, tensor_id, payload, op.metas[slot],
                                   device_name, wall))
            ids.append(op_ids)
        return names, ids

    @staticmethod
    def _producers(graph, read):
        """Placeholder name -> tensor id of the producer of each input the call read."""
        producers = {}
        for name, t in zip(graph.placeholders, read):
            tag = producer_tag(t)
            if tag is not None:
                producers[name] = tag[TENSOR_ID]
        return producers

    @staticmethod
    def _execution(frame):
        """``(execution name, root scope of its ops, optimizer or None)`` of a compiled call
        that no open execution holds: ``<Class>.forward`` for a model compiled in place,
        ``<Optimizer>.step`` for a compiled optimizer step (its hooks do not run: Dynamo
        traced them), else ``compiled.call``."""
        module = frames.calling_module(frame)
        if module is not None:
            root = hooks.root_name(module)
            return root + ".forward", root, None
        optimizer = frames.calling_optimizer(frame)
        if optimizer is not None:
            name = type(optimizer).__name__ + ".step"
            return name, name, optimizer
        return "compiled.call", "compiled", None

    def _mark_returned(self, t, serial, op_name, slot, tensor_id):
        """Tags a value a compiled call returned, and remembers the tag for its memory."""
        tag = mark(t, serial, op_name, slot, tensor_id)
        remember = getattr(self._session._mode, "remember", None)
        if remember is not None:  # the native hook's lookup by memory
            remember(t)
            return
        by_memory = self._storage_tags
        if by_memory is None:  # the first one: untagged tensors are looked up from now on
            by_memory = self._storage_tags = tags.StorageTags()
            tags.stand_in_tag = by_memory
        by_memory.remember(t, tag)

    def _call_site(self, graph):
        """The frame ids of the user frames around a compiled call, outermost first;
        the compiled frame itself is left out when the graph's own lines begin with it."""
        stacks = self._session.stacks
        frame = stacks.user_frame(5)
        first = next((op.frames[0] for op in graph.ops if op.frames), None)
        if frame is not None and first is not None and frame.f_code.co_name == first[2] and (
                os.path.realpath(frame.f_code.co_filename) == os.path.realpath(first[0])):
            frame = stacks.first_user_frame(frame.f_back)
        return stacks.frame_site(frame)
