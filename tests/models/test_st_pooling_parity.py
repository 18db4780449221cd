"""Every sentence-transformers Pooling mode, as saved by sentence-transformers 6, equals its `encode`.

Each checkpoint is a tiny random body (BERT WordPiece, Qwen2 without special tokens) wrapped by
`SentenceTransformer(modules=[Transformer, Pooling(mode), Normalize]).save`; embedcli runs it packed with
the other texts at three token budgets: 8 (encoders: longer texts run alone; Qwen2: chunked prefill in
slices of 8 with a KV cache), 40 (mixed) and 4096 (one forward).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.tiny_models import LONG_TEXT, SAMPLE_TEXTS, build_st_model

TEXTS = [*SAMPLE_TEXTS, LONG_TEXT, "market", "the film won best album award in the uk chart"]
BUDGETS = (8, 40, 4096)
PROMPT = "query: "
# (pooling_mode as sentence-transformers takes it, include_prompt)
CASES = {
    "max": ("max", True),
    "weightedmean": ("weightedmean", True),
    "mean_sqrt_len": ("mean_sqrt_len_tokens", True),
    "cls+mean": (("cls", "mean"), True),
    "last+max+weightedmean": (("lasttoken", "max", "weightedmean"), True),
    "mean-no-prompt": ("mean", False),
    "all-no-prompt": (("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"), False),
}


@pytest.fixture(scope="module")
def st_checkpoint(tiny_model, tmp_path_factory) -> Callable[[str, str], Path]:  # type: ignore[no-untyped-def]
    """`st_checkpoint(body, case) -> folder` saved by sentence-transformers 6 (built once per module)."""
    root = tmp_path_factory.mktemp("st_pooling")
    built: dict[tuple[str, str], Path] = {}

    def get(body: str, case: str) -> Path:
        if (body, case) not in built:
            mode, include_prompt = CASES[case]
            built[body, case] = build_st_model(
                tiny_model(body), root / f"{body}-{case}", pooling=mode, include_prompt=include_prompt,
                prompts={"query": PROMPT},
            )
        return built[body, case]

    return get


def _reference(folder: Path, prompt_name: str | None) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return model.encode(TEXTS, prompt_name=prompt_name, batch_size=4)


@pytest.mark.parametrize("body", ["bert", "qwen2"])
@pytest.mark.parametrize("case", list(CASES))
def test_pooling_mode_equals_sentence_transformers(body, case, st_checkpoint, torch_single_thread) -> None:
    from embedcli.api import Embedder

    folder = st_checkpoint(body, case)
    prompt_name = None if CASES[case][1] else "query"
    expected = _reference(folder, prompt_name)
    for budget in BUDGETS:
        embedder = Embedder(
            str(folder), device="cpu", dtype="float32", max_batch_tokens=budget,
            prompt=PROMPT if prompt_name else "",
        )
        got = embedder.embed(TEXTS)
        assert got.shape == expected.shape
        delta = float(np.abs(got - expected).max())
        print(f"{body} {case} budget {budget}: max |delta| {delta:.2e}")
        assert delta <= 1e-5, f"{body} {case} budget {budget}: max |delta| {delta:.2e}"
