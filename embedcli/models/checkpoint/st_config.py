"""sentence-transformers module and config files: Pooling modes, CrossEncoder activation, similarity, prompts.

Each reader returns what it found and where (`file: key`), so `embedcli info` can say why a model computes
what it does; anything embedcli would compute differently from sentence-transformers is refused (exit 2).
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedcli.errors import ConfigRefusedError, ModelConfigError

# Module class paths in modules.json: the classic `sentence_transformers.models.*` names, and the ones
# sentence-transformers >= 6 writes when it saves a model (`base.modules.*`, `sentence_transformer.modules.*`).
ST_TYPES: dict[str, tuple[str, ...]] = {
    "dense": (
        "sentence_transformers.models.Dense",
        "sentence_transformers.base.modules.dense.Dense",
        "pylate.models.Dense.Dense",
    ),
    "normalize": ("sentence_transformers.models.Normalize", "sentence_transformers.base.modules.normalize.Normalize"),
    "pooling": (
        "sentence_transformers.models.Pooling",
        "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
    ),
    "transformer": (
        "sentence_transformers.models.Transformer",
        "sentence_transformers.base.modules.transformer.Transformer",
    ),
    # SparseEncoder (SPLADE): a masked-LM transformer (v5 and v6 names; v6 also saves a plain Transformer
    # with transformer_task "fill-mask") followed by SpladePooling.
    "mlm_transformer": (
        "sentence_transformers.sparse_encoder.models.MLMTransformer",
        "sentence_transformers.sparse_encoder.modules.mlm_transformer.MLMTransformer",
    ),
    "splade_pooling": (
        "sentence_transformers.sparse_encoder.models.SpladePooling",
        "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling",
    ),
    # CrossEncoder on a causal LM: the score is logit[true] - logit[false] at the last token.
    "logit_score": ("sentence_transformers.cross_encoder.modules.logit_score.LogitScore",),
    # MultiVectorEncoder (sentence-transformers 6's ColBERT layout): the scoring mask (skiplist) of token vectors.
    "multi_vector_mask": ("sentence_transformers.multi_vector_encoder.modules.multi_vector_mask.MultiVectorMask",),
}
ST_CONFIG = "config_sentence_transformers.json"
# The Transformer module's config (max_seq_length, do_lower_case), under the names sentence-transformers tries in
# this order: early releases named it after the architecture, and their checkpoints still ship so.
SBERT_CONFIGS = tuple(
    f"sentence_{name}_config.json" for name in ("bert", "roberta", "distilbert", "camembert", "albert", "xlm-roberta", "xlnet")
)
# sentence-transformers' Pooling modes; the legacy `pooling_mode_<name>` booleans concatenate in this order.
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
_LEGACY_MODE_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# The embedcli / vLLM-style pooling type of each mode (`ModelSpec.seq_pooling_type`; several joined by "+").
MODE_TYPES = {
    "cls": "CLS",
    "max": "MAX",
    "mean": "MEAN",
    "mean_sqrt_len_tokens": "MEAN_SQRT_LEN",
    "weightedmean": "WEIGHTEDMEAN",
    "lasttoken": "LAST",
}
SIMILARITY_FUNCTIONS = ("cosine", "dot", "euclidean", "manhattan")
_ACTIVATION_PREFIX = "torch.nn.modules."
# The activations sentence-transformers writes (Dense's Tanh, CrossEncoder's Sigmoid / Identity) and their
# common kin: torch.nn module classes since torch 1.x, so a spec naming one is read without importing torch
# (a rerun that finds its output complete never loads it); any other name is checked by importing it.
_KNOWN_ACTIVATIONS = frozenset(
    [
        "torch.nn.modules.linear.Identity",
        *(
            f"torch.nn.modules.activation.{name}"
            for name in ("Tanh", "Sigmoid", "Softmax", "ReLU", "GELU", "SiLU", "LeakyReLU", "ELU", "Softplus")
        ),
    ]
)


def read_json(path: Path) -> Any:
    """A JSON object or list from `path`; invalid JSON is a ModelConfigError naming the file."""
    try:
        with path.open(encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{path}: not valid JSON ({e}); restore the file from the model's source") from e
    if not isinstance(data, (dict, list)):
        raise ModelConfigError(f"{path}: expected a JSON object")
    return data


def sbert_config(folder: Path) -> tuple[str, dict[str, Any]]:
    """The name and contents of the first non-empty Transformer config of `folder` among SBERT_CONFIGS."""
    for name in SBERT_CONFIGS:
        path = folder / name
        data = read_json(path) if path.is_file() else None
        if isinstance(data, dict) and data:
            return name, data
    return "", {}


def read_sbert_config(folder: Path) -> dict[str, Any]:
    """The first non-empty Transformer config of `folder` among SBERT_CONFIGS, as sentence-transformers loads it."""
    return sbert_config(folder)[1]


def sbert_config_name(folder: Path) -> str:
    """The file name of `read_sbert_config`'s config ("" when there is none)."""
    return sbert_config(folder)[0]


