"""How a model is to be loaded: a plain value, importable without torch (tasks plan a run before loading)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

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
    sparse_top_k: int | None = None  # SPLADE: keep each vector's k largest entries (default: the model's)
    # `auto`: embedcli's own packed backbone where the model type has one (see models/backbones.py), else
    # transformers' modules; `own` refuses a model without one; `transformers` forces the old path
    # (tests, bisection). The EMBEDCLI_BACKBONE environment variable sets the default.
    backbone: str = field(default_factory=lambda: os.environ.get("EMBEDCLI_BACKBONE", "auto"))
