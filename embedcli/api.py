"""A small Python API for notebooks, on the same runner (and the same builder) as the command line."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from embedcli.compute.build import build_engine, embed_recipe
from embedcli.models.options import ModelOptions
from embedcli.models.spec import load_model_spec


class Embedder:
    """Embed texts with a model resolved offline: `Embedder().embed(["a", "b"]) -> np.ndarray`.

    The model's `default_prompt_name` applies, as in `embedcli embed` and sentence-transformers; pass
    `prompt=""` to embed without a prompt.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        device: str = "auto",
        dtype: str = "auto",
        max_batch_tokens: int | None = None,
        max_length: int | None = None,
        normalize: bool | None = None,
        dimensions: int | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
    ) -> None:
        spec = load_model_spec(model, max_length=max_length)
        recipe = embed_recipe(
            spec, ModelOptions(device=device, dtype=dtype), max_batch_tokens=max_batch_tokens,
            normalize=normalize, dimensions=dimensions, prompt=prompt, prompt_name=prompt_name,
        )
        self.runner = build_engine(recipe)  # a static model: numpy only, torch never loads
        self.model = self.runner.model

    def embed(self, texts: Sequence[str] | str) -> np.ndarray:
        """float32 vectors `[len(texts), d]` in input order (a single string gives `[d]`)."""
        if isinstance(texts, str):
            return self.runner.embed([texts])[0]
        return self.runner.embed(list(texts))
