"""Health values: TensorFlow's layouts per mode, and C kernel == pure torch."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from tb_numerics_plugin import torch as tbn
from tb_numerics_plugin.reader import Logdir
from tb_numerics_plugin.torch import health, kernels

INF, NAN = math.inf, math.nan
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
DTYPE_ENUM = {torch.float16: 19, torch.bfloat16: 14, torch.float32: 1, torch.float64: 2}


def special_tensor(dtype, n=1000, seed=0):
    """Random values with NaN, +-Inf, zeros, negatives and tiny values mixed in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 10
    picks = torch.randint(0, 8, (n,), generator=g)
    x[picks == 0] = 0.0
    x[picks == 1] = INF
    x[picks == 2] = -INF
    x[picks == 3] = NAN
    x[picks == 4] = -0.0
    x[picks == 5] *= 1e-3
    return x.to(dtype)


def _huge(dtype):
    """Finite values near the dtype's largest, with zeros: the kernel's per-lane sums,
    which tell an all-finite block in one pass, overflow to inf (the block is recounted)."""
    top = torch.finfo(dtype).max
    x = torch.tensor([top, top, -top * 0.5, 0.0, top * 0.9], dtype=torch.float64)
    return x.repeat(820).to(dtype)


def _with(dtype, n, at, value):
    """n finite values (negatives, zeros, positives) and one ``value`` at index ``at``."""
    x = torch.arange(n, dtype=torch.float64) % 5 - 2.0
    x[at] = value
    return x.to(dtype)


@pytest.mark.skipif(not kernels.c_kernel_available(), reason="C extension not built")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "case", ["special", "all_nan", "empty", "transposed", "sliced", "finite", "one", "huge",
             "inf_past_the_rounds", "nan_in_the_tail"])
@pytest.mark.parametrize("level", [health.LEVEL_COUNTS, health.LEVEL_EXTREMA, health.LEVEL_MOMENTS])
def test_c_kernel_equals_pure_torch(dtype, case, level):
    x = {
        "special": lambda: special_tensor(dtype),
        "all_nan": lambda: torch.full((37,), NAN, dtype=dtype),
        "empty": lambda: torch.empty(0, dtype=dtype),
        "transposed": lambda: special_tensor(dtype, 2000).reshape(40, 50).t(),
        "sliced": lambda: special_tensor(dtype, 2000).reshape(40, 50)[::2, 3:],
        "finite": lambda: torch.randn(4099, dtype=torch.float64).to(dtype) * 100,
        "one": lambda: torch.tensor([-3.5], dtype=dtype),
        "huge": lambda: _huge(dtype),
        # 75 elements: whole rounds of four vectors, then single vectors, then a tail of 3
        "inf_past_the_rounds": lambda: _with(dtype, 75, 66, INF),
        "nan_in_the_tail": lambda: _with(dtype, 75, 73, NAN),
    }[case]()
    c = kernels.c_raw_stats(x, level)
    ref = health.torch_raw_stats(x, level).numpy()
    # counts and extrema are exact; the sums differ only by summation order
    np.testing.assert_array_equal(c[:10], ref[:10])
    np.testing.assert_allclose(c[10:], ref[10:], rtol=1e-12, atol=1e-300)
    for mode in health.KERNEL_MODES:
        if health.level_for(mode) > level:
            continue
        meta = health.tensor_meta(x)
        a = health.debug_values(mode, 7, c, meta)
        b = health.debug_values(mode, 7, ref, meta)
        np.testing.assert_allclose(a, b, rtol=1e-12, equal_nan=True)


@pytest.mark.skipif(not kernels.c_kernel_available(), reason="C extension not built")
def test_health_batch_rows_match_their_tokens_across_buffer_refills():
    batch = kernels.HealthBatch(capacity=3)
    tensors = [torch.full((5,), float(k)) for k in range(8)]
    tokens = [batch.add(t, health.LEVEL_EXTREMA) for t in tensors]
    blocks = batch.fetch()
    assert [blocks[b][r][10] for b, r in tokens] == [5.0 * k for k in range(8)]


