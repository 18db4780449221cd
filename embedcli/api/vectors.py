"""`embed`, `hybrid_embed` (BGE-M3's `embed --outputs`), `token_embed`, `token_classify` and `sparse_embed` over
in-memory texts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from embedcli.api.inputs import BATCH_ROWS, memory_batch, texts_of
from embedcli.api.session import Session
from embedcli.quantize import make_quantizer, ranges_of
from embedcli.tasks.embed import calibrate_on_output, check_calibration_width
from embedcli.tasks.m3 import HybridRequest, check_hybrid, hybrid_computation
from embedcli.tasks.m3_rules import parse_outputs
from embedcli.tasks.sparse import SparseOptions, check_sparse_options, sparse_computation
from embedcli.tasks.tokens import TokenOptions, token_classify_computation, token_embed_computation


class VectorMethods(Session):
    """The commands that turn each text into vectors (one, per token, sparse, or BGE-M3's three at once), and
    per-token labels."""

    def embed(
        self,
        texts: str | Sequence[str],
        *,
        normalize: bool | None = None,
        dimensions: int | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
        long_inputs: str = "truncate",
        truncation_side: str | None = None,
        strip: bool = False,
        precision: str = "float32",
        calibration: str | None = None,
    ) -> np.ndarray:
        """`embedcli embed`: vectors `[len(texts), d]` in input order (one string gives `[d]`): float32, or the
        `precision`'s codes (int8/uint8 ranges from these vectors, unless `calibration` names a file)."""
        rows = texts_of(texts)
        quant = make_quantizer(precision, calibration)
        recipe = self._embed_recipe(normalize, dimensions, prompt, prompt_name, long_inputs, truncation_side, strip)
        vectors = self._runners.engine(recipe).embed(rows, batch_rows=BATCH_ROWS).astype(np.float32, copy=False)
        if quant.precision != "float32":
            check_calibration_width(quant, calibration, vectors.shape[1])
            if quant.needs_ranges:
                calibrate_on_output(quant, ranges_of(vectors), len(vectors))
            vectors = quant(vectors)
        return vectors[0] if isinstance(texts, str) else vectors

    def hybrid_embed(
        self,
        texts: str | Sequence[str],
        *,
        outputs: Sequence[str] = ("dense", "sparse", "colbert"),
        prompt: str | None = None,
        prompt_name: str | None = None,
        long_inputs: str = "truncate",
        truncation_side: str | None = None,
        strip: bool = False,
    ) -> Any:
        """`embedcli embed --outputs` on BGE-M3: a pyarrow Table with each asked output's columns, in the order
        asked (dense: `embedding`; sparse: `indices`, `values`; colbert: `token_ids`, `embeddings`), one forward
        per pack."""
        self._no_quantize("hybrid_embed")
        names = parse_outputs(",".join(texts_of(outputs, "outputs")))
        request = HybridRequest(names, max_batch_tokens=self.max_batch_tokens, strip=strip, prompt=prompt,
                                prompt_name=prompt_name, long_inputs=long_inputs, truncation_side=truncation_side)
        check_hybrid(self.spec, request, precision="float32", dimensions=None, normalize=None, calibration=None,
                     fmt="parquet")
        work = hybrid_computation(self.spec, self.choice, request)
        return self._runners.rows(work, memory_batch(texts_of(texts)))

    def token_embed(
        self,
        texts: str | Sequence[str],
        *,
        role: str = "auto",
        normalize: bool | None = None,
        dimensions: int | None = None,
        keep_special: bool = False,
        step_tag_id: int | None = None,
        long_inputs: str = "truncate",
        truncation_side: str | None = None,
        strip: bool = False,
    ) -> Any:
        """`embedcli token-embed`: a pyarrow Table `token_ids` (list<int32>), `embeddings`
        (list<fixed_size_list<float32>[d]>), one row per text; a ColBERT model's query or document vectors by
        `role` (auto: document), BGE-M3's colbert vectors."""
        self._no_quantize("token_embed")
        opts = TokenOptions(
            keep_special=keep_special, step_tag_id=step_tag_id, dimensions=dimensions, normalize=normalize,
            max_batch_tokens=self.max_batch_tokens, long_inputs=long_inputs, truncation_side=truncation_side,
            strip=strip, role=role,
        )
        work = token_embed_computation(self.spec, self.choice, opts)
        return self._runners.rows(work, memory_batch(texts_of(texts)))

    def token_classify(
        self,
        texts: str | Sequence[str],
        *,
        activation: str = "auto",
        all_scores: bool = False,
        logit_mean: float | None = None,
        logit_sigma: float | None = None,
        step_tag_id: int | None = None,
        returned_token_ids: Sequence[int] | None = None,
        keep_special: bool = False,
        long_inputs: str = "truncate",
        truncation_side: str | None = None,
        strip: bool = False,
    ) -> Any:
        """`embedcli token-classify`: a pyarrow Table `token_ids`, `labels` (list<string>), `scores`
        (list<float32>)[, `probs`], one row per text (NER; step pooling with `step_tag_id`)."""
        self._no_quantize("token_classify")
        opts = TokenOptions(
            keep_special=keep_special, step_tag_id=step_tag_id, activation=activation, all_scores=all_scores,
            returned_token_ids=tuple(int(i) for i in returned_token_ids or ()) or None,
            logit_mean=logit_mean, logit_sigma=logit_sigma, max_batch_tokens=self.max_batch_tokens,
            long_inputs=long_inputs, truncation_side=truncation_side, strip=strip,
        )
        work = token_classify_computation(self.spec, self.choice, opts)
        return self._runners.rows(work, memory_batch(texts_of(texts)))

    def sparse_embed(
        self,
        texts: str | Sequence[str],
        *,
        top_k: int | None = None,
        with_tokens: bool = False,
        prompt: str | None = None,
        prompt_name: str | None = None,
        long_inputs: str = "truncate",
        truncation_side: str | None = None,
        strip: bool = False,
    ) -> Any:
        """`embedcli sparse-embed`: a pyarrow Table `indices` (list<int32>, ascending), `values` (list<float32>)
        [, `tokens`], one row per text (SPLADE; BGE-M3's lexical weights); `top_k` is `--sparse-top-k`."""
        self._no_quantize("sparse_embed")
        opts = SparseOptions(
            top_k=top_k, with_tokens=with_tokens, max_batch_tokens=self.max_batch_tokens, long_inputs=long_inputs,
            truncation_side=truncation_side, strip=strip, prompt=prompt, prompt_name=prompt_name,
        )
        check_sparse_options(opts)
        work = sparse_computation(self.spec, self.choice, opts)
        return self._runners.rows(work, memory_batch(texts_of(texts)))
