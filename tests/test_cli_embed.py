"""`embedcli embed` and `embedcli info` through typer's runner, on real files, against a tiny seeded model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from embedcli.cli import app

TEXTS = ["the cat sat on the mat", "a dog", "  padded with spaces  ", "one two three four five six seven eight"]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for i, text in enumerate(TEXTS):
            f.write(json.dumps({"id": f"doc{i}", "text": text, "topic": f"t{i % 2}"}) + "\n")
    return path


def _st_reference(model: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model), device="cpu").encode(texts)


def test_embed_jsonl_to_parquet_matches_sentence_transformers(tiny_model, corpus: Path, tmp_path: Path) -> None:
    model = tiny_model("bert-st")
    out = tmp_path / "vectors.parquet"
    result = CliRunner().invoke(
        app,
        ["embed", str(corpus), "-o", str(out), "-m", str(model), "--dtype", "float32", "--keep-cols", "topic", "-q"],
    )
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == [f"doc{i}" for i in range(len(TEXTS))]
    assert table.column("topic").to_pylist() == ["t0", "t1", "t0", "t1"]
    assert pa.types.is_fixed_size_list(table.schema.field("embedding").type)
    ours = np.asarray(table.column("embedding").to_pylist(), dtype=np.float32)
    ref = _st_reference(model, TEXTS)
    np.testing.assert_allclose(ours, ref, atol=1e-5)
    meta = table.schema.metadata
    assert meta[b"embedcli.model"] == str(model).encode()
    assert json.loads(meta[b"embedcli.config"])["pooling"] == "MEAN"


def test_embed_to_stdout_writes_jsonl_and_nothing_else(tiny_model, corpus: Path) -> None:
    model = tiny_model("bert-st")
    result = CliRunner().invoke(app, ["embed", str(corpus), "-o", "-", "-m", str(model), "--dtype", "float32", "-q"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["id"] for row in lines] == [f"doc{i}" for i in range(len(TEXTS))]
    assert all(len(row["embedding"]) == 32 for row in lines)


def test_embed_text_file_gets_file_line_ids(tiny_model, tmp_path: Path) -> None:
    src = tmp_path / "lines.txt"
    src.write_text("first line\nsecond line\n", encoding="utf-8")
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(app, ["embed", str(src), "-o", str(out), "-m", str(tiny_model("bert-st")), "-q"])
    assert result.exit_code == 0, result.output
    assert pq.read_table(out).column("id").to_pylist() == ["lines.txt:1", "lines.txt:2"]


def test_embed_missing_input_exits_1_and_writes_nothing(tiny_model, tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(
        app, ["embed", str(tmp_path / "nope.jsonl"), "-o", str(out), "-m", str(tiny_model("bert-st")), "-q"]
    )
    assert result.exit_code == 1
    assert "no such file" in result.output
    assert not out.exists()


def test_embed_missing_model_exits_1_with_hint(corpus: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["embed", str(corpus), "-o", str(tmp_path / "o.parquet"), "-m", "no/such-model"])
    assert result.exit_code == 1
    assert "not in the local Hugging Face cache" in result.output


def test_info_json_lists_commands(tiny_model) -> None:
    result = CliRunner().invoke(app, ["info", str(tiny_model("bert-st")), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["seq_pooling_type"] == "MEAN"
    assert data["normalize"] is True
    assert "embed" in data["commands"]


def test_version_and_help() -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["--version"]).stdout.startswith("embedcli ")
    help_text = runner.invoke(app, ["embed", "--help"]).stdout
    assert "--max-batch-tokens" in help_text and "Example" in help_text


def test_quantize_is_close_but_not_equal_and_recorded(tiny_model, corpus: Path, tmp_path: Path) -> None:
    model = str(tiny_model("bert-st"))
    runner = CliRunner()
    plain, quant = tmp_path / "plain.parquet", tmp_path / "quant.parquet"
    assert runner.invoke(app, ["embed", str(corpus), "-o", str(plain), "-m", model, "--dtype", "float32", "-q"]).exit_code == 0
    result = runner.invoke(app, ["embed", str(corpus), "-o", str(quant), "-m", model, "--quantize", "-q"])
    assert result.exit_code == 0, result.output
    a = np.asarray(pq.read_table(plain).column("embedding").to_pylist())
    b = np.asarray(pq.read_table(quant).column("embedding").to_pylist())
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.9 and not np.allclose(a, b, atol=1e-6)
    config = json.loads(pq.read_table(quant).schema.metadata[b"embedcli.config"])
    assert config["quantize"] is True and config["dtype"] == "float32"


def test_quantize_with_bfloat16_is_a_usage_error(tiny_model, corpus: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["embed", str(corpus), "-o", str(tmp_path / "o.parquet"), "-m", str(tiny_model("bert-st")),
              "--quantize", "--dtype", "bfloat16", "-q"],
    )
    assert result.exit_code == 2
    assert "--quantize" in result.output
