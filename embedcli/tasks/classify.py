"""`embedcli classify`: a label and its score per row (and the top K, or every label's probability).

With `--pair-col` each row is a text pair (`--text-col`, `--pair-col`), tokenized as sentence-transformers'
CrossEncoder tokenizes a pair (the tokenizer's text pair, `longest_first` truncation), so an NLI
cross-encoder's three labels come out as `CrossEncoder.predict` gives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.compute.build import RunnerRecipe
from embedcli.compute.choice import can_do, require_task
from embedcli.compute.options import RunnerOptions
from embedcli.errors import UsageError
from embedcli.io.writers import embedding_array
from embedcli.models.spec import ModelSpec
from embedcli.run.flags import RunFlags
from embedcli.run.source import BatchSource, InputOptions, check_head, empty_batch, id_column, with_kept
from embedcli.run.target import check_target
from embedcli.tasks.common import (
    Computation,
    ModelChoice,
    OutputOptions,
    RowInputs,
    activation,
    calibration,
    load_spec,
    located,
    run_computation,
)


@dataclass(frozen=True)
class ClassifyOptions:
    """`classify` choices."""

    activation: str = "auto"
    top_k: int = 1
    all_scores: bool = False
    logit_mean: float | None = None
    logit_sigma: float | None = None
    max_batch_tokens: int | None = None
    long_inputs: str = "truncate"
    truncation_side: str | None = None
    strip: bool = False
    pair_col: str | None = None  # each row's second text: the row is classified as a pair


@dataclass(frozen=True)
class ClassifyCodec:
    """Rows of `classify`: id, label, score, [top_labels, top_scores], [scores], kept columns."""

    labels: np.ndarray
    top_k: int
    all_scores: bool
    keep_cols: tuple[str, ...] = ()
    pair_col: str | None = None

    def inputs(self, batch: Any) -> Any:
        """The batch's texts, or (text, pair text) pairs with `--pair-col`."""
        if self.pair_col is None:
            return located(batch)
        # nulls in either column were set aside as bad rows by the run's row checks
        return RowInputs(zip(batch.texts, batch.extra_texts[self.pair_col], strict=True), batch)

    def table(self, batch: Any, probs: Any) -> Any:
        """The output rows of a batch."""
        p = np.asarray(probs, dtype=np.float32).reshape(len(batch.ids), len(self.labels))
        best = p.argmax(axis=1) if len(p) else np.zeros(0, dtype=np.int64)
        columns: dict[str, Any] = {
            "id": id_column(batch),
            "label": pa.array(self.labels[best].tolist(), pa.string()),
            "score": pa.array(p[np.arange(len(p)), best], pa.float32()),
        }
        if self.top_k > 1:
            order = np.argsort(-p, axis=1, kind="stable")[:, : self.top_k]
            columns["top_labels"] = pa.array([self.labels[o].tolist() for o in order], pa.list_(pa.string()))
            columns["top_scores"] = pa.array([p[i, o].tolist() for i, o in enumerate(order)], pa.list_(pa.float32()))
        if self.all_scores:
            columns["scores"] = embedding_array(p)
        return pa.table(with_kept(columns, batch, self.keep_cols))

    def empty(self) -> Any:
        """The output of no rows."""
        return self.table(empty_batch(self.keep_cols), np.zeros((0, len(self.labels)), np.float32))


def check_pair_col(spec: ModelSpec, text_col: str, pair_col: str) -> None:
    """UsageError unless `spec` can classify text pairs read from `text_col` and `pair_col`."""
    if pair_col == text_col:
        raise UsageError(f"--pair-col {pair_col}: it is --text-col too; name the column of each row's second text")
    if spec.head == "lm_score":
        raise UsageError(
            f"classify --pair-col: model {spec.name!r} is an LLM reranker, whose pair is a prompt template; "
            f"score its pairs with `embedcli score --left-col {text_col} --right-col {pair_col}`; {can_do(spec)}"
        )


def classify_computation(
    spec: ModelSpec, choice: ModelChoice, opts: ClassifyOptions, text_col: str = "text", keep_cols: tuple[str, ...] = ()
) -> Computation:
    """The runner recipe, codec and provenance of `classify` on `spec` (usage errors before anything loads)."""
    require_task(spec, "classify", "classify")
    if opts.pair_col is not None:
        check_pair_col(spec, text_col, opts.pair_col)
    if opts.activation == "softmax" and spec.num_labels == 1:
        # softmax over one logit is 1.0 whatever the input; CrossEncoder.predict(apply_softmax=True) skips it there
        raise UsageError(f"--activation softmax: model {spec.name!r} has one label, whose softmax is 1.0 for every "
                         "row; use --activation sigmoid for a probability, or none for the logit")
    if not 1 <= opts.top_k <= spec.num_labels:
        raise UsageError(f"--top-k {opts.top_k}: the model has {spec.num_labels} labels")
    mean, sigma = calibration(spec, opts.logit_mean, opts.logit_sigma)
    recipe = RunnerRecipe(
        spec,
        choice.options(activation=activation(opts.activation), logit_mean=mean, logit_sigma=sigma),
        RunnerOptions(
            task="classify", max_batch_tokens=opts.max_batch_tokens, long_inputs=opts.long_inputs,  # type: ignore[arg-type]  # typer's Literal choices; RunnerOptions takes the same values
            truncation_side=opts.truncation_side, strip=opts.strip,  # type: ignore[arg-type]  # typer's Literal choices; RunnerOptions takes the same values
        ),
        choice.threads,
    )
    codec = ClassifyCodec(np.asarray(spec.id2label, dtype=object), opts.top_k, opts.all_scores, keep_cols, opts.pair_col)
    extra: dict[str, Any] = {
        "activation": opts.activation, "logit_mean": mean, "logit_sigma": sigma, "labels": list(spec.id2label),
        "top_k": opts.top_k, "all_scores": opts.all_scores,
    }
    if opts.pair_col is not None:  # only when given: single-text outputs keep their config hash (and resume)
        extra["pair_col"] = opts.pair_col
    return Computation(recipe, codec, extra)


def run_classify(
    inputs: InputOptions, choice: ModelChoice, opts: ClassifyOptions, output: OutputOptions, flags: RunFlags | None = None
) -> int:
    """`embedcli classify`: label, score (its probability) and optionally every label's probability per row."""
    flags = flags or RunFlags()
    check_target(output.path, flags, inputs.paths, output.stats_file)
    pairs = (opts.pair_col,) if opts.pair_col is not None else ()
    source = BatchSource(inputs, pairs)
    check_head(source, flags)  # said before the model loads
    work = classify_computation(load_spec(choice), choice, opts, inputs.text_col, tuple(inputs.keep_cols))
    return run_computation(source, work, output, flags)