# tokenizers writes tokenizer.json's keys in a fixed order, its truncation second: read from the file's head, not
# by parsing a vocabulary of up to tens of megabytes at every model load.
_TOKENIZER_JSON_HEAD = re.compile(r'\A\s*\{\s*"version"\s*:\s*"[^"]*"\s*,\s*"truncation"\s*:\s*')


def _tokenizer_json_truncation(path: Path) -> Any:
    """tokenizer.json's `truncation` value (None when absent)."""
    with path.open("rb") as f:
        head = f.read(4096).decode("utf-8", "ignore")
    match = _TOKENIZER_JSON_HEAD.match(head)
    if match is not None:
        try:
            return json.JSONDecoder().raw_decode(head, match.end())[0]
        except json.JSONDecodeError:
            pass  # a truncation block longer than the head: read the whole file
    data = read_json(path)
    return data.get("truncation") if isinstance(data, dict) else None


def read_truncation_side(folder: Path, name: str, sbert: dict[str, Any]) -> tuple[str, str]:
    """The side the model's tokenizer cuts an over-long input on, and where that was read (`name`, `sbert`: the
    Transformer config, `sbert_config`).

    As sentence-transformers loads the tokenizer: the Transformer config's `tokenizer_args` (`processor_kwargs` in
    sentence-transformers >= 6) are passed to transformers, which takes `truncation_side` from them, else from
    tokenizer_config.json, else from tokenizer.json's truncation block; right when none names one.
    """
    # sentence-transformers renames tokenizer_args to processor_kwargs, the old name replacing the new.
    key = "tokenizer_args" if "tokenizer_args" in sbert else "processor_kwargs"
    kwargs = sbert.get(key)
    candidates: list[tuple[Any, Path, str]] = []
    if isinstance(kwargs, dict) and "truncation_side" in kwargs:
        candidates.append((kwargs["truncation_side"], folder / name, f"{key}.truncation_side"))
    tok_cfg = folder / "tokenizer_config.json"
    config = read_json(tok_cfg) if tok_cfg.is_file() else {}
    if isinstance(config, dict) and config.get("truncation_side") is not None:
        candidates.append((config["truncation_side"], tok_cfg, "truncation_side"))
    tok_json = folder / "tokenizer.json"
    if not candidates and tok_json.is_file():
        truncation = _tokenizer_json_truncation(tok_json)
        if isinstance(truncation, dict) and truncation.get("direction") is not None:
            direction = truncation["direction"]
            candidates.append((direction.lower() if isinstance(direction, str) else direction, tok_json,
                               "truncation.direction"))
    if not candidates:
        return "right", "default (right: the tokenizer names no side)"
    side, path, where = candidates[0]
    if side not in ("right", "left"):
        raise ModelConfigError(f"{path}: {where} is {side!r}, not 'right' or 'left'; fix the file")
    return side, f"{path.name}: {where}"


def _rel(path: Path, folder: Path) -> str:
    try:
        return str(path.relative_to(folder))
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class PoolingChoice:
    """sentence-transformers Pooling modes (concatenated in order), prompt handling, and where they came from."""

    modes: tuple[str, ...]
    include_prompt: bool
    source: str


