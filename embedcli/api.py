"""A small Python API for notebooks, on the same runner as the command line."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.spec import load_model_spec
from embedcli.runner import Runner, RunnerOptions


class Embedder:
    """Embed texts with a model resolved offline: `Embedder().embed(["a", "b"]) -> np.ndarray`."""

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
        prompt: str = "",
    ) -> None:
        self.model = LoadedModel(load_model_spec(model, max_length=max_length), ModelOptions(device=device, dtype=dtype))
        self.runner = Runner(
            self.model,
            RunnerOptions(
                task="embed",
                max_batch_tokens=max_batch_tokens,
                normalize=normalize,
                dimensions=dimensions,
                prompt=prompt,
            ),
        )

    def embed(self, texts: Sequence[str] | str) -> np.ndarray:
        """float32 vectors `[len(texts), d]` in input order (a single string gives `[d]`)."""
        if isinstance(texts, str):
            return self.runner.embed([texts])[0]
        return self.runner.embed(list(texts))