@pytest.mark.skipif(not kernels.c_kernel_available(), reason="C extension not built")
def test_cpu_rows_are_reused_and_registered_by_block_across_fetches():
    batch = kernels.HealthBatch(capacity=2)
    rows = batch.cpu_rows(health.LEVEL_EXTREMA)
    assert rows.level == health.LEVEL_EXTREMA and rows.block == -1  # in no batch yet
    batch.add_rows(torch.zeros((1, health.RAW_WIDTH), dtype=torch.float64))  # a compiled block
    first = [batch.add(torch.full((3,), float(k)), health.LEVEL_EXTREMA) for k in range(3)]
    assert first == [(1, 0), (1, 1), (2, 0)]  # full after two rows: copied out, registered again
    assert rows.block == 2 and rows.used == 1
    blocks = batch.fetch()
    assert [blocks[b][r][10] for b, r in first] == [0.0, 3.0, 6.0]
    assert rows.block == -1 and rows.used == 0  # fetched: in no batch until the next CPU row
    assert batch.add(torch.ones(4), health.LEVEL_EXTREMA) == (0, 0)
    assert batch.cpu_rows(health.LEVEL_EXTREMA) is rows


@pytest.mark.skipif(not kernels.c_kernel_available(), reason="C extension not built")
def test_host_rows_refuse_bad_input_by_name():
    rows = kernels._c_health.HostRows(1)
    x = torch.tensor([1.0, -INF])
    with pytest.raises(ValueError, match="unknown dtype code"):
        rows.add(x.data_ptr(), 2, 9, health.LEVEL_COUNTS)
    assert rows.used == 0  # the row reserved for it is given back
    with pytest.raises(ValueError, match="unknown level"):
        rows.level = 3
    with pytest.raises(ValueError, match="capacity must be positive"):
        kernels._c_health.HostRows(0)
    assert rows.add(x.data_ptr(), 2, 0, health.LEVEL_COUNTS) == 0
    with pytest.raises(IndexError, match="all 1 rows are used"):
        rows.add(x.data_ptr(), 2, 0, health.LEVEL_COUNTS)
    with pytest.raises(ValueError, match="used must be in 0..1"):
        rows.used = 2
    view = np.frombuffer(rows, dtype=np.float64)
    assert list(view[:6]) == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]  # one -inf, one positive


class Identity(nn.Module):
    def forward(self, x):
        return torch.mul(x, 1.0)


KNOWN = [[-INF, INF, NAN, -2.0, 0.0, 4.0], [0.5, 0.0, -INF, 1.0, 3.0, -0.25]]


def dump_values(tmp_path, mode, dtype=torch.float32, shape=None):
    x = torch.tensor(KNOWN, dtype=dtype)
    if shape is not None:
        x = torch.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    with tbn.enable_dump_debug_info(str(tmp_path), mode, -1):
        Identity()(x)
    run = Logdir(str(tmp_path)).run(".")
    run.update()
    (trace,) = [run.graph_execution_trace(i) for i in range(run.num_graph_execution_traces())]
    return trace["debug_tensor_value"]


def test_curt_health_layout(tmp_path):
    tid, bad = dump_values(tmp_path, "CURT_HEALTH")
    assert tid >= 0 and bad == 1.0


