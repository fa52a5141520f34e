"""Health vector layouts decoded into Health dicts, and badness in bulk."""

import numpy as np
import pytest

from tb_numerics_plugin.analysis import health


def test_full_health_decodes_every_count():
    h = health.decode("FULL_HEALTH", [92, -1, 1, 2, 1000, 271, 0, 0, 729, 0, 0])
    assert h == {"mode": "FULL_HEALTH", "device_id": -1, "dtype": "float32", "rank": 2,
                 "size": 1000, "neg_inf": 271, "pos_inf": 0, "nan": 0, "neg": 729, "zero": 0,
                 "pos": 0, "any_inf_or_nan": True}


def test_curt_health_knows_only_the_flag():
    assert health.decode(2, [5, 1]) == {"mode": "CURT_HEALTH", "any_inf_or_nan": True}
    assert health.decode("CURT_HEALTH", [5, 0])["any_inf_or_nan"] is False


def test_concise_health_has_counts_but_no_signs():
    h = health.decode("CONCISE_HEALTH", [3, 10, 1, 2, 3])
    assert (h["size"], h["neg_inf"], h["pos_inf"], h["nan"]) == (10, 1, 2, 3)
    assert "zero" not in h


def test_dtype_argument_fills_in_what_the_layout_lacks():
    assert health.decode("CONCISE_HEALTH", [3, 10, 0, 0, 0], dtype="float16")["dtype"] == "float16"


def test_shape_lists_the_leading_rank_dims():
    h = health.decode("SHAPE", [1, 19, 3, 24, 2, 3, 4, 0, 0, 0])
    assert (h["dtype"], h["rank"], h["size"], h["shape"]) == ("float16", 3, 24, [2, 3, 4])
    assert "any_inf_or_nan" not in h


def test_full_numerics_adds_json_safe_statistics():
    vals = [0, -1, 1, 1, 4, 0, 0, 1, 1, 1, 1, -2.0, 3.0, 1.0, 3.0, np.nan, np.inf]
    h = health.decode("FULL_NUMERICS", vals)
    assert (h["min"], h["max"], h["mean"], h["std"]) == (-2.0, 3.0, "NaN", "Infinity")
    assert h["nan"] == 1 and h["any_inf_or_nan"] is True


def test_no_tensor_and_empty_values_decode_to_none():
    assert health.decode("NO_TENSOR", []) is None
    assert health.decode("FULL_HEALTH", None) is None


def test_short_vector_is_a_value_error_naming_the_mode():
    with pytest.raises(ValueError, match="FULL_HEALTH needs 11"):
        health.decode("FULL_HEALTH", [1, 2, 3])


def test_unknown_mode_is_a_value_error():
    with pytest.raises(ValueError):
        health.decode("HALF_HEALTH", [1, 2])


def test_bad_mask_reads_each_mode_its_own_way():
    modes = np.array([2, 3, 4, 5, 1])
    values = np.full((5, 11), np.nan)
    values[0, :2] = [0, 1]
    values[1, :5] = [0, 10, 0, 0, 0]
    values[2] = [0, -1, 1, 1, 10, 0, 1, 0, 0, 0, 9]
    values[3, :10] = [0, 1, 1, 10, 10, 0, 0, 0, 0, 0]  # SHAPE: never bad
    assert health.bad_mask(modes, values).tolist() == [True, False, True, False, False]


def test_counts_of_array_derives_full_health_from_a_tensor():
    x = np.array([[0.0, -1.0, np.inf], [np.nan, -np.inf, 2.0]], np.float32)
    counts = health.counts_of_array(x, dtype_enum=1)
    h = health.decode("FULL_TENSOR", counts)
    assert (h["size"], h["neg_inf"], h["pos_inf"], h["nan"]) == (6, 1, 1, 1)
    assert (h["neg"], h["zero"], h["pos"], h["rank"], h["dtype"]) == (1, 1, 1, 2, "float32")


def test_three_slot_mode_is_bad_when_a_slot_holds_inf_or_nan():
    values = np.array([[0.0, 0.0, 0.0], [-np.inf, 0.0, 0.0], [0.0, 0.0, np.nan]])
    assert health.bad_mask(np.array([8, 8, 8]), values).tolist() == [False, True, True]
    h = health.decode("REDUCE_INF_NAN_THREE_SLOTS", [0.0, np.inf, 0.0])
    assert (h["neg_inf"], h["pos_inf"], h["nan"], h["any_inf_or_nan"]) == (0, 1, 0, True)
