"""`embedcli.quantize` against sentence-transformers' `quantize_embeddings`, and calibration files."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sentence_transformers.util.quantization import quantize_embeddings

from embedcli.errors import UsageError
from embedcli.io.writers import embedding_array, open_writer
from embedcli.quantize import Quantizer, load_calibration, make_quantizer, output_width, quantize, ranges_of


@pytest.mark.parametrize("dim", [384, 64, 12])
@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_quantize_equals_sentence_transformers(precision: str, dim: int) -> None:
    rng = np.random.default_rng(dim)
    x = rng.standard_normal((257, dim)).astype(np.float32)
    x[0, :3] = 0.0  # exact zeros: bit 0 (x > 0), as sentence-transformers
    x[:, 5] = 0.25  # a constant dimension: step 0 becomes 1
    ranges = ranges_of(x) if precision.endswith("int8") else None
    got = quantize(x, precision, ranges)
    assert np.array_equal(got, quantize_embeddings(x, precision)), precision
    assert got.shape == (257, output_width(precision, dim))


def test_binary_bit_rule_and_layout() -> None:
    x = np.array([[1.0, -1.0, 0.0, 2.0, 0.0, 0.0, 0.0, 3.0, -0.5, 0.5]], dtype=np.float32)
    packed = quantize(x, "ubinary")
    assert packed.tolist() == [[0b10010001, 0b01000000]]  # MSB first; x == 0 is a 0 bit; zero-padded
    assert quantize(x, "binary").tolist() == [[0b10010001 - 128, 0b01000000 - 128]]


def test_int8_clips_values_outside_the_calibration_range() -> None:
    ranges = np.array([[0.0, -1.0], [1.0, 1.0]], dtype=np.float32)
    x = np.array([[-5.0, 0.0], [5.0, 2.0], [0.5, 1.0]], dtype=np.float32)
    got = quantize(x, "uint8", ranges)
    assert got[:2].tolist() == [[0, 127], [255, 255]]  # below min -> 0, above max -> 255
    # float32 arithmetic as sentence-transformers: (1 - -1) / (2 / 255) = 254.99998 -> bucket 254
    assert got[2].tolist() == [127, 254]
    for precision in ("int8", "uint8"):
        expected = quantize_embeddings(x, precision, ranges=ranges)
        assert np.array_equal(quantize(x, precision, ranges), expected)


def test_calibration_sources(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 16)).astype(np.float32)
    expected = ranges_of(x)
    np.save(tmp_path / "c.npy", x)
    pq.write_table(pa.table({"id": [str(i) for i in range(40)], "embedding": embedding_array(x)}), tmp_path / "c.parquet")
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"embedding": v.tolist()}) + "\n" for v in x))
    for name in ("c.npy", "c.parquet", "c.jsonl"):
        assert np.array_equal(load_calibration(str(tmp_path / name)), expected), name
    # a [2, dim] array of [min; max] rows is its own ranges
    np.save(tmp_path / "r.npy", expected)
    assert np.array_equal(load_calibration(str(tmp_path / "r.npy")), expected)
    # an int8 output carries its ranges in its metadata (Parquet) or sidecar (JSONL)
    quant = Quantizer("int8", expected, "c.npy")
    table = quant.table(pa.table({"id": ["a"], "embedding": embedding_array(x[:1])}))
    for name in ("q.parquet", "q.jsonl"):
        writer = open_writer(str(tmp_path / name), table.schema, quant.metadata())
        writer.write(table)
        writer.commit()
        assert np.array_equal(load_calibration(str(tmp_path / name)), expected), name
    with pytest.raises(UsageError, match="no such file"):
        load_calibration(str(tmp_path / "missing.npy"))
    np.save(tmp_path / "one.npy", x[:1])
    with pytest.raises(UsageError, match="at least 2 vectors"):
        load_calibration(str(tmp_path / "one.npy"))
    with pytest.raises(UsageError, match="16 dims, the output has 384"):
        make_quantizer("uint8", str(tmp_path / "c.npy"), dim=384)
