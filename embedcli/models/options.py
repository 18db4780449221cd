"""How a model is to be loaded: a plain value, importable without torch (tasks plan a run before loading)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from embedcli.errors import UsageError
from embedcli.models.precision import ParityBar

DEVICE_CHOICES: tuple[str, ...] = ("auto", "cpu", "cuda", "cuda:N")
DTYPE_CHOICES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
BACKBONE_CHOICES: tuple[str, ...] = ("auto", "own", "transformers")
_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


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
    m3_outputs: tuple[str, ...] | None = None  # BGE-M3 hybrid_embed: which of dense, sparse, colbert (default all)
    # `auto`: embedcli's own packed backbone where the model type has one (see models/registry.py), else
    # transformers' modules; `own` refuses a model without one; `transformers` forces the old path
    # (tests, bisection). The EMBEDCLI_BACKBONE environment variable sets the default.
    backbone: str = field(default_factory=lambda: os.environ.get("EMBEDCLI_BACKBONE", "auto"))

    def __post_init__(self) -> None:
        check_model_flags(self)


def check_model_flags(options: ModelOptions) -> None:
    """A usage error (exit 2) naming the flag when a device, dtype or backbone value, or `--quantize` with
    them, is one embedcli refuses; decided without torch, before anything loads."""
    if not _DEVICE.fullmatch(options.device):
        raise UsageError(f"--device {options.device!r}: choose one of {', '.join(DEVICE_CHOICES)}")
    if options.dtype not in DTYPE_CHOICES:
        raise UsageError(f"--dtype {options.dtype!r}: choose one of {', '.join(DTYPE_CHOICES)}")
    if options.backbone not in BACKBONE_CHOICES:
        raise UsageError(
            f"EMBEDCLI_BACKBONE {options.backbone!r}: choose one of {', '.join(BACKBONE_CHOICES)}, or unset it"
        )
    if options.quantize and (options.dtype not in ("auto", "float32") or options.device.startswith("cuda")):
        raise UsageError("--quantize (int8 dynamic) runs on the CPU in float32: drop --dtype/--device or --quantize")
