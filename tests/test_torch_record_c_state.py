"""The C extension's state objects (``_record``) against their Python twins.

``ScopeState`` (the module hooks' fast path), ``Counts`` (a segment's op-name
counters), ``SegmentState`` (a segment's fields), ``Token`` and ``Ids``,
``ForwardOps`` (forward ops by autograd sequence number), the state bases'
object fields (seen by the cyclic collector), and ``producer_ids`` (the
tensors a call read and returned): each reads and answers as the Python code
used where ``_record`` is missing.
"""

import collections
import dataclasses
import gc
import sys
import threading
import time
import types

import pytest
import torch
from torch import nn

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.torch import recorder, segments, tags
from record_pairs import mlp

pytestmark = pytest.mark.skipif(recorder._c_record is None, reason="_record.c was not built")


def test_scope_state_takes_a_submodule_call_and_declines_the_rest():
    # the module hooks' common case in C: a submodule's call inside a root call, on the
    # capturing thread, its path known, the token free; anything else is the Python hooks'
    from tb_numerics_plugin.torch import _record, gate
    from tb_numerics_plugin.torch.tags import WeakIdMap

    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    known = WeakIdMap()
    known.set(net[0], "0")
    scopes = _record.ScopeState()
    token = gate.Token()
    scopes.thread, scopes.gate, scopes.stack = threading.get_ident(), token, ["Sequential"]
    scopes.depth = 0
    assert not scopes.enter_sub(net[0])  # outside a root call: the root's own hook
    scopes.depth, scopes.paths = 1, known.table
    assert not scopes.enter_sub(net[1])  # a module the root's paths lack
    token.take()
    assert not scopes.enter_sub(net[0])  # the token held (by the flush thread, say)
    token.give()
    scopes.thread = threading.get_ident() + 1
    assert not scopes.enter_sub(net[0])  # another thread's module
    scopes.thread = threading.get_ident()
    assert scopes.enter_sub(net[0]) and scopes.depth == 2 and scopes.stack == ["Sequential", "0"]
    assert scopes.leave_sub() and scopes.depth == 1 and scopes.stack == ["Sequential"]
    assert not scopes.leave_sub() and scopes.depth == 1  # the root call's end: Python's


def test_a_scope_state_build_without_the_fast_paths_gets_the_declining_twin(monkeypatch):
    from tb_numerics_plugin.torch import state

    class OldScopeState:  # a build from before enter_sub and leave_sub
        pass

    old = types.SimpleNamespace(ScopeState=OldScopeState)
    monkeypatch.setitem(sys.modules, "tb_numerics_plugin.torch._record", old)
    monkeypatch.setattr(tbn, "_record", old)  # what `from ... import _record` finds first
    base = state.c_base("ScopeState")
    assert issubclass(base, OldScopeState)
    assert base().enter_sub(object()) is False and base().leave_sub() is False


def test_a_segments_op_name_counters_read_and_write_as_the_dict_they_replace():
    # _record.Counts counts op names in place for the C recorder; Segment.op_name (the
    # Python recorder's, on the same segment) reads and writes it as a dict of ints
    counts, plain = recorder._c_record.Counts(), {}
    assert counts == plain and len(counts) == 0 and counts.get("a/mul_") is None
    prefixes = ["Net/layer%d/mul_" % (i % 37) for i in range(500)] + ["x" * 300]
    for prefix in prefixes:  # past many growths of the table, with repeats
        for table in (counts, plain):
            table[prefix] = table.get(prefix, 0) + 1
    assert counts == plain and not counts != plain and len(counts) == len(plain) == 38
    assert counts["Net/layer3/mul_"] == plain["Net/layer3/mul_"] == 14
    assert sorted(counts.items()) == sorted(plain.items())
    plain["Net/layer3/mul_"] = 0
    assert counts != plain
    with pytest.raises(KeyError):
        counts["Net/mul_"]
    with pytest.raises(ValueError, match="must be 0 or more, not -1"):
        counts["Net/mul_"] = -1
    with pytest.raises(TypeError, match="a prefix is a str, not int"):
        counts[7] = 1
    assert counts.get(7, 0) == 0 and "Net/mul_" not in dict(counts.items())


