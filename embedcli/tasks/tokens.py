"""`embedcli token-embed` / `token-classify`: per-token vectors, or a label and score per token."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from embedcli.compute.build import RunnerRecipe
from embedcli.compute.choice import require_task
from embedcli.compute.options import RunnerOptions, TokenRows
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
    activation,
    calibration,
    load_spec,
    located,
    run_computation,
    runner_recipe,
)
from embedcli.tasks.m3_rules import check_m3_token_embed, m3_extra

if TYPE_CHECKING:  # torch: loaded with the model, only once a run has work to do
    import torch

    from embedcli.compute.runner import Runner


@dataclass(frozen=True)
class TokenOptions:
    """`token-embed` / `token-classify` choices."""

    keep_special: bool = False
    step_tag_id: int | None = None
    returned_token_ids: tuple[int, ...] | None = None
    dimensions: int | None = None  # token-embed
    normalize: bool | None = None  # token-embed
    activation: str = "auto"  # token-classify
    all_scores: bool = False  # token-classify
    logit_mean: float | None = None
    logit_sigma: float | None = None
    max_batch_tokens: int | None = None
    long_inputs: str = "truncate"
    truncation_side: str | None = None
    strip: bool = False
    role: str = "auto"  # token-embed on a late-interaction model: query or document (auto: document)


def token_role(spec: ModelSpec, opts: TokenOptions) -> str | None:
    """The role texts are encoded in: a late-interaction model's query or document (auto: document); None for
    any other model, which has no roles (UsageError when one is asked of it)."""
    if spec.late_interaction is None:
        if opts.role != "auto":
            raise UsageError(
                f"token-embed: --role {opts.role} applies to late-interaction (ColBERT) models; {spec.name!r} gives "
                "the same per-token vectors for every text (use --prompt-name on embed for query/document prompts)"
            )
        return None
    if opts.keep_special or opts.step_tag_id is not None:
        flag = "--keep-special" if opts.keep_special else "--step-tag-id"
        raise UsageError(
            f"token-embed: {flag} does not apply to a late-interaction (ColBERT) model: its query and document "
            "vectors are the model's own (query expansion kept, skiplist tokens dropped)"
        )
    return "document" if opts.role == "auto" else opts.role


def special_ids(model: Any) -> np.ndarray:
    """Ids of the tokens the tokenizer's template adds (CLS/SEP/BOS/EOS/PAD); UNK and MASK stay."""
    tok = model.hf_tokenizer
    ids = {getattr(tok, f"{name}_token_id", None) for name in ("cls", "sep", "bos", "eos", "pad")}
    return np.asarray(sorted(i for i in ids if i is not None), dtype=np.int64)


