"""Exit codes of the language-model-head families: a refused file/flag combination is exit 2
(`ConfigRefusedError`), a missing or inconsistent file stays exit 1 (`ModelConfigError`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from embedcli.errors import (
    EXIT_FATAL,
    EXIT_USAGE,
    ConfigRefusedError,
    ModelConfigError,
    UnsupportedCheckpoint,
)
from embedcli.models.checkpoint.families import read_reranker, read_splade
from embedcli.models.llm_reranker import RerankerFlags
from tests.fixtures.tiny_models import write_tokenizer

CAUSAL = "LlamaForCausalLM"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lm")
    write_tokenizer(path, decoder=True)
    return path


def _code(call: Any) -> tuple[int, str]:
    with pytest.raises(ModelConfigError) as err:
        call()
    assert "\n" not in str(err.value)
    return err.value.exit_code, str(err.value)


@pytest.mark.parametrize(
    "call, where",
    [
        (lambda f: read_splade(f, "BertModel", {}, {}), "modules.json"),
        (lambda f: read_splade(f, "BertForMaskedLM", {"pooling_strategy": "mean"}, {}), "pooling_strategy"),
        (lambda f: read_reranker(f, "BertModel", None, RerankerFlags(classifier_from_tokens=("no", "yes"))), "config.json"),
        (lambda f: read_reranker(f, CAUSAL, None, RerankerFlags(preset="nope")), "--reranker-preset"),
        (lambda f: read_reranker(f, CAUSAL, None, RerankerFlags(pair_template="{query}")), "--classifier-from-tokens"),
        (lambda f: read_reranker(f, CAUSAL, None, RerankerFlags(classifier_from_tokens=("a", "b", "c"))),
         "--classifier-from-tokens"),
        (lambda f: read_reranker(f, CAUSAL, None, RerankerFlags(classifier_from_tokens=("no", "absolutely-not"))),
         "tokenizer.json"),
    ],
    ids=["splade-arch", "splade-pooling", "reranker-arch", "preset", "no-tokens", "three-tokens", "not-a-token"],
)
def test_refused_combinations_exit_2(folder: Path, call: Any, where: str) -> None:
    code, message = _code(lambda: call(folder))
    assert code == EXIT_USAGE and where in message


def test_inconsistent_or_missing_files_stay_exit_1(folder: Path, tmp_path: Path) -> None:
    code, message = _code(lambda: read_reranker(folder, CAUSAL, {"true_token_id": 10**9}, RerankerFlags()))
    assert code == EXIT_FATAL and "LogitScore" in message
    code, message = _code(lambda: read_reranker(tmp_path, CAUSAL, None, RerankerFlags(classifier_from_tokens=("no",))))
    assert code == EXIT_FATAL and "tokenizer.json" in message


def test_unsupported_checkpoint_lives_in_errors() -> None:
    from embedcli.models.backbones import layers

    assert layers.UnsupportedCheckpoint is UnsupportedCheckpoint
    assert issubclass(UnsupportedCheckpoint, ValueError)
    assert issubclass(ConfigRefusedError, ModelConfigError)