def test_a_segment_made_in_c_has_the_fields_the_python_stand_in_makes(tmp_path, monkeypatch):
    # Segment's fields are made by its C base (_record.SegmentState); _SegmentFields, the
    # stand-in where the extension is missing, makes the same from the same session
    monkeypatch.setenv(recorder.RECORD_ENV, "c")
    net, x = mlp()
    with tbn.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH",
                                    circular_buffer_size=-1) as handle:
        handle.step(3)
        net(x).sum().backward()
        session = handle._session
        name = type(net).__name__ + ".forward"
        before = time.time()
        made = [segments.Segment(session, 41, name, (5, 6)),
                segments._SegmentFields(session, 41, name, (5, 6)),
                segments.Segment(session, 42, None),
                segments._SegmentFields(session, 42, None)]
    assert isinstance(made[0], recorder._c_record.SegmentState)
    last = session.registry.last_ops(name)
    assert len(last) > 3 and made[0].prior_ops is last and made[1].prior_ops is last
    fields = ("session", "serial", "name", "is_graph", "stack_ids", "step", "ops", "traces",
              "eager", "input_ids", "output_ids", "arg_ids", "_counters", "_placeholders",
              "_placeholder_names", "prior_ops")
    for c, py in (made[0:2], made[2:4]):
        assert {f: getattr(c, f) for f in fields} == {f: getattr(py, f) for f in fields}
        assert before <= c.wall_time <= py.wall_time <= time.time()
    assert (made[0].step, made[0].is_graph, made[2].is_graph, made[2].prior_ops) == (3, True,
                                                                                    False, ())


@pytest.mark.parametrize("twins", [("Token", "PyToken"), ("Ids", "PyIds")])
def test_the_shared_state_objects_behave_as_their_python_twins(twins):
    """The recording token and the tensor ids, whose fields the C entries read and move
    without a Python call, answer Python as their twins (used where _record is
    missing) do."""
    from tb_numerics_plugin.torch import gate, tags

    c_type = getattr(recorder._c_record, twins[0])
    py_type = getattr(gate, twins[1], None) or getattr(tags, twins[1])
    assert gate.Token is recorder._c_record.Token and tags.Ids is recorder._c_record.Ids
    if twins[0] == "Token":
        script = ["take", "take", "give", "give", "take", "take", "clear", "give", "clear",
                  "take"]
    else:
        script = ["peek", "take", "take", "peek", "take", "peek"]
    seen = []
    for made in (c_type(), py_type()):
        seen.append([getattr(made, step)() for step in script])
    assert seen[0] == seen[1]
    expected = ([True, False, None, None, True, False, None, None, None, False]
                if twins[0] == "Token" else [0, 0, 1, 2, 2, 3])
    assert seen[0] == expected
    with pytest.raises(TypeError, match=r"\.%s\(\) takes no arguments" % twins[0]):
        c_type(1)


