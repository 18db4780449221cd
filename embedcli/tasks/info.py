"""`embedcli info`: what would run for a model (no weights loaded, no torch)."""

from __future__ import annotations

from typing import Any

from embedcli.compute.choice import commands_for
from embedcli.models.checkpoint.st_config import model_choices
from embedcli.models.llm_reranker import RerankerFlags
from embedcli.models.precision import auto_dtype_summary
from embedcli.models.spec import load_model_spec


def model_info(
    model: str | None,
    *,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    reranker: RerankerFlags | None = None,
) -> dict[str, Any]:
    """What would run for `model`: architecture, pooling, heads, max length, prompts, tasks."""
    spec = load_model_spec(model, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, reranker=reranker)
    info = spec.to_dict()
    info["choices"] = dict(model_choices(info))
    info["commands"] = commands_for(spec)
    info["config_hash"] = spec.config_hash()
    info["dtype_auto"] = auto_dtype_summary(spec)
    own = "embedcli's static engine (numpy)" if spec.head == "static" else f"own backbone {spec.backbone}"
    info["runs_on"] = (
        f"{own if spec.own_backbone else 'transformers modules (exact fallback)'}"
        f" [registry entry: {spec.registry_entry or 'none'}]"
    )
    info["runs_on_because"] = spec.backbone_reason
    info["packing_mode"] = "on (one flat token buffer)" if spec.packing else "off (padded batches, transformers' masks)"
    return info
