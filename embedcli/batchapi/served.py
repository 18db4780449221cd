"""What the loaded model serves: the names a request may give, its tasks, sizes, prompts and labels."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SCORE_METHODS: tuple[str, ...] = ("cross-encoder", "cosine", "maxsim", "sparse")
# The task of a SPLADE model: served as vLLM serves `BertSpladeSparseEmbeddingModel`, under `embed` (see requests).
SPARSE_TASK = "sparse_embed"


@dataclass(frozen=True, eq=False)
class ServedModel:
    """The one model a batch run serves, as far as request validation needs to know it."""

    names: tuple[str, ...]
    tasks: frozenset[str]
    embedding_size: int | None = None
    is_matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] | None = None
    max_length: int | None = None
    prompts: Mapping[str, str] = field(default_factory=dict)
    id2label: Mapping[int, str] = field(default_factory=dict)
    score_method: str | None = None  # how /score and /rerank score a pair; None: the model cannot score
    vocab_size: int | None = None  # token ids in requests must be below it (None: unknown, int64 only)
    # The fewest tokens a text (its special tokens) and a scored pair (the pair's special tokens, or an LLM
    # reranker's bare template) become: a truncation below them cannot be honoured.
    min_tokens: int = 0
    min_pair_tokens: int = 0

    @property
    def sparse(self) -> bool:
        """Whether the model gives SPLADE vectors (vocabulary-sized; `embedding_size` is the vocabulary)."""
        return SPARSE_TASK in self.tasks

    @property
    def name(self) -> str:
        """The name responses carry in `model` (the first of `names`)."""
        return self.names[0]

    def serves(self, name: str | None) -> bool:
        """Whether a request's `body.model` names this model (absent names it too)."""
        return name is None or name in self.names

    @classmethod
    def from_spec(
        cls, spec: Any, names: tuple[str, ...] = (), score_method: str | None = None, vocab_size: int | None = None,
        min_tokens: int = 0, min_pair_tokens: int = 0,
    ) -> ServedModel:
        """What an `embedcli.models.spec.ModelSpec` serves; `names`: more names `body.model` may give (the
        `-m` value); `score_method`: `--method` as resolved, else the model's own (vLLM's score type)."""
        if score_method is None:
            score_method = {"cross-encoder": "cross-encoder", "bi-encoder": "cosine", "sparse": "sparse"}.get(spec.score_type or "")
        return cls(
            names=tuple(dict.fromkeys((spec.name, *names))),
            tasks=frozenset(spec.tasks),
            embedding_size=spec.embedding_size or spec.hidden_size,
            is_matryoshka=spec.is_matryoshka,
            matryoshka_dimensions=spec.matryoshka_dimensions,
            max_length=spec.max_length,
            prompts=dict(spec.prompts),
            id2label=dict(enumerate(spec.id2label)),
            score_method=score_method,
            vocab_size=vocab_size,
            min_tokens=min_tokens,
            min_pair_tokens=min_pair_tokens,
        )