def test_forward_ops_keep_the_newest_sequence_numbers_and_the_first_op_of_each():
    """A session's forward ops by autograd node (``_record.ForwardOps``): the first op
    remembered for a node stays; every node among the newest ``limit`` sequence numbers
    (rounded up to a power of two) is kept while the table grows to that size; past
    it a node gives its slot to the newer one that needs it. Numbers beyond a long long
    (AccumulateGrad's nodes carry 2**64 - 1) have none. Its Python twin (where _record
    is missing) keeps what the dict holds, the newest half once past the limit."""
    ops = recorder._c_record.ForwardOps(3000)  # a table of up to 4096 slots
    for seq in range(5000):
        ops.remember(seq, "op_%d" % seq, (seq,), seq * 10)
    ops.remember(4999, "later", (), 0)  # the node's first op stays
    assert ops.get(4999) == ("op_4999", (4999,), 49990)
    kept = [seq for seq in range(5000) if ops.get(seq) is not None]
    assert kept == list(range(5000 - 4096, 5000))  # the newest 4096 numbers
    assert ops.get(2 ** 64 - 1) is None and ops.get(-1) is None
    ops.remember(2 ** 64 - 1, "accumulate", (), 0)  # no slot for it, nothing replaced
    assert ops.get(4999) is not None
    # sparse numbers: an older node keeps its slot until a newer one takes it
    sparse = recorder._c_record.ForwardOps(1024)
    for seq in range(0, 4096, 3):
        sparse.remember(seq, "op", (), seq)
    assert sparse.get(4095) is not None and sparse.get(3072) is not None
    assert sparse.get(0) is None  # its slot went to 3072
    assert sparse.get(1023) is None  # its slot went to 4095
    assert sparse.get(1026) is not None  # older than the newest 1024, its slot not needed
    ops.clear()
    assert ops.get(4999) is None
    twin = recorder.PyForwardOps(4)
    for seq in range(6):
        twin.remember(seq, "op_%d" % seq, (), seq)
    twin.remember(5, "later", (), 0)
    assert [twin.get(seq) for seq in range(6)] == [None] * 3 + [
        ("op_3", (), 3), ("op_4", (), 4), ("op_5", (), 5)]
    with pytest.raises(ValueError, match="limit must be at least 1"):
        recorder._c_record.ForwardOps(0)


@pytest.mark.parametrize("base, field", [("SessionState", "_segment"), ("ScopeState", "stack"),
                                         ("EncoderState", "dtype_ok")])
def test_the_state_bases_fields_are_seen_by_the_cyclic_collector(base, field):
    """A session dropped with its segment open is a cycle through the session's C field
    (Segment.session): the collector must see the object fields of the C bases to free it."""
    import weakref

    class Owner(getattr(recorder._c_record, base)):
        pass

    owner = Owner()
    setattr(owner, field, types.SimpleNamespace(owner=owner))
    gone = weakref.ref(owner)
    del owner
    gc.collect()
    assert gone() is None


@dataclasses.dataclass
class _CallOutput:  # a dataclass return value (transformers' ModelOutput is one, and a dict)
    logits: object
    loss: object = None


class _OrderedOutput(collections.OrderedDict):
    pass


def test_the_tensors_a_call_read_and_returned_are_found_alike_in_c_and_python():
    """``Segment.set_arguments`` and ``set_outputs`` take their tensor ids from
    ``_record.producer_ids`` with the C recorder, from ``segments.producer_ids``
    without: the same ids, in the same order, through the same containers."""
    a, b, c, untagged = (torch.ones(3, 2) for _ in range(4))
    tags.mark(a, 5, "Net/mm_0", 0, 11)
    tags.mark(b, 5, "Net/relu_0", 0, 12)
    tags.mark(c, 7, "Other/add_0", 0, 13)
    view = b[1]  # untagged itself: its base names the producer
    deep = ((((a,),),),)  # a tensor five containers down is past the walk
    value = ([a, {"k": b, "s": "text", "n": None}], _CallOutput(logits=c, loss=view),
             _OrderedOutput(x=b, y=3), untagged, deep, "text", 2.5)
    c_ids = recorder._c_record.producer_ids
    for serial, expected in ((None, [11, 12, 13, 12, 12]), (5, [11, 12, 12, 12]),
                             (2 ** 70, [])):
        assert c_ids(value, serial) == segments.producer_ids(value, serial) == expected
    assert c_ids(value) == segments.producer_ids(value) == [11, 12, 13, 12, 12]
    assert c_ids(a) == [11] and c_ids(untagged) == [] and c_ids(deep[0][0][0]) == [11]
    with pytest.raises(TypeError, match="producer_ids"):
        c_ids()
