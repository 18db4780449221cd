"""Whether transformers can load a checkpoint the registry leaves to it, decided without importing transformers.

The fallback loads what transformers itself loads: a model type it ships, or, with `--trust-remote-code`,
the checkpoint's own code (`auto_map`). Anything else is refused here in one line, before weights load.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from embedcli.errors import ModelConfigError
from embedcli.models.registry import BackbonePlan


@lru_cache(maxsize=1)
def transformers_model_types() -> frozenset[str] | None:
    """The model types the installed transformers ships (its generated auto mapping), or None if unreadable.

    Read from the data module itself: `import transformers.models.auto` would load torch (~3 s).
    """
    spec = importlib.util.find_spec("transformers")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        path = Path(root) / "models" / "auto" / "auto_mappings.py"
        module_spec = importlib.util.spec_from_file_location("_embedcli_auto_mappings", path)
        if module_spec is None or module_spec.loader is None or not path.is_file():
            continue
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
            return frozenset(module.CONFIG_MAPPING_NAMES)
        except Exception:
            return None
    return None


def code_references(auto_map: Any) -> list[str]:
    """The `module.Class` references of an auto_map (`repo--module.Class` for code in another repository)."""
    refs: list[str] = []
    values = auto_map.values() if isinstance(auto_map, Mapping) else []
    for value in values:
        for ref in value if isinstance(value, list | tuple) else [value]:
            if isinstance(ref, str) and ref:
                refs.append(ref)
    return refs


def _cached_repo(repo: str) -> bool:
    try:
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:
        return False
    return (Path(HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}" / "snapshots").is_dir()


def missing_code(folder: Path, auto_map: Any) -> str | None:
    """Why the checkpoint's own code cannot be had offline, or None when every module it names is at hand."""
    for ref in code_references(auto_map):
        repo, _, module_ref = ref.rpartition("--")
        module = module_ref.rsplit(".", 1)[0]
        if repo:
            if not _cached_repo(repo):
                return (
                    f"its code lives in another repository, {repo} ({module}.py), which is not in the local "
                    f"Hugging Face cache: fetch it first (`embedcli download {repo}`)"
                )
        elif not (folder / f"{module}.py").is_file():
            return f"auto_map names {module}.py, which is not in {folder}"
    return None


def check_loadable(folder: Path, config: Mapping[str, Any], plan: BackbonePlan, trust_remote_code: bool) -> None:
    """Refuse, in one line, a checkpoint that neither an own backbone nor transformers can load as asked."""
    if plan.own:
        return
    where = folder / "config.json"
    model_type = str(config.get("model_type", ""))
    auto_map = config.get("auto_map")
    if auto_map:
        missing = missing_code(folder, auto_map)
        if trust_remote_code:
            if missing:
                raise ModelConfigError(f"{where}: the model runs on its own Python code, but {missing}")
            return
        advice = f"{missing}, then pass --trust-remote-code" if missing else "pass --trust-remote-code if you trust it"
        refs = code_references(auto_map)
        raise ModelConfigError(
            f"{where}: {plan.reason}; only its own Python code ({refs[0] if refs else 'auto_map'}) can run it, and "
            f"embedcli runs a checkpoint's code only when asked: {advice}"
        )
    known = transformers_model_types()
    if known is not None and model_type not in known:
        raise ModelConfigError(
            f"{where}: model_type {model_type!r} is neither in embedcli's registry nor one transformers can load; "
            "pass a model folder of a supported architecture (`embedcli info` lists what runs a folder)"
        )
