"""ModelSpec fields of the two language-model-head families: SPLADE (a sentence-transformers SparseEncoder's
SpladePooling) and causal LMs as yes/no rerankers (a CrossEncoder's LogitScore module, or reranker flags)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embedcli.errors import ConfigRefusedError, ModelConfigError
from embedcli.models.checkpoint.st_config import read_json
from embedcli.models.llm_reranker import PRESETS, RerankerFlags, check_template

# Fields of these heads; left out of the config hash while unset, so every other model keeps its hash.
FAMILY_FIELDS = (
    "score_tokens", "score_token_ids", "pair_template", "instruction", "pair_chat_template", "sparse_pooling",
    "sparse_activation", "sparse_top_k", "late_interaction", "m3_heads",
)


def read_splade(folder: Path, architecture: str, cfg: dict[str, Any], st_cfg: dict[str, Any]) -> dict[str, Any]:
    """SPLADE settings of a sentence-transformers SparseEncoder folder."""
    where = folder / "modules.json"
    if not architecture.endswith("ForMaskedLM"):
        raise ConfigRefusedError(
            f"{where}: SpladePooling needs a masked-LM transformer (…ForMaskedLM); config.json architectures is "
            f"{architecture}"
        )
    pooling = str(cfg.get("pooling_strategy", "max"))
    activation = str(cfg.get("activation_function", "relu"))
    if pooling not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
        raise ConfigRefusedError(
            f"{where}: SpladePooling pooling_strategy {pooling!r} / activation_function {activation!r} is not "
            "supported; embedcli runs max or sum over relu or log1p_relu"
        )
    top_k = st_cfg.get("max_active_dims")
    return {
        "sparse_pooling": pooling,
        "sparse_activation": activation,
        "sparse_top_k": int(top_k) if isinstance(top_k, int) and top_k > 0 else None,
    }


def _vocabulary(folder: Path) -> Any:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ModelConfigError(f"{path}: missing; an LLM reranker's score tokens are looked up in tokenizer.json")
    from tokenizers import Tokenizer  # here: the spec of a model that is not a reranker needs no tokenizer

    return Tokenizer.from_file(str(path))


def read_reranker(
    folder: Path, architecture: str, logit_score: dict[str, Any] | None, flags: RerankerFlags
) -> dict[str, Any]:
    """Score tokens, their ids and the pair template of a causal LM used as a yes/no reranker."""
    if not architecture.endswith("ForCausalLM"):
        raise ConfigRefusedError(
            f"{folder / 'config.json'}: --classifier-from-tokens / --pair-template / --reranker-preset turn a "
            f"causal LM (…ForCausalLM) into a reranker; this model is {architecture}"
        )
    preset = None
    if flags.preset is not None:
        if flags.preset not in PRESETS:
            raise ConfigRefusedError(f"--reranker-preset {flags.preset!r}: choose one of {', '.join(PRESETS)}")
        preset = PRESETS[flags.preset]
    vocab = _vocabulary(folder)
    tokens: tuple[str, ...]
    if flags.classifier_from_tokens:
        tokens = flags.classifier_from_tokens
    elif preset is not None:
        tokens = preset.tokens
    elif logit_score is not None:
        true_id, false_id = logit_score.get("true_token_id"), logit_score.get("false_token_id")
        if not isinstance(true_id, int):
            raise ModelConfigError(f"{folder}: the LogitScore module has no integer true_token_id")
        ids = (true_id,) if false_id is None else (int(false_id), true_id)
        names = tuple(vocab.id_to_token(i) for i in ids)
        if any(n is None for n in names):
            raise ModelConfigError(f"{folder}: LogitScore token ids {list(ids)} are not in tokenizer.json")
        tokens = tuple(str(n) for n in names)
    else:
        raise ConfigRefusedError(
            f"{folder}: a causal LM reranker needs its score tokens: --classifier-from-tokens no,yes "
            "(or --reranker-preset)"
        )
    if len(tokens) not in (1, 2):
        raise ConfigRefusedError(f"--classifier-from-tokens {','.join(tokens)}: give one token or two (false,true)")
    token_ids = []
    for token in tokens:
        token_id = vocab.token_to_id(token)
        if token_id is None:
            raise ConfigRefusedError(f"--classifier-from-tokens: {token!r} is not a token of {folder / 'tokenizer.json'}")
        token_ids.append(int(token_id))
    template = flags.pair_template if flags.pair_template is not None else (preset.template if preset else None)
    chat_kwargs: dict[str, Any] | None = None
    if template is None and logit_score is not None:
        chat_kwargs = _st_chat_pairs(folder)
    if template is not None:
        try:
            check_template(template, "--pair-template")
        except ValueError as e:
            raise ConfigRefusedError(str(e)) from None
    instruction = flags.instruction if flags.instruction is not None else (preset.instruction if preset else None)
    return {
        "score_tokens": tuple(tokens),
        "score_token_ids": tuple(token_ids),
        "pair_template": template,
        "instruction": instruction,
        "pair_chat_template": None if chat_kwargs is None else tuple(sorted(chat_kwargs.items())),
    }


def _st_chat_pairs(folder: Path) -> dict[str, Any] | None:
    """sentence-transformers 6 renders a pair through the tokenizer's chat template (roles query, document)
    when its Transformer config lists the "message" modality; the `apply_chat_template` kwargs it passes
    (its `processing_kwargs.chat_template`, minus the size keys and `restore_suffix`), else None."""
    path = folder / "sentence_bert_config.json"
    cfg = read_json(path) if path.is_file() else {}
    if "message" not in (cfg.get("modality_config") or {}):
        return None  # pairs are a tokenizer text pair, whatever chat template the tokenizer has
    fmt = (cfg["modality_config"]["message"] or {}).get("format", "flat")
    if fmt != "flat":
        raise ConfigRefusedError(f"{path}: modality_config.message.format {fmt!r} is not supported (embedcli renders 'flat' messages)")
    kwargs = dict(((cfg.get("processing_kwargs") or {}).get("chat_template")) or {})
    for key in ("restore_suffix", "padding", "truncation", "max_length", "return_tensors"):
        kwargs.pop(key, None)
    if not all(isinstance(v, (str, int, float, bool)) or v is None for v in kwargs.values()):
        raise ConfigRefusedError(f"{path}: processing_kwargs.chat_template {sorted(kwargs)} must be plain values")
    return kwargs
