"""Static embedding folders (a token table, a tokenizer, a mean of rows): which layout, and the spec fields it sets.

Two real layouts:

- **model2vec** (minishlab/potion-base-8M): `config.json` with model2vec keys (`normalize`, `max_length`,
  `hidden_dim`, `apply_pca`, `model_type: model2vec`), `model.safetensors` with `embeddings` (and, after
  vocabulary quantization, `mapping` and per-token `weights`), `tokenizer.json`; model2vec >= 0.3 also writes a
  `modules.json` naming a StaticEmbedding at `.`. model2vec's `StaticModel.encode` is the reference: tokens
  without special tokens, the unknown token dropped, the text first cut to `max_length x median token length`
  characters then to `max_length` tokens, the mean of rows, then `normalize` from config.json.
- **sentence-transformers StaticEmbedding** (sentence-transformers/static-retrieval-mrl-en-v1): `modules.json`
  whose first module is a StaticEmbedding (its folder: `model.safetensors` with `embedding.weight`,
  `tokenizer.json`), then Normalize or nothing; prompts and `truncate_dim` in config_sentence_transformers.json.
  `StaticEmbedding` is the reference: tokens without special tokens (unknown ones kept), no truncation unless
  tokenizer.json sets it, an EmbeddingBag mean.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from embedcli.errors import ConfigRefusedError, ModelConfigError
from embedcli.models.checkpoint.st_config import ST_CONFIG, ST_TYPES, read_json, read_truncate_dim

STATIC_EMBEDDING_TYPES = (
    "sentence_transformers.models.StaticEmbedding",
    "sentence_transformers.models.StaticEmbedding.StaticEmbedding",
    "sentence_transformers.sentence_transformer.modules.static_embedding.StaticEmbedding",
    "sentence_transformers.sentence_transformer.modules.StaticEmbedding",
)
MODEL2VEC = "model2vec"
ST_STATIC = "sentence-transformers"
# Table tensor names: sentence-transformers' EmbeddingBag state, model2vec's arrays.
ST_TABLE = "embedding.weight"
M2V_TABLE, M2V_MAPPING, M2V_WEIGHTS = "embeddings", "mapping", "weights"
M2V_DEFAULT_MAX_LENGTH = 512  # model2vec.model.DEFAULT_MAX_LENGTH, when config.json names none
# The spec fields only static models set (left out of other models' config hashes while unset).
STATIC_FIELDS = ("static_layout", "static_folder", "static_max_tokens", "truncate_dim")


def safetensors_keys(path: Path) -> dict[str, Any]:
    """The tensor entries (name -> dtype, shape, offsets) of a safetensors file's header."""
    try:
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError, UnicodeDecodeError) as e:
        raise ModelConfigError(f"{path}: cannot read its safetensors header ({e}); fetch the model again") from e
    if not isinstance(header, dict):
        raise ModelConfigError(f"{path}: the safetensors header is not a JSON object; fetch the model again")
    return {k: v for k, v in header.items() if k != "__metadata__"}


def _modules(folder: Path) -> list[dict[str, Any]] | None:
    path = folder / "modules.json"
    if not path.is_file():
        return None
    data = read_json(path)
    return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else None


def _is_model2vec_config(config: dict[str, Any], folder: Path) -> bool:
    """Whether config.json is model2vec's: it says so, or it is no transformers config and the root table is
    model2vec's `embeddings` (what `StaticModel.save_pretrained` writes without a model_type)."""
    if config.get("model_type") == MODEL2VEC or "StaticModel" in (config.get("architectures") or []):
        return True
    table = folder / "model.safetensors"
    return "model_type" not in config and table.is_file() and M2V_TABLE in safetensors_keys(table)


def _table_shape(path: Path, names: tuple[str, ...]) -> tuple[str, list[int]]:
    if not path.is_file():
        raise ModelConfigError(f"{path}: missing; the static embedding table cannot be loaded")
    keys = safetensors_keys(path)
    for name in names:
        if name in keys:
            shape = keys[name].get("shape") or []
            if len(shape) != 2:
                raise ModelConfigError(f"{path}: {name} has shape {shape}, not [vocab, dim]")
            return name, [int(s) for s in shape]
    raise ModelConfigError(f"{path}: no {' or '.join(names)} tensor; is this a static embedding table?")


def _tokenizer_truncation(path: Path) -> int | None:
    """tokenizer.json's own truncation length (sentence-transformers keeps it), None when it has none."""
    data = read_json(path)
    trunc = data.get("truncation") if isinstance(data, dict) else None
    return int(trunc["max_length"]) if isinstance(trunc, dict) and trunc.get("max_length") else None


