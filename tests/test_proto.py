"""Our proto is wire-compatible with TensorFlow's tfdbg2 DebugEvent, and the committed code is fresh."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

from tb_numerics_plugin.proto import debug_event_pb2, tensor_pb2

REPO = pathlib.Path(__file__).resolve().parents[1]

# Prints, as JSON, each TF message's fields and each enum's values. Runs in a
# subprocess so this test process never imports TensorFlow.
_DUMP_TF = r"""
import json
from tensorflow.core.protobuf import debug_event_pb2
from tensorflow.core.framework import tensor_pb2, types_pb2, graph_debug_info_pb2

def fields(m):
    return [dict(name=f.name, number=f.number, type=f.type, repeated=f.is_repeated,
                 ref=(f.message_type or f.enum_type).name if (f.message_type or f.enum_type) else None,
                 oneof=f.containing_oneof.name if f.containing_oneof else None)
            for f in m.fields]

out = {"messages": {}, "enums": {}}
for m in list(debug_event_pb2.DESCRIPTOR.message_types_by_name.values()) + [
        tensor_pb2.TensorProto.DESCRIPTOR, tensor_pb2.VariantTensorDataProto.DESCRIPTOR,
        graph_debug_info_pb2.GraphDebugInfo.FileLineCol.DESCRIPTOR]:
    out["messages"][m.name] = fields(m)
    for n in m.nested_types:
        out["messages"][n.name] = fields(n)
from tensorflow.core.framework import tensor_shape_pb2, resource_handle_pb2
for m in (tensor_shape_pb2.TensorShapeProto.DESCRIPTOR, resource_handle_pb2.ResourceHandleProto.DESCRIPTOR):
    out["messages"][m.name] = fields(m)
    for n in m.nested_types:
        out["messages"][n.name] = fields(n)
for e in (debug_event_pb2.TensorDebugMode.DESCRIPTOR, types_pb2.DataType.DESCRIPTOR):
    out["enums"][e.name] = {v.name: v.number for v in e.values}
print(json.dumps(out))
"""


def _our_fields(m):
    return [
        dict(
            name=f.name,
            number=f.number,
            type=f.type,
            # is_repeated is protobuf >= 5's; label is older runtimes' (test-compat runs 3.20)
            repeated=f.is_repeated if hasattr(f, "is_repeated") else f.label == f.LABEL_REPEATED,
            ref=(f.message_type or f.enum_type).name if (f.message_type or f.enum_type) else None,
            oneof=f.containing_oneof.name if f.containing_oneof else None,
        )
        for f in m.fields
    ]


def _our_messages():
    found = {}
    for module in (debug_event_pb2, tensor_pb2):
        for m in module.DESCRIPTOR.message_types_by_name.values():
            found[m.name] = m
            for n in m.nested_types:
                found[n.name] = n
    return found


@pytest.fixture(scope="module")
def tf_descriptors():
    if importlib.util.find_spec("tensorflow") is None:  # find, never import, TF here
        pytest.skip("comparing with TF's descriptors needs tensorflow")
    proc = subprocess.run(
        [sys.executable, "-c", _DUMP_TF],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_tf_message_has_our_twin_with_equal_fields(tf_descriptors):
    ours = _our_messages()
    assert len(tf_descriptors["messages"]) >= 14
    for name, tf_fields in tf_descriptors["messages"].items():
        assert name in ours, "message %s missing from our proto" % name
        key = lambda f: f["number"]
        # tb-numerics extensions (docs/format.md) take field numbers from 100 up
        fields = [f for f in _our_fields(ours[name]) if f["number"] < 100]
        assert sorted(fields, key=key) == sorted(tf_fields, key=key), name


def test_extension_fields_are_numbered_from_100_and_documented():
    ours = _our_messages()
    doc = (REPO / "docs" / "format.md").read_text()
    extensions = [(m, f["name"]) for m in ours for f in _our_fields(ours[m]) if f["number"] >= 100]
    assert ("GraphOpCreation", "output_dtypes") in extensions
    assert ("Execution", "output_dtypes") in extensions
    for _, field in extensions:
        assert "`%s`" % field in doc, field


def test_enums_match_tf_values(tf_descriptors):
    ours = {
        "TensorDebugMode": debug_event_pb2.TensorDebugMode.DESCRIPTOR,
        "DataType": tensor_pb2.DataType.DESCRIPTOR,
    }
    for name, values in tf_descriptors["enums"].items():
        our_values = {v.name: v.number for v in ours[name].values}
        # TF's DataType also lists the legacy *_REF variants, never written to dumps.
        expected = {k: v for k, v in values.items() if not k.endswith("_REF")}
        assert our_values == expected, name


def test_our_package_is_not_tensorflow():
    assert debug_event_pb2.DESCRIPTOR.package == "tb_numerics"
    assert tensor_pb2.DESCRIPTOR.package == "tb_numerics"


def _serialized_descriptor(path):
    """The FileDescriptorProto bytes a generated ``*_pb2.py`` embeds (AddSerializedFile)."""
    import ast

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile":
            return node.args[0].value
    raise AssertionError("%s embeds no serialized descriptor" % path)


def test_committed_code_describes_the_committed_proto(tmp_path):
    # Today's protoc (grpc_tools in the dev venv) compiles proto/; the committed code, made by
    # the older generator `make proto` pins, must embed the same FileDescriptorProto.
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("needs the dev extra's grpcio-tools")

    sources = sorted(str(p.relative_to(REPO / "proto")) for p in (REPO / "proto").rglob("*.proto"))
    assert sources, "no .proto files under proto/"
    # In a subprocess: protoc inside a process that has loaded torch, TF's protos and more
    # has crashed (SIGSEGV in grpc_tools' compiler).
    proc = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I%s" % (REPO / "proto"),
         "--python_out=%s" % tmp_path] + sources, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for source in sources:
        generated = source[: -len(".proto")] + "_pb2.py"
        fresh = _serialized_descriptor(tmp_path / generated)
        committed = _serialized_descriptor(REPO / generated)
        assert fresh == committed, "%s is stale: run `make proto`" % generated


def test_committed_code_loads_on_old_protobuf_runtimes():
    # Gencode of protobuf >= 5.26 refuses runtimes older than itself; ours must load on every
    # runtime TensorBoard supports (3.20 ... 7.x), so it is made by protoc 3.21 (`make proto`).
    for path in sorted((REPO / "tb_numerics_plugin" / "proto").glob("*_pb2.py")):
        text = path.read_text()
        assert "ValidateProtobufRuntimeVersion" not in text, path
        assert "from google.protobuf.internal import builder as _builder" in text, path