def read_pooling(path: Path, folder: Path) -> PoolingChoice:
    """The modes and include_prompt of a Pooling module's config.json, as sentence-transformers 5/6 read it."""
    cfg = read_json(path)
    where = _rel(path, folder)
    raw = cfg.get("pooling_mode")
    if raw is not None:
        modes = (raw,) if isinstance(raw, str) else tuple(raw) if isinstance(raw, list) else None
        key = "pooling_mode"
    else:
        # sentence-transformers: the true legacy booleans in their fixed order; none true (or none) → mean.
        modes = tuple(m for k, m in _LEGACY_MODE_KEYS.items() if cfg.get(k) is True) or ("mean",)
        key = "pooling_mode_*"
    if not modes or any(not isinstance(m, str) or m not in POOLING_MODES for m in modes):
        found = json.dumps(raw) if raw is not None else str(list(modes or ()))
        raise ConfigRefusedError(
            f"{path}: {key} {found} is not a sentence-transformers pooling mode; modes are {', '.join(POOLING_MODES)}"
        )
    include = cfg.get("include_prompt", True)
    if not isinstance(include, bool):
        raise ConfigRefusedError(f"{path}: include_prompt must be true or false, not {include!r}")
    return PoolingChoice(tuple(modes), include, f"{where}: {key}")


_SENTENCE = "sentence_embedding"


def check_module_chain(folder: Path, modules: Sequence[dict[str, Any]], types: Sequence[str]) -> None:
    """Refuse a pooled stack embedcli would run in another order than sentence-transformers: embedcli pools, then
    projects with every Dense, then normalizes, so each Dense must follow the Pooling and read and write the
    sentence embedding, and nothing but a Normalize may follow a Normalize."""
    path = folder / "modules.json"
    kinds = [next((k for k in ("pooling", "dense", "normalize") if t in ST_TYPES[k]), "") for t in types]
    if "pooling" not in kinds:
        return  # no pooled stack: late-interaction and sparse layouts are read by their own rules
    first_pooling, normalized = kinds.index("pooling"), False
    for i, (module, kind) in enumerate(zip(modules, kinds, strict=True)):
        name = types[i].rpartition(".")[2]
        if normalized and kind != "normalize":
            raise ConfigRefusedError(
                f"{path}: {name} ({module.get('path')!r}) follows Normalize; embedcli normalizes the embedding last, "
                "so a module after Normalize is not supported"
            )
        normalized = normalized or kind == "normalize"
        if kind == "dense" and i < first_pooling:
            raise ConfigRefusedError(
                f"{path}: Dense ({module.get('path')!r}) before Pooling projects each token; embedcli projects the "
                "pooled embedding only, so a token-level Dense is not supported"
            )
        cfg_path = folder / str(module.get("path", "")) / "config.json"
        if kind in ("dense", "normalize") and cfg_path.is_file():
            cfg = read_json(cfg_path)
            for key in ("module_input_name", "module_output_name"):
                if cfg.get(key, _SENTENCE) != _SENTENCE:
                    raise ConfigRefusedError(
                        f"{cfg_path}: {key} {cfg[key]!r} is not supported; embedcli's {name} reads and writes "
                        f"{_SENTENCE!r}"
                    )


def check_activation(name: object, path: Path, key: str) -> str:
    """`name` if it is an importable `torch.nn.modules.*` module class, else a refusal naming file and key."""
    if not isinstance(name, str) or not name.startswith(_ACTIVATION_PREFIX):
        raise ConfigRefusedError(
            f"{path}: {key} {name!r} is refused: only torch.nn.modules.* activation classes are loaded"
        )
    if name in _KNOWN_ACTIVATIONS:
        return name
    from torch import nn  # here: `info` and the run plan read this module without torch

    module_name, _, class_name = name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name, None)
    except ImportError:
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ConfigRefusedError(f"{path}: {key} {name!r} is not a torch.nn module class")
    return name


@dataclass(frozen=True)
class ClassifierActivation:
    """The activation a sequence classifier's logits get: an import path under sentence-transformers' rules,
    or None for vLLM's rule (problem_type, then config.json's activation_fn, then sigmoid / softmax)."""

    path: str | None
    source: str


