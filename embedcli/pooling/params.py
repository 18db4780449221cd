"""Pooling tasks, model-level `PoolerConfig` and request-level `PoolingParams`, with vLLM's validation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from embedcli.errors import PoolingConfigError as PoolingConfigError

PoolingTask = Literal["embed", "classify", "token_embed", "token_classify", "sparse_embed", "hybrid_embed"]
POOLING_TASKS: tuple[PoolingTask, ...] = get_args(PoolingTask)

SeqPoolingType = Literal["CLS", "LAST", "MEAN", "MAX", "MEAN_SQRT_LEN", "WEIGHTEDMEAN"]
TokPoolingType = Literal["ALL", "STEP"]
SEQ_POOLING_TYPES: tuple[str, ...] = get_args(SeqPoolingType)
TOK_POOLING_TYPES: tuple[str, ...] = get_args(TokPoolingType)

# vLLM removed these task names; we reject them with the same pointer to the replacement.
_REMOVED_TASKS = {
    "score": "use 'classify' (cross-encoder) or 'embed' (bi-encoder) instead",
    "encode": "use 'token_embed' or 'token_classify' instead",
}

# Which request parameters each task accepts (vLLM `PoolingParams.valid_parameters`).
_VALID_PARAMS: dict[str, tuple[str, ...]] = {
    "embed": ("dimensions", "use_activation"),
    "token_embed": ("dimensions", "use_activation"),
    "classify": ("use_activation",),
    "token_classify": ("use_activation",),
    # SPLADE (vLLM serves it as `embed` of a vocab-sized vector); here a task of its own with sparse output.
    "sparse_embed": (),
    # BGE-M3: several of dense / sparse / colbert from one forward (vLLM's BgeM3 pooler serves them as
    # `embed&token_classify`); the outputs are fixed by the model, so no request parameter applies.
    "hybrid_embed": (),
}
_STEP_PARAMS = ("step_tag_id", "returned_token_ids")


def check_task(task: str) -> PoolingTask:
    """Return `task` if it is a pooling task, else raise a ValueError naming the valid ones."""
    if task in POOLING_TASKS:
        return task
    if task in _REMOVED_TASKS:
        raise PoolingConfigError(f"Task {task!r} was removed: {_REMOVED_TASKS[task]}")
    raise PoolingConfigError(f"Unsupported task: {task!r}; pooling tasks are {', '.join(POOLING_TASKS)}")


@dataclass(frozen=True)
class PoolerConfig:
    """Model-level pooling configuration: pooling types, defaults for requests, calibration."""

    task: PoolingTask | None = None
    pooling_type: str | None = None
    seq_pooling_type: SeqPoolingType | None = None
    tok_pooling_type: TokPoolingType | None = None
    use_activation: bool | None = None
    dimensions: int | None = None
    logit_mean: float | None = None
    logit_sigma: float | None = None
    step_tag_id: int | None = None
    returned_token_ids: tuple[int, ...] | None = None
    # sentence-transformers `include_prompt`: False drops the prompt's tokens from sequence pooling.
    include_prompt: bool = True

    def __post_init__(self) -> None:
        if self.task is not None:
            check_task(self.task)
        if self.pooling_type is not None:
            if self.seq_pooling_type is not None or self.tok_pooling_type is not None:
                raise PoolingConfigError(
                    "Set either pooling_type or seq_pooling_type/tok_pooling_type, not both"
                )
            kind = self.pooling_type.upper()
            if kind in SEQ_POOLING_TYPES:
                object.__setattr__(self, "seq_pooling_type", kind)
            elif kind in TOK_POOLING_TYPES:
                object.__setattr__(self, "tok_pooling_type", kind)
            else:
                raise NotImplementedError(f"Unsupported pooling type: {self.pooling_type!r}")
            object.__setattr__(self, "pooling_type", None)
        seq_parts = (self.seq_pooling_type or "").split("+")
        if self.seq_pooling_type is not None and any(p not in SEQ_POOLING_TYPES for p in seq_parts):
            raise NotImplementedError(f"Unsupported sequence pooling type: {self.seq_pooling_type!r}")
        if self.tok_pooling_type is not None and self.tok_pooling_type not in TOK_POOLING_TYPES:
            raise NotImplementedError(f"Unsupported token pooling type: {self.tok_pooling_type!r}")
        if self.logit_sigma is not None and self.logit_sigma == 0:
            raise PoolingConfigError("logit_sigma must be non-zero (it divides the logits)")
        if self.dimensions is not None and self.dimensions < 1:
            raise PoolingConfigError(f"dimensions must be >= 1, got {self.dimensions}")
        if self.returned_token_ids is not None:
            object.__setattr__(self, "returned_token_ids", tuple(self.returned_token_ids))


@dataclass(frozen=True)
class EmbeddingShape:
    """What `dimensions` is checked against: the head's output size and the model's Matryoshka support."""

    embedding_size: int
    is_matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] | None = None


@dataclass
class PoolingParams:
    """Per-sequence pooling request: task, activation flag, Matryoshka dims, step filters."""

    task: PoolingTask | None = None
    use_activation: bool | None = None
    dimensions: int | None = None
    step_tag_id: int | None = None
    returned_token_ids: list[int] | None = None
    requires_token_ids: bool = field(default=False, compare=False)

    def verify(
        self,
        task: str,
        pooler_config: PoolerConfig | None = None,
        shape: EmbeddingShape | None = None,
    ) -> PoolingParams:
        """Fill defaults from `pooler_config` and validate for `task` (vLLM `PoolingParams.verify`)."""
        task = check_task(task)
        if self.task is not None and self.task != task:
            raise PoolingConfigError(f"Cannot overwrite task {self.task!r} with {task!r}")
        self.task = task
        config = pooler_config or PoolerConfig()
        valid = _VALID_PARAMS[task]

        # Request values win; model defaults fill what the request left unset.
        for name in valid:
            if getattr(self, name) is None:
                setattr(self, name, getattr(config, name))

        if config.tok_pooling_type != "STEP" or task not in ("token_embed", "token_classify"):
            set_step = [n for n in _STEP_PARAMS if getattr(self, n) is not None]
            if set_step:
                raise PoolingConfigError(
                    f"{', '.join(set_step)} only apply to STEP pooling on token tasks"
                )
        else:
            if self.step_tag_id is None:
                self.step_tag_id = config.step_tag_id
            if self.returned_token_ids is None and config.returned_token_ids is not None:
                self.returned_token_ids = list(config.returned_token_ids)
            self.requires_token_ids = True

        if self.use_activation is None:
            self.use_activation = True

        if self.dimensions is not None:
            if "dimensions" not in valid:
                raise PoolingConfigError(
                    f"Task {task!r} does not take dimensions; it takes {', '.join(valid)}"
                )
            if self.dimensions < 1:
                raise PoolingConfigError(f"dimensions must be >= 1, got {self.dimensions}")
            if shape is not None:
                self._verify_dimensions(shape)
        return self

    def _verify_dimensions(self, shape: EmbeddingShape) -> None:
        d = self.dimensions
        assert d is not None
        # A model that declares no Matryoshka sizes is truncated anyway, as sentence-transformers, TEI and
        # infinity do (vLLM refuses); the caller says on stderr that the model was not trained for it.
        if shape.matryoshka_dimensions and d not in shape.matryoshka_dimensions:
            allowed = ", ".join(map(str, shape.matryoshka_dimensions))
            raise PoolingConfigError(f"dimensions {d} is not one of the model's Matryoshka sizes: {allowed}")
        # vLLM lets d > size through (the slice returns everything); embedcli rejects it like TEI.
        if d > shape.embedding_size:
            raise PoolingConfigError(
                f"dimensions {d} exceeds the embedding size {shape.embedding_size}"
            )
