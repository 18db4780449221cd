"""A refused flag value or combination is exit 2 with one `embedcli: …` line naming the flag (issue 12, item 4),
never a traceback or exit 1; run through the CLI on tiny models."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

EMBED = ("embed", "{rows}", "-o", "{out}/out.parquet", "-m", "{st}")

# (command and flags, environment, torch.cuda.is_available() as patched, the flag named, the fix named)
CASES = {
    "device-unknown": ((*EMBED, "--device", "tpu"), {}, False, "--device 'tpu'", "auto, cpu, cuda, cuda:N"),
    "device-bad-index": ((*EMBED, "--device", "cuda:x"), {}, False, "--device 'cuda:x'", "cuda:N"),
    "device-mps": ((*EMBED, "--device", "mps"), {}, False, "--device 'mps'", "auto, cpu"),
    "device-no-cuda": ((*EMBED, "--device", "cuda"), {}, False, "--device cuda", "--device cpu"),
    "device-no-cuda-index": ((*EMBED, "--device", "cuda:1"), {}, False, "--device cuda:1", "--device cpu"),
    "dtype": ((*EMBED, "--dtype", "float64"), {}, False, "--dtype 'float64'", "auto, float32, bfloat16, float16"),
    "dtype-env": (EMBED, {"EMBEDCLI_DTYPE": "fp16"}, False, "--dtype 'fp16'", "float16"),
    "backbone-env": (EMBED, {"EMBEDCLI_BACKBONE": "fast"}, False, "EMBEDCLI_BACKBONE 'fast'", "auto, own, transformers"),
    "quantize-bf16": ((*EMBED, "--quantize", "--dtype", "bfloat16"), {}, False, "--quantize", "drop --dtype"),
    "quantize-cuda": ((*EMBED, "--quantize", "--device", "cuda"), {}, True, "--quantize", "drop --dtype/--device"),
    "quantize-auto-on-gpu": ((*EMBED, "--quantize"), {}, True, "--quantize", "--device cpu"),
    "dimensions-negative": ((*EMBED, "--dimensions", "-1"), {}, False, "--dimensions -1", "at least 1"),
    "max-batch-tokens-zero": ((*EMBED, "--max-batch-tokens", "0"), {}, False, "--max-batch-tokens 0", "at least 1"),
    "token-embed-dimensions": (("token-embed", "{rows}", "-o", "{out}/t.parquet", "-m", "{st}", "--dimensions", "0"),
                               {}, False, "--dimensions 0", "at least 1"),
    # a column kept twice was a pyarrow traceback (exit 1) once the first batch was computed
    "keep-cols-twice": ((*EMBED, "--keep-cols", "text,text"), {}, False, "--keep-cols text,text", "name each column once"),
    "score-keep-cols-twice": (("score", "{rows}", "--left-col", "text", "--right-col", "text", "-o", "{out}/s.parquet",
                               "-m", "{st}", "--keep-cols", "id,text,id"), {}, False, "'id' is named twice",
                              "name each column once"),
    "input-format": ((*EMBED, "--format", "xml"), {}, False, "--format 'xml'", "jsonl, parquet, csv, tsv, txt"),
    "output-format": ((*EMBED, "--output-format", "csv"), {}, False, "--output-format 'csv'", "parquet, jsonl, npy"),
    "run-batch-device": (("run-batch", "{requests}", "-o", "{out}/b.jsonl", "-m", "{st}", "--device", "xpu"),
                         {}, False, "--device 'xpu'", "cuda:N"),
    "search-device": (("search", "{vectors}", "--query", "hi", "-m", "{st}", "--device", "gpu"),
                      {}, False, "--device 'gpu'", "cuda:N"),
    "search-output-format": (("search", "{vectors}", "--query", "hi", "-m", "{st}", "--output-format", "tsv"),
                             {}, False, "--output-format 'tsv'", "parquet"),
    "logit-sigma": (("classify", "{rows}", "-o", "{out}/c.parquet", "-m", "{classifier}", "--logit-sigma", "0"),
                    {}, False, "--logit-sigma 0", "positive"),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, st_model: Path, tiny_model: Callable[[str], Path]) -> dict[str, str]:
    """The paths the cases name: rows, a run-batch request file, a vectors file, a tiny classifier."""
    import torch
    from transformers import BertForSequenceClassification
    from typer.testing import CliRunner

    from embedcli.cli import app

    root = tmp_path_factory.mktemp("flags")
    rows = root / "rows.jsonl"
    rows.write_text(json.dumps({"id": "a", "text": "hello"}) + "\n", encoding="utf-8")
    requests = root / "requests.jsonl"
    body = {"model": "m", "input": "hello"}
    requests.write_text(json.dumps({"custom_id": "r", "method": "POST", "url": "/v1/embeddings", "body": body}) + "\n")
    vectors = root / "vectors.parquet"  # search reads vectors embedcli wrote (their provenance names the model)
    made = CliRunner().invoke(app, ["embed", str(rows), "-o", str(vectors), "-m", str(st_model), "-q"],
                              env={"EMBEDCLI_DTYPE": "float32"})
    assert made.exit_code == 0, made.stderr
    bert = tiny_model("bert")
    classifier = root / "classifier"
    torch.manual_seed(0)
    BertForSequenceClassification.from_pretrained(str(bert), num_labels=3).save_pretrained(str(classifier))
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        if (bert / name).is_file():
            (classifier / name).write_bytes((bert / name).read_bytes())
    return {"rows": str(rows), "requests": str(requests), "vectors": str(vectors), "st": str(st_model),
            "classifier": str(classifier)}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_flag_is_one_line_exit_2(
    case: str, files: dict[str, str], cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    import torch

    args, env, cuda, flag, fix = CASES[case]
    # Whether CUDA is there is the machine's business; each case says which machine it refuses on.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    result = cli(*(a.format(out=tmp_path, **files) for a in args), code=None, env=env)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.exception)
    assert len(lines) == 1 and lines[0].startswith("embedcli: "), result.stderr
    assert flag in lines[0] and fix in lines[0], lines[0]
