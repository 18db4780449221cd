"""How a model is to be loaded: a plain value, importable without torch (tasks plan a run before loading)."""

from __future__ import annotations

from dataclasses import dataclass

from embedcli.models.precision import ParityBar


@dataclass
class ModelOptions:
    """User choices that change how a model is loaded or pooled."""

    device: str = "auto"
    dtype: str = "auto"
    allow_pickle: bool = False
    trust_remote_code: bool = False
    activation: str | None = None  # classify: override the config's activation
    logit_mean: float | None = None
    logit_sigma: float | None = None
    step_tag_id: int | None = None
    returned_token_ids: tuple[int, ...] | None = None
    quantize: bool = False  # int8 dynamic quantization of the backbone's Linear layers (CPU, opt-in)
    task: str | None = None  # the pooling task `auto` is probed on (default: the head's own task)
    parity_bar: ParityBar | None = None  # `auto`'s bar (default: `ParityBar()`)
