"""`classify` over in-memory texts or text pairs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from embedcli.api.inputs import memory_batch, pairs_of
from embedcli.api.session import Session
from embedcli.tasks.classify import ClassifyOptions, classify_computation

PAIR_COL = "pair"  # the column of a pair's second text, as `classify --pair-col` names one


class ClassifyMethods(Session):
    """The command that labels each text (or text pair)."""

    def classify(
        self,
        texts: str | Sequence[str] | Sequence[tuple[str, str]],
        *,
        activation: str = "auto",
        top_k: int = 1,
        all_scores: bool = False,
        logit_mean: float | None = None,
        logit_sigma: float | None = None,
        long_inputs: str = "truncate",
        truncation_side: str | None = None,
        strip: bool = False,
    ) -> Any:
        """`embedcli classify`: a pyarrow Table `label, score[, top_labels, top_scores][, scores]`, one row per
        text; (first, second) pairs are classified as `classify --pair-col` does (CrossEncoder's pair, e.g. NLI)."""
        self._no_quantize("classify")
        firsts, seconds = pairs_of(texts)
        opts = ClassifyOptions(
            activation=activation, top_k=top_k, all_scores=all_scores, logit_mean=logit_mean, logit_sigma=logit_sigma,
            max_batch_tokens=self.max_batch_tokens, long_inputs=long_inputs, truncation_side=truncation_side,
            strip=strip, pair_col=PAIR_COL if seconds is not None else None,
        )
        work = classify_computation(self.spec, self.choice, opts)
        return self._runners.rows(work, memory_batch(firsts, {PAIR_COL: seconds} if seconds is not None else None))
