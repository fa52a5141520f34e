"""The passes' work on a graph: health rows after traced values, one hand-over at the end.

:func:`instrument` changes Dynamo's torch-level forward graph,
:func:`instrument_backward` a post-grad backward graph; each returns the
graph's ``table.CompiledGraph``.
"""

import functools
import operator

import torch
from torch.fx.node import map_arg

from tb_numerics_plugin.torch import health
from tb_numerics_plugin.torch.compiled.custom_ops import State
from tb_numerics_plugin.torch.compiled.table import (OpTable, module_path, node_op_type,
                                                     placeholder_name, source_path)

_GETITEM = operator.getitem


def _traced_row(x, level):
    """``health_row`` of a value of Dynamo's graph (detached: no gradient flows to it)."""
    return torch.ops.tb_numerics.health_row(x.detach(), level)


def instrument(graph, session):
    """Adds the health rows and the ``emit`` call to ``graph``; returns its ``CompiledGraph``.

    Args:
      graph: Dynamo's torch-level ``torch.fx.Graph`` (changed in place).
      session: the capture session (its mode, ``op_regex`` and dtype filter).
    """
    table = OpTable(session, "example_value")
    output = None
    for node in list(graph.nodes):
        if node.op == "placeholder":
            table.placeholder(node, placeholder_name(node))
        elif node.op == "output":
            output = node
        elif node.op in ("call_function", "call_method", "call_module") and not table.item(node):
            op_type = node_op_type(node)
            table.add(node, op_type, op_type, module_path(node))
    if output is None:
        return None
    returned = table.returned(output)
    level = table.level
    rows = table.add_rows(graph, lambda v: graph.call_function(_traced_row, (v, level)),
                          lambda node, slot: graph.call_function(_GETITEM, (node, slot)))
    key = next(State.keys)
    with graph.inserting_before(output):
        if rows:
            rows_node = graph.call_function(torch.stack, (rows,))
        else:
            rows_node = graph.call_function(torch.zeros, ((0, health.RAW_WIDTH),),
                                            {"dtype": torch.float64})
        values = [value for value, _ in returned]
        graph.call_function(torch.ops.tb_numerics.emit.default,
                            (rows_node, key, values, table.read_inputs()))
    return table.register(key, [ref for _, ref in returned])


# seq_nr -> module path of forward nodes, from the post-grad forward graphs: backward
# nodes carry their forward node's seq_nr and stack_trace, not its module stack.
_FORWARD_PATHS = {}


def _fake_call(graph, fake_mode, target, args, kwargs=None):
    """Adds ``target(*args)`` to a post-grad graph with the ``val`` inductor lowers it by."""
    node = graph.call_function(target, args, kwargs or {})
    vals = map_arg((args, kwargs or {}), lambda n: n.meta["val"])
    with fake_mode:
        node.meta["val"] = target(*vals[0], **vals[1])
    return node


def _unlowered():
    """The aten ops a backward graph gets from :func:`instrument_backward` that this
    inductor cannot lower (a post-grad graph is lowered op by op, undecomposed)."""
    from torch._inductor.lowering import lowerings

    a = torch.ops.aten
    used = (a.unsqueeze.default, a.cat.default, a.full.default)
    return [str(op) for op in used if op not in lowerings]


def instrument_backward(graph, session):
    """Adds health rows and ``emit_backward`` to a post-grad backward graph; returns its
    CompiledGraph (None for a forward graph, whose module paths it remembers)."""
    from torch._guards import detect_fake_mode

    from tb_numerics_plugin.torch.ops import analyze_op

    nodes = list(graph.nodes)
    if not any(n.op == "placeholder" and n.name.startswith("tangents") for n in nodes):
        for node in nodes:
            seq, stack = node.meta.get("seq_nr"), node.meta.get("nn_module_stack")
            if seq is not None and stack:
                _FORWARD_PATHS[seq] = source_path(list(stack.values())[-1][0])
        return None
    missing = _unlowered()
    if missing:  # inductor would fail on the graph: the user's backward must still compile
        raise RuntimeError("inductor has no lowering for %s" % ", ".join(missing))
    table = OpTable(session, "val")
    output = None
    for node in nodes:
        if node.op == "placeholder":
            table.placeholder(node, node.name)
        elif node.op == "output":
            output = node
        elif node.op == "call_function" and not table.item(node) and isinstance(
                node.target, torch._ops.OpOverload):
            info = analyze_op(node.target)
            if info.skip:
                table.alias(node)
            else:
                table.add(node, info.op_type, info.short,
                          _FORWARD_PATHS.get(node.meta.get("seq_nr"), ""))
    if output is None:
        return None
    returned = table.returned(output)  # (before the rows are added: gradients only)
    vals = [n.meta["val"] for n in nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    call = functools.partial(_fake_call, graph, detect_fake_mode(vals))
    aten, level = torch.ops.aten, table.level
    # (unsqueeze and cat, not stack: stack is a decomposition, gone after post-grad)
    rows = table.add_rows(
        graph, lambda v: call(aten.unsqueeze.default,
                              (call(torch.ops.tb_numerics.health_row.default, (v, level)), 0)),
        lambda node, slot: call(_GETITEM, (node, slot)))
    key = next(State.keys)
    with graph.inserting_before(output):
        if rows:
            rows_node = call(aten.cat.default, (rows,))
        else:
            device = vals[0].device if vals else torch.device("cpu")
            rows_node = call(aten.full.default, ([0, health.RAW_WIDTH], 0.0),
                             {"dtype": torch.float64, "device": device})
        graph.call_function(torch.ops.tb_numerics.emit_backward.default,
                            (rows_node, key, [node for node, _ in returned])).meta["val"] = None
    return table.register(key, [ref for _, ref in returned], backward=True)