def _check_tail(folder: Path, modules: list[dict[str, Any]]) -> bool:
    """Modules after the StaticEmbedding: Normalize (True) or nothing (False); anything else is refused."""
    types = [str(m.get("type", "")) for m in modules[1:]]
    extra = [t for t in types if t not in ST_TYPES["normalize"]]
    if extra:
        raise ConfigRefusedError(
            f"{folder / 'modules.json'}: a StaticEmbedding followed by {', '.join(t.rpartition('.')[2] for t in extra)} "
            "is not supported; embedcli runs static models as StaticEmbedding [+ Normalize]"
        )
    return bool(types)


def _m2v_fields(folder: Path, config: dict[str, Any], requested: int | None) -> dict[str, Any]:
    where = folder / "model.safetensors"
    _, (_, dim) = _table_shape(where, (M2V_TABLE,))
    if not (folder / "tokenizer.json").is_file():
        raise ModelConfigError(f"{folder / 'tokenizer.json'}: missing; a model2vec folder holds its tokenizer there")
    max_length = config.get("max_length", M2V_DEFAULT_MAX_LENGTH)
    if max_length is not None and (not isinstance(max_length, int) or max_length < 1):
        raise ConfigRefusedError(f"{folder / 'config.json'}: max_length {max_length!r} must be a positive integer or null")
    normalize = config.get("normalize", False)
    return {
        "architecture": "StaticModel",
        "static_layout": MODEL2VEC,
        "static_folder": ".",
        "static_max_tokens": requested if requested is not None else max_length,
        "normalize": bool(normalize),
        "hidden_size": dim,
        "weights": ("model.safetensors",),
        "is_matryoshka": bool(config.get("apply_pca")),  # PCA orders the dims by variance: a prefix is meaningful
        "pooling_source": "model2vec StaticModel.encode: mean of token rows (config.json)",
        "activation_source": "config.json: normalize" if "normalize" in config else "model2vec default (normalize false)",
    }


def _st_fields(folder: Path, modules: list[dict[str, Any]], requested: int | None) -> dict[str, Any]:
    rel = str(modules[0].get("path", "")) or "."
    sub = (folder / rel).resolve()
    if Path(rel).is_absolute() or not sub.is_relative_to(folder.resolve()):
        raise ConfigRefusedError(f"{folder / 'modules.json'}: StaticEmbedding path {rel!r} lies outside the model folder")
    table = sub / "model.safetensors"
    _, (_, dim) = _table_shape(table, (ST_TABLE, M2V_TABLE))  # model2vec arrays: folded at load, as StaticEmbedding.load
    tok = sub / "tokenizer.json"
    if not tok.is_file():
        raise ModelConfigError(f"{tok}: missing; a StaticEmbedding module holds its tokenizer there")
    normalize = _check_tail(folder, modules)
    st_cfg = read_json(folder / ST_CONFIG) if (folder / ST_CONFIG).is_file() else {}
    truncate_dim = read_truncate_dim(folder, st_cfg, dim)
    prefix = "" if rel == "." else rel.rstrip("/") + "/"
    return {
        "architecture": "StaticEmbedding",
        "static_layout": ST_STATIC,
        "static_folder": rel,
        "static_max_tokens": requested if requested is not None else _tokenizer_truncation(tok),
        "normalize": normalize,
        "hidden_size": dim,
        "weights": (prefix + "model.safetensors",),
        "truncate_dim": truncate_dim,
        "is_matryoshka": truncate_dim is not None,
        "pooling_source": "modules.json: StaticEmbedding (EmbeddingBag mean of token rows)",
        "activation_source": "modules.json: Normalize" if normalize else "modules.json: no Normalize",
    }


def _check_max_length(requested: int | None) -> None:
    # a transformer model's own check names its range; a static table has no upper bound
    if requested is not None and requested < 1:
        raise ConfigRefusedError(f"--max-length {requested}: must be at least 1")


def read_static(folder: Path, requested_max_length: int | None = None) -> dict[str, Any] | None:
    """The static-model fields of `folder` (see the module docstring), or None when it is not a static model."""
    config_path = folder / "config.json"
    config = read_json(config_path) if config_path.is_file() else None
    if isinstance(config, dict) and _is_model2vec_config(config, folder):
        _check_max_length(requested_max_length)
        return _m2v_fields(folder, config, requested_max_length)
    modules = _modules(folder)
    if modules and str(modules[0].get("type", "")) in STATIC_EMBEDDING_TYPES:
        _check_max_length(requested_max_length)
        return _st_fields(folder, modules, requested_max_length)
    return None