def select_tokens(
    ids: np.ndarray, values: np.ndarray, special: np.ndarray, opts: TokenOptions, template: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The kept rows: step-tag tokens under step pooling; else all tokens but special ones (unless kept).

    Given `template` (the tokens the tokenizer's template added, by position) only those are special: a `[SEP]`
    or `<s>` spelled in the text is a token of the text, as transformers' token-classification pipeline keeps it.
    """
    if opts.step_tag_id is not None:
        ids = ids[ids == opts.step_tag_id]
        if len(ids) != len(values):
            raise RuntimeError(f"step pooling returned {len(values)} rows for {len(ids)} step tokens")
        return ids, values
    if opts.keep_special:
        return ids, values
    if template is not None:
        keep = ~template
    elif len(special):
        keep = ~np.isin(ids, special)
    else:
        return ids, values
    return ids[keep], values[keep]


def _templates(result: TokenRows) -> list[np.ndarray | None]:
    return list(result.template) if result.template is not None else [None] * len(result.ids)


def list_of_vectors(matrices: Sequence[np.ndarray], width: int, dtype: Any = np.float32) -> Any:
    """`list<fixed_size_list<dtype>[width]>` from one `[n_i, width]` matrix per row."""
    offsets = np.zeros(len(matrices) + 1, dtype=np.int32)
    np.cumsum([len(m) for m in matrices], out=offsets[1:])
    flat = np.concatenate([np.asarray(m, dtype=dtype).reshape(-1, width) for m in matrices]) if matrices else None
    if flat is None:
        flat = np.zeros((0, width), dtype=dtype)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), embedding_array(flat))


def list_column(parts: Sequence[np.ndarray], typ: Any) -> Any:
    """`list<typ>` from one array per row."""
    offsets = np.zeros(len(parts) + 1, dtype=np.int32)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    values = np.concatenate(parts) if parts else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, typ))


@dataclass
class TokenEmbedCodec:
    """Rows of `token-embed`: id, token_ids, embeddings (list<fixed_size_list<float32>[d]>), kept columns.

    The tokenizer's special ids need the model: `load` sets them once it loads, when there is work.
    """

    opts: TokenOptions
    width: int
    keep_cols: tuple[str, ...] = ()
    special: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    late: bool = False  # a late-interaction model: the runner already kept the model's own rows

    def load(self, runner: Runner) -> None:
        """Take the special ids of the built runner's tokenizer (none for a late-interaction model)."""
        if not self.late:
            self.special = special_ids(runner.model)

    def inputs(self, batch: Any) -> Any:
        """The batch's texts."""
        return located(batch)

    def table(self, batch: Any, result: TokenRows) -> Any:
        """The output rows of a batch."""
        kept = [select_tokens(i, v, self.special, self.opts, t)
                for i, v, t in zip(result.ids, result.values, _templates(result), strict=True)]
        columns: dict[str, Any] = {
            "id": id_column(batch),
            "token_ids": list_column([k[0].astype(np.int32) for k in kept], pa.int32()),
            "embeddings": list_of_vectors([k[1] for k in kept], self.width),
        }
        return pa.table(with_kept(columns, batch, self.keep_cols))

    def empty(self) -> Any:
        """The output of no rows."""
        return self.table(empty_batch(self.keep_cols), TokenRows([], []))


@dataclass(frozen=True)
class LabelColumns:
    """vLLM's step pooling column filter: keep these label columns of the calibrated logits, then the
    activation over the kept columns only (`--returned-token-ids`); identity without columns."""

    columns: tuple[int, ...] | None
    activation: Callable[[torch.Tensor], torch.Tensor] | None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if not self.columns:
            return x
        kept = np.ascontiguousarray(x[:, list(self.columns)])
        if not len(kept) or self.activation is None:
            return kept
        import torch  # loaded with the model already: an activation exists only once it is

        with torch.inference_mode():
            return self.activation(torch.from_numpy(kept)).numpy()


def checked_label_columns(spec: ModelSpec, opts: TokenOptions) -> tuple[int, ...]:
    """`--returned-token-ids` as label columns; UsageError for a label the model does not have."""
    columns = tuple(opts.returned_token_ids or ())
    bad = [j for j in columns if not 0 <= j < spec.num_labels]
    if bad:
        raise UsageError(f"--returned-token-ids {bad}: the model has labels 0..{spec.num_labels - 1}")
    return columns


def label_columns(model: Any, opts: TokenOptions) -> LabelColumns:
    """The `LabelColumns` of `--returned-token-ids` (UsageError for a label the model does not have)."""
    if not opts.returned_token_ids:
        return LabelColumns(None, None)
    columns = checked_label_columns(model.spec, opts)
    from embedcli.pooling import get_activation, resolve_classifier_activation  # torch: with the model

    name = activation(opts.activation)
    if name is None:
        act = resolve_classifier_activation(model.backbone.config, static_num_labels=False)
    else:
        act = get_activation(name, None)
    return LabelColumns(columns, act)


@dataclass
class TokenClassifyCodec:
    """Rows of `token-classify`: id, token_ids, labels, scores, [probs], kept columns.

    The tokenizer's special ids and the label columns' activation need the model: `load` sets them once it
    loads, when there is work.
    """

    opts: TokenOptions
    label_names: np.ndarray
    keep_cols: tuple[str, ...] = ()
    special: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    select: LabelColumns = field(default_factory=lambda: LabelColumns(None, None))

    def load(self, runner: Runner) -> None:
        """Take the special ids and the label columns of the built runner's model."""
        self.special = special_ids(runner.model)
        self.select = label_columns(runner.model, self.opts)

    def inputs(self, batch: Any) -> Any:
        """The batch's texts."""
        return located(batch)

    def table(self, batch: Any, result: TokenRows) -> Any:
        """The output rows of a batch."""
        width = len(self.label_names)
        kept = [select_tokens(i, v, self.special, self.opts, t)
                for i, v, t in zip(result.ids, result.values, _templates(result), strict=True)]
        probs = [self.select(np.asarray(k[1], dtype=np.float32)).reshape(-1, width) for k in kept]
        best = [p.argmax(axis=1) if len(p) else np.zeros(0, dtype=np.int64) for p in probs]
        columns: dict[str, Any] = {
            "id": id_column(batch),
            "token_ids": list_column([k[0].astype(np.int32) for k in kept], pa.int32()),
            "labels": pa.array([self.label_names[b].tolist() for b in best], pa.list_(pa.string())),
            "scores": list_column([p[np.arange(len(p)), b] for p, b in zip(probs, best, strict=True)], pa.float32()),
        }
        if self.opts.all_scores:
            columns["probs"] = list_of_vectors(probs, width)
        return pa.table(with_kept(columns, batch, self.keep_cols))

    def empty(self) -> Any:
        """The output of no rows."""
        return self.table(empty_batch(self.keep_cols), TokenRows([], []))


def token_recipe(task: str, command: str, spec: ModelSpec, choice: ModelChoice, opts: TokenOptions) -> RunnerRecipe:
    """The recipe of a token task's runner: its results carry each row's token ids (`TokenRows`)."""
    if opts.long_inputs == "chunk":
        raise UsageError(f"{command}: --long-inputs chunk applies to embed only; use truncate or error")
    require_task(spec, task, command)
    if opts.returned_token_ids and task != "token_classify":
        raise UsageError(f"{command}: --returned-token-ids selects label columns; it applies to token-classify")
    # Step pooling's row filter (--step-tag-id) runs in the pooler. Its column filter (--returned-token-ids)
    # must select *label* columns, as in vLLM where a reward model's forward already ends in its score head:
    # here the classifier is part of the head, so the columns are selected after it (`LabelColumns`) and
    # the activation runs on the kept columns only.
    # BGE-M3: `--dtype auto` is probed on the dense vector, as for `embed`.
    extra: dict[str, Any] = {"step_tag_id": opts.step_tag_id, "task": "embed" if spec.m3_heads else task}
    if task == "token_classify":
        mean, sigma = calibration(spec, opts.logit_mean, opts.logit_sigma)
        act = "none" if opts.returned_token_ids else activation(opts.activation)
        extra.update(activation=act, logit_mean=mean, logit_sigma=sigma)
    options = RunnerOptions(
        task=task, max_batch_tokens=opts.max_batch_tokens, long_inputs=opts.long_inputs,  # type: ignore[arg-type]  # typer's Literal choices; RunnerOptions takes the same values
        truncation_side=opts.truncation_side, strip=opts.strip,  # type: ignore[arg-type]  # typer's Literal choices; RunnerOptions takes the same values
        normalize=opts.normalize if task == "token_embed" else None, dimensions=opts.dimensions,
        with_token_ids=True, role=token_role(spec, opts) if task == "token_embed" else None,
    )
    return runner_recipe(spec, choice, options, **extra)


def token_embed_computation(
    spec: ModelSpec, choice: ModelChoice, opts: TokenOptions, keep_cols: tuple[str, ...] = ()
) -> Computation:
    """The runner recipe, codec and provenance of `token-embed` on `spec` (usage errors before anything loads)."""
    check_m3_token_embed(spec, opts.dimensions, opts.normalize, opts.step_tag_id)
    if spec.m3_heads:  # FlagEmbedding's colbert vectors keep the final </s> (only <s> is left out)
        opts = replace(opts, keep_special=True)
    recipe = token_recipe("token_embed", "token-embed", spec, choice, opts)
    role = recipe.runner_options.role
    codec = TokenEmbedCodec(opts, recipe.runner_options.dimensions or spec.embedding_size, keep_cols, late=role is not None)
    extra: dict[str, Any] = {"keep_special": opts.keep_special, "step_tag_id": opts.step_tag_id,
                             "returned_token_ids": opts.returned_token_ids, **m3_extra(spec)}
    if role is not None:
        extra["role"] = role  # query and document vectors of one model are different outputs
    return Computation(recipe, codec, extra, codec.load)


def run_token_embed(
    inputs: InputOptions, choice: ModelChoice, opts: TokenOptions, output: OutputOptions, flags: RunFlags | None = None
) -> int:
    """`embedcli token-embed`: per-token vectors of each row (list columns), special tokens dropped unless kept."""
    flags = flags or RunFlags()
    check_target(output.path, flags, inputs.paths, output.stats_file)
    check_head(BatchSource(inputs), flags)  # said before the model loads
    work = token_embed_computation(load_spec(choice), choice, opts, tuple(inputs.keep_cols))
    return run_computation(BatchSource(inputs), work, output, flags)


def token_classify_computation(
    spec: ModelSpec, choice: ModelChoice, opts: TokenOptions, keep_cols: tuple[str, ...] = ()
) -> Computation:
    """The runner recipe, codec and provenance of `token-classify` on `spec` (usage errors before anything loads)."""
    recipe = token_recipe("token_classify", "token-classify", spec, choice, opts)
    names = list(spec.id2label)
    if opts.returned_token_ids:
        names = [names[j] for j in checked_label_columns(spec, opts)]
    codec = TokenClassifyCodec(opts, np.asarray(names, dtype=object), keep_cols)
    model_options = recipe.model_options
    extra = {"activation": opts.activation, "labels": names, "keep_special": opts.keep_special,
             "step_tag_id": opts.step_tag_id, "returned_token_ids": opts.returned_token_ids,
             "all_scores": opts.all_scores, "logit_mean": model_options.logit_mean,
             "logit_sigma": model_options.logit_sigma}
    return Computation(recipe, codec, extra, codec.load)


def run_token_classify(
    inputs: InputOptions, choice: ModelChoice, opts: TokenOptions, output: OutputOptions, flags: RunFlags | None = None
) -> int:
    """`embedcli token-classify`: a label and its score per token (and every label's with `--all-scores`)."""
    flags = flags or RunFlags()
    check_target(output.path, flags, inputs.paths, output.stats_file)
    check_head(BatchSource(inputs), flags)  # said before the model loads
    work = token_classify_computation(load_spec(choice), choice, opts, tuple(inputs.keep_cols))
    return run_computation(BatchSource(inputs), work, output, flags)