def read_classifier_activation(folder: Path, config: dict[str, Any], st_cfg: dict[str, Any], num_labels: int) -> ClassifierActivation:
    """Which activation `CrossEncoder.predict` applies to this folder's logits, and where that is said."""
    st_path = folder / ST_CONFIG
    ce_block = config.get("sentence_transformers") or {}
    if "activation_fn" in st_cfg:
        return ClassifierActivation(check_activation(st_cfg["activation_fn"], st_path, "activation_fn"), f"{ST_CONFIG}: activation_fn")
    for key, value in (
        ("sentence_transformers.activation_fn", ce_block.get("activation_fn")),
        ("sbert_ce_default_activation_function", config.get("sbert_ce_default_activation_function")),
    ):
        if value:
            check_activation(value, folder / "config.json", key)
            if st_cfg.get("model_type") == "CrossEncoder":
                return ClassifierActivation(str(value), f"config.json: {key}")
    if st_cfg.get("model_type") == "CrossEncoder":
        # sentence-transformers' CrossEncoder default: Sigmoid for one label, Identity (raw logits) for more.
        name = "torch.nn.modules.activation.Sigmoid" if num_labels == 1 else "torch.nn.modules.linear.Identity"
        return ClassifierActivation(name, f"{ST_CONFIG}: model_type CrossEncoder default (num_labels={num_labels})")
    if config.get("problem_type"):
        return ClassifierActivation(None, "config.json: problem_type")
    if ce_block.get("activation_fn"):
        return ClassifierActivation(None, "config.json: sentence_transformers.activation_fn")
    if config.get("sbert_ce_default_activation_function"):
        return ClassifierActivation(None, "config.json: sbert_ce_default_activation_function")
    return ClassifierActivation(None, "vLLM default (sigmoid for one label, softmax for more)")


def read_truncate_dim(folder: Path, st_cfg: dict[str, Any], dim: int) -> int | None:
    """The default Matryoshka size sentence-transformers' `encode` keeps (`truncate_dim`), None when unset."""
    truncate_dim = st_cfg.get("truncate_dim")
    if truncate_dim is not None and (
        isinstance(truncate_dim, bool) or not isinstance(truncate_dim, int) or not 0 < truncate_dim <= dim
    ):
        raise ConfigRefusedError(f"{folder / ST_CONFIG}: truncate_dim {truncate_dim!r} must be an integer in 1..{dim}")
    return truncate_dim


def read_similarity(folder: Path, st_cfg: dict[str, Any]) -> tuple[str, str]:
    """The bi-encoder similarity (`model.similarity`) and its source; cosine when the file names none."""
    name = st_cfg.get("similarity_fn_name")
    if name is None:
        return "cosine", "default (cosine)"
    if name not in SIMILARITY_FUNCTIONS:
        raise ConfigRefusedError(
            f"{folder / ST_CONFIG}: similarity_fn_name {name!r} is not one of {', '.join(SIMILARITY_FUNCTIONS)}"
        )
    return str(name), f"{ST_CONFIG}: similarity_fn_name"


def refuse_modular_cross_encoder(folder: Path, st_cfg: dict[str, Any], module_types: Sequence[str], head: str) -> None:
    """A CrossEncoder built from modules (Transformer + Pooling + Dense) is refused: scored as a bi-encoder it
    would give the cosine of its 1-d outputs, not `CrossEncoder.predict`'s scores. A causal LM with a LogitScore
    module (head "lm_score") is read whole."""
    if st_cfg.get("model_type") != "CrossEncoder" or head == "lm_score":
        return
    extra = [t.rpartition(".")[2] for t in module_types if t not in ST_TYPES["transformer"]]
    if extra or head != "sequence_classification":
        raise ConfigRefusedError(
            f"{folder / ST_CONFIG}: model_type 'CrossEncoder' with modules [{', '.join(extra) or 'Transformer'}] "
            "on a model without a sequence-classification head is not supported; embedcli scores CrossEncoders "
            "saved as *ForSequenceClassification only"
        )


def prompt_token_count(tokenizer: Any, special_ids: Sequence[int], prompt: str) -> int:
    """Tokens of `prompt` alone (special tokens included, a trailing special token not), as sentence-transformers
    measures the prompt that `include_prompt=false` leaves out of pooling."""
    if not prompt:
        return 0
    ids = tokenizer.encode(prompt).ids
    if ids and ids[-1] in set(special_ids):
        return len(ids) - 1
    return len(ids)


def _classifier_activation_name(info: dict[str, Any]) -> str:
    path = info.get("ce_activation") or info.get("st_activation")
    problem = info.get("problem_type")
    if info.get("ce_activation") or (path and not problem):
        return str(path).rpartition(".")[2]
    rule = {"regression": "none", "multi_label_classification": "sigmoid per label"}
    if problem in rule:
        return rule[problem]
    return "sigmoid" if info.get("num_labels") == 1 else "softmax"