def test_concise_health_layout(tmp_path):
    assert dump_values(tmp_path, "CONCISE_HEALTH")[1:] == [12.0, 2.0, 1.0, 1.0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_full_health_layout(tmp_path, dtype):
    values = dump_values(tmp_path, "FULL_HEALTH", dtype)
    # device_id, dtype, rank, size, -inf, +inf, nan, neg, zero, pos
    assert values[1:] == [-1.0, DTYPE_ENUM[dtype], 2.0, 12.0, 2.0, 1.0, 1.0, 2.0, 2.0, 4.0]


def test_full_numerics_layout(tmp_path):
    values = dump_values(tmp_path, "FULL_NUMERICS", torch.float64)
    assert len(values) == 17
    finite = [-2.0, 0.0, 4.0, 0.5, 0.0, 1.0, 3.0, -0.25]
    mean = sum(finite) / len(finite)
    std = math.sqrt(sum((v - mean) ** 2 for v in finite) / len(finite))
    assert values[1:11] == [-1.0, 2.0, 2.0, 12.0, 2.0, 1.0, 1.0, 2.0, 2.0, 4.0]
    assert values[11:15] == [-2.0, 4.0, 0.25, 4.0]
    assert values[15] == pytest.approx(mean, rel=1e-15)
    assert values[16] == pytest.approx(std, rel=1e-15)


def test_full_numerics_of_no_finite_element_is_nan_with_zero_abs_min():
    raw = health.torch_raw_stats(torch.tensor([NAN, INF]), health.LEVEL_MOMENTS).numpy()
    tail = health.debug_values("FULL_NUMERICS", 0, raw, health.tensor_meta(torch.ones(2)))[11:]
    assert tail[2] == 0.0
    assert all(math.isnan(tail[k]) for k in (0, 1, 3, 4, 5))


def test_shape_layout_pads_and_drops_leading_dims(tmp_path):
    assert dump_values(tmp_path / "a", "SHAPE", shape=(2, 3))[1:] == [1, 2, 6, 2, 3, 0, 0, 0, 0]
    seven = dump_values(tmp_path / "b", "SHAPE", shape=(2, 1, 1, 3, 1, 1, 5))
    assert seven[1:] == [1, 7, 30, 1, 1, 3, 1, 1, 5]


def test_full_tensor_holds_the_values(tmp_path):
    values = dump_values(tmp_path, "FULL_TENSOR")
    assert values == [["-Infinity", "Infinity", "NaN", -2.0, 0.0, 4.0],
                      [0.5, 0.0, "-Infinity", 1.0, 3.0, -0.25]]


def test_no_tensor_writes_traces_without_values(tmp_path):
    assert dump_values(tmp_path, "NO_TENSOR") is None


def test_values_travel_as_little_endian_float64_tensor_proto():
    proto = health.values_proto([1.0, -INF, 3.5])
    assert proto.dtype == 2 and [d.size for d in proto.tensor_shape.dim] == [3]
    assert np.frombuffer(proto.tensor_content, "<f8").tolist() == [1.0, -INF, 3.5]


@pytest.mark.skipif(not kernels.c_kernel_available(), reason="C extension not built")
@pytest.mark.parametrize("mode", ["FULL_HEALTH", "FULL_NUMERICS"])
def test_capture_values_are_the_same_with_c_and_pure_torch_backends(tmp_path, mode):
    def dump(backend):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2)).to(torch.bfloat16)
        x = torch.tensor(KNOWN, dtype=torch.bfloat16)
        with tbn.enable_dump_debug_info(str(tmp_path / backend), mode, -1, health_backend=backend):
            model(x).float().sum().backward()
        run = Logdir(str(tmp_path / backend)).run(".")
        run.update()
        return [run.graph_execution_trace(i)["debug_tensor_value"]
                for i in range(run.num_graph_execution_traces())]

    c, ref = dump("c"), dump("torch")
    assert len(c) == len(ref) > 5
    np.testing.assert_allclose(np.array(c, dtype=float), np.array(ref, dtype=float),
                               rtol=1e-12, equal_nan=True)


@pytest.mark.parametrize("slot,mode,device", [(0, 4, "/job:localhost/replica:0/task:0/device:CPU:0"),
                                              (3, 1, ""), (1, 0, "d")])
def test_hand_encoded_trace_events_parse_like_protobuf_built_ones(slot, mode, device):
    from tb_numerics_plugin.proto import debug_event_pb2
    from tb_numerics_plugin.torch import wire

    values = [3.0, -1.0, 1.0, 2.0, 12.0, 2.0, 1.0, 1.0, 2.0, 2.0, 4.0]
    expected = debug_event_pb2.DebugEvent(wall_time=1234.5)
    trace = expected.graph_execution_trace
    trace.tfdbg_context_id, trace.op_name, trace.output_slot = "g7", "enc.block.0/mul_3", slot
    trace.tensor_debug_mode, trace.device_name = mode, device
    trace.tensor_proto.CopyFrom(health.values_proto(values))
    prefix = wire.trace_prefix("g7", "enc.block.0/mul_3", slot, mode, device)
    encoded = wire.trace_event(1234.5, prefix, wire.values_tensor_proto(values))
    assert debug_event_pb2.DebugEvent.FromString(encoded) == expected
    assert encoded == expected.SerializeToString()  # byte for byte: same field order too
    bare = debug_event_pb2.DebugEvent.FromString(wire.trace_event(1.0, prefix))
    assert not bare.graph_execution_trace.HasField("tensor_proto")
    assert wire.varint(300) == b"\xac\x02"