def model_choices(info: dict[str, Any]) -> list[tuple[str, str]]:
    """`embedcli info` rows: pooling, prompt handling, activation, similarity, each with its source."""
    if info.get("head") == "static":
        limit = info.get("static_max_tokens")
        rule = ("model2vec: no special tokens, the unknown token dropped" if info.get("static_layout") == "model2vec"
                else "StaticEmbedding: no special tokens, unknown tokens kept")
        cut = f"first {limit} tokens" if limit else "every token (no limit)"
        if limit and info.get("static_layout") == "model2vec":
            cut += " (the text first cut to max_length x the median token length in characters, as model2vec)"
        return [
            ("pooling", f"mean of token rows, {rule} ({info['pooling_source']})"),
            ("long texts", cut),
            ("normalize", f"{'yes' if info['normalize'] else 'no'} ({info['activation_source']})"),
            ("dimensions", f"{info['truncate_dim']} by default (config_sentence_transformers.json: truncate_dim)"
             if info.get("truncate_dim") else f"{info['embedding_size']} (--dimensions N keeps the first N)"),
            ("similarity", f"{info['similarity_fn_name']} ({info['similarity_source']})"),
        ]
    side = ("truncation side", f"{info['truncation_side']} ({info['truncation_side_source']}; --truncation-side overrides)")
    if info.get("head") == "sparse":
        return [
            ("pooling", f"SPLADE {info['sparse_pooling']} of {info['sparse_activation']} (modules.json: SpladePooling)"),
            ("similarity", f"{info['similarity_fn_name']} ({info['similarity_source']})"),
            side,
        ]
    if info.get("late_interaction_head"):
        return [
            ("pooling", "none: one vector per token (late interaction)"),
            ("late_interaction", str(info["late_interaction_head"])),
            ("similarity", f"{info['similarity_fn_name']} ({info['similarity_source']})"),
            side,
        ]
    rows: list[tuple[str, str]] = [
        ("pooling", f"{' + '.join(info['pooling_modes'])} ({info['pooling_source']})"), side,
    ]
    if info.get("head") == "lm_score":  # its activation is the score formula, shown on its own row
        return rows
    if info.get("head") == "base":
        prompt = "included in pooling" if info["include_prompt"] else "excluded from pooling (include_prompt=false)"
        rows.append(("prompt tokens", f"{prompt} ({info['pooling_source'].split(':')[0]})"))
        rows.append(("similarity", f"{info['similarity_fn_name']} ({info['similarity_source']})"))
        if info.get("truncate_dim"):
            rows.append(("dimensions", f"{info['truncate_dim']} by default ({ST_CONFIG}: truncate_dim)"))
    else:
        rows.append(("activation", f"{_classifier_activation_name(info)} ({info['activation_source']})"))
    return rows


# First modules of sentence-transformers folders that hold no transformer: what each is, and what embedcli does.
# (A StaticEmbedding is read by `embedcli.models.checkpoint.static_layout` before this check.)
_NON_TRANSFORMER_MODULES = {
    "CLIPModel": "a CLIP image-and-text model; image models (CLIP, SigLIP) are not supported",
    "WordEmbeddings": "classic word embeddings (GloVe-style)",
    "BoW": "a bag-of-words model",
}


def refuse_non_transformer(folder: Path) -> None:
    """Refuse a sentence-transformers folder whose first module is not a Transformer (naming the module type), or
    is one kept in a subfolder (else the missing config.json would read as a broken download)."""
    path = folder / "modules.json"
    try:
        modules = read_json(path) if path.is_file() else None
    except ModelConfigError:
        return
    if not isinstance(modules, list) or not modules or not isinstance(modules[0], dict):
        return
    kind = str(modules[0].get("type", ""))
    known = ST_TYPES["transformer"] + ST_TYPES["mlm_transformer"]
    sub = str(modules[0].get("path", "")).strip("./")
    if kind in known and sub:
        raise ConfigRefusedError(
            f"{path}: the Transformer module lives in its own folder {sub!r} (an early sentence-transformers layout); "
            "embedcli reads the transformer from the model folder itself, so this layout is not supported"
        )
    if not kind or kind in known:
        return
    name = kind.rpartition(".")[2]
    what = _NON_TRANSFORMER_MODULES.get(name, "not a transformer")
    raise ConfigRefusedError(
        f"{path}: the first module is {kind} ({what}); embedcli runs sentence-transformers models whose first "
        "module is a Transformer or a StaticEmbedding, so this model is not supported"
    )
