"""Read a model folder (HF config + sentence-transformers layout) into one resolved, hashable `ModelSpec`."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from embedcli.models.llm_reranker import PRESETS, RerankerFlags, check_template
from embedcli.models.resolve import DEFAULT_MODEL, resolve_model_path

DECODER_TYPES = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "olmo", "olmo2"}
)
ENCODER_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "camembert", "electra"})
# Encoders whose position ids start after the padding index (fairseq style).
POSITION_OFFSET_TYPES = frozenset({"roberta", "xlm-roberta", "camembert", "mpnet"})

# Module class paths in modules.json: the classic `sentence_transformers.models.*` names, and the ones
# sentence-transformers >= 6 writes when it saves a model (`base.modules.*`, `sentence_transformer.modules.*`).
_ST_TYPES = {
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
}


_FAMILY_FIELDS = (
    "score_tokens", "score_token_ids", "pair_template", "instruction", "pair_chat_template", "sparse_pooling",
    "sparse_activation", "sparse_top_k",
)


class ModelConfigError(ValueError):
    """A model folder embedcli cannot serve, with the file at fault and the fix."""


@dataclass(frozen=True)
class DenseSpec:
    """One sentence-transformers Dense module: `Linear(in, out, bias)` then an activation."""

    path: str
    in_features: int
    out_features: int
    bias: bool
    activation: str


@dataclass(frozen=True)
class ModelSpec:
    """Everything that decides what a model computes, resolved once from its folder."""

    name: str
    path: str
    architecture: str
    model_type: str
    head: str  # "base" | "sequence_classification" | "token_classification" | "lm_score" | "sparse"
    is_decoder: bool
    hidden_size: int
    max_length: int
    do_lower_case: bool
    seq_pooling_type: str
    normalize: bool
    projector: tuple[DenseSpec, ...] = ()
    embedding_size: int = 0
    is_matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] | None = None
    prompts: tuple[tuple[str, str], ...] = ()
    default_prompt_name: str | None = None
    similarity_fn_name: str = "cosine"
    num_labels: int = 0
    id2label: tuple[str, ...] = ()
    problem_type: str | None = None
    st_activation: str | None = None
    sentence_transformers_layout: bool = False
    weights: tuple[str, ...] = ()
    # LLM reranker (head "lm_score"): the scoring tokens (false, true) or (token,), their ids, the pair
    # template ({query}/{document}/{instruction}; None: the tokenizer's text pair) and its instruction.
    score_tokens: tuple[str, ...] = ()
    score_token_ids: tuple[int, ...] = ()
    pair_template: str | None = None
    instruction: str | None = None
    # (sentence-transformers 6 "message" modality): pairs rendered by the tokenizer's chat template with these
    # apply_chat_template kwargs; None: not a chat-template reranker.
    pair_chat_template: tuple[tuple[str, Any], ...] | None = None
    # SPLADE (head "sparse"): max or sum over tokens, relu or log1p_relu, default top-k (ST max_active_dims).
    sparse_pooling: str | None = None
    sparse_activation: str | None = None
    sparse_top_k: int | None = None
    content_hash: str = field(default="", compare=False)

    @property
    def tasks(self) -> tuple[str, ...]:
        """The pooling tasks this model can serve."""
        if self.head == "sequence_classification":
            return ("classify",)
        if self.head == "token_classification":
            return ("token_classify",)
        if self.head == "lm_score":
            return ("classify",)
        if self.head == "sparse":
            return ("sparse_embed",)
        return ("embed", "token_embed")

    @property
    def score_type(self) -> str | None:
        """How pairs are scored: cross-encoder, bi-encoder cosine or late interaction (vLLM score types)."""
        if self.head == "sequence_classification":
            return "cross-encoder" if self.num_labels == 1 else None
        if self.head == "lm_score":
            return "cross-encoder"
        if self.head == "sparse":
            return "sparse"
        if self.head == "base":
            return "bi-encoder"
        return None

    def prompt(self, name: str) -> str:
        """The prompt text registered under `name`, or a ValueError listing the names there are."""
        table = dict(self.prompts)
        if name not in table:
            known = ", ".join(table) or "none"
            raise ModelConfigError(f"Prompt name {name!r} is not in the model's prompts ({known})")
        return table[name]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view, with the supported tasks."""
        data = asdict(self)
        data["tasks"] = list(self.tasks)
        data["score_type"] = self.score_type
        if self.head == "lm_score":
            from embedcli.models.llm_reranker import score_formula

            data["score_formula"] = score_formula(self.score_tokens)
            if self.pair_template is not None:
                data["pair_format"] = f"template {self.pair_template!r}"
            elif self.pair_chat_template is not None:
                data["pair_format"] = (
                    "the tokenizer's chat template, messages [query, document] "
                    f"(apply_chat_template kwargs {dict(self.pair_chat_template)})"
                )
            else:
                data["pair_format"] = "the tokenizer's text pair (a decoder: query tokens then document tokens)"
        if self.head == "sparse":
            data["sparse_head"] = (
                f"masked-LM logits -> {'log1p(log1p(relu(x)))' if self.sparse_activation == 'log1p_relu' else 'log1p(relu(x))'}"
                f" -> {self.sparse_pooling} over tokens -> {self.embedding_size}-dim sparse vector"
                + (f", top {self.sparse_top_k}" if self.sparse_top_k else "")
            )
        return data

    def config_hash(self) -> str:
        """A short hash of everything that changes the numbers this model produces."""
        data = self.to_dict()
        for volatile in ("name", "path"):
            data.pop(volatile)
        # Fields of the LLM-reranker and SPLADE heads are left out while unset, so every other model keeps
        # the hash (and its outputs stay resumable and --incremental) across this addition.
        for key in _FAMILY_FIELDS:
            if data.get(key) in (None, (), []):
                data.pop(key, None)
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with path.open(encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{path}: not valid JSON ({e}); restore the file from the model's source") from e
    if not isinstance(data, (dict, list)):
        raise ModelConfigError(f"{path}: expected a JSON object")
    return data  # type: ignore[return-value]


def _st_pooling_type(path: Path) -> str:
    """The single pooling mode of a sentence-transformers Pooling config; anything else is rejected."""
    cfg = _read_json(path)
    if "pooling_mode" in cfg and isinstance(cfg["pooling_mode"], str):
        modes = [cfg["pooling_mode"]]
    else:
        modes = [k.removeprefix("pooling_mode_") for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
    mapping = {"cls_token": "CLS", "cls": "CLS", "mean_tokens": "MEAN", "mean": "MEAN", "lasttoken": "LAST"}
    if len(modes) != 1 or modes[0] not in mapping:
        found = ", ".join(modes) or "none"
        raise ModelConfigError(
            f"{path}: pooling modes [{found}] are not supported; embedcli implements exactly one of "
            "cls_token, mean_tokens, lasttoken (vLLM would silently fall back; we refuse instead). "
            "Edit the file to one supported mode if that is what you want."
        )
    if cfg.get("include_prompt") is False:
        raise ModelConfigError(
            f"{path}: include_prompt=false (excluding prompt tokens from pooling) is not supported"
        )
    return mapping[modes[0]]


def _dense_spec(folder: Path, rel: str) -> DenseSpec:
    cfg_path = folder / rel / "config.json"
    if not cfg_path.is_file():
        raise ModelConfigError(f"{cfg_path}: missing; the Dense module {rel!r} in modules.json cannot be loaded")
    cfg = _read_json(cfg_path)
    if cfg.get("use_residual"):
        # sentence-transformers >= 6: output = activation(linear(x)) + x (or a projected x); not implemented.
        raise ModelConfigError(f"{cfg_path}: use_residual=true (a residual Dense) is not supported")
    try:
        return DenseSpec(
            path=rel,
            in_features=int(cfg["in_features"]),
            out_features=int(cfg["out_features"]),
            bias=bool(cfg.get("bias", True)),
            activation=str(cfg.get("activation_function", "torch.nn.modules.activation.Tanh")),
        )
    except KeyError as e:
        raise ModelConfigError(f"{cfg_path}: missing key {e}") from e


def _head_kind(architecture: str) -> str:
    if architecture.endswith("ForSequenceClassification"):
        return "sequence_classification"
    if architecture.endswith("ForTokenClassification"):
        return "token_classification"
    return "base"


def _weights(folder: Path, allow_pickle: bool) -> tuple[str, ...]:
    safetensors = sorted(p.name for p in folder.glob("*.safetensors"))
    if safetensors:
        return tuple(safetensors)
    pickled = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
    if pickled:
        if not allow_pickle:
            raise ModelConfigError(
                f"{folder}: only pickle weights ({', '.join(pickled)}) were found; loading pickle can run "
                "arbitrary code. Convert them to safetensors, or pass --allow-pickle if you trust the source."
            )
        return tuple(pickled)
    raise ModelConfigError(f"{folder}: no weights (model.safetensors) found; the model folder is incomplete")


def _hash_files(folder: Path, names: list[str]) -> str:
    digest = hashlib.sha256()
    for name in names:
        path = folder / name
        if not path.is_file():
            continue
        digest.update(name.encode())
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def load_model_spec(
    model: str | None,
    *,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    max_length: int | None = None,
    reranker: RerankerFlags | None = None,
) -> ModelSpec:
    """Resolve `model` offline and read its configuration into a `ModelSpec`.

    `reranker`: flags that turn a causal LM into a yes/no reranker (or override what its checkpoint says).
    """
    folder = resolve_model_path(model)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelConfigError(f"{config_path}: missing; pass a model folder that holds config.json")
    config = _read_json(config_path)
    if config.get("auto_map") and not trust_remote_code:
        raise ModelConfigError(
            f"{config_path}: the model asks for its own Python code (auto_map); embedcli does not run remote "
            "code. Use a model transformers ships, or pass --trust-remote-code if you trust it."
        )
    architecture = (config.get("architectures") or ["AutoModel"])[0]
    model_type = str(config.get("model_type", ""))
    if model_type not in ENCODER_TYPES | DECODER_TYPES:
        raise ModelConfigError(
            f"{config_path}: model_type {model_type!r} is not supported; embedcli runs "
            f"{', '.join(sorted(ENCODER_TYPES | DECODER_TYPES))}"
        )
    if not any((folder / n).is_file() for n in ("tokenizer.json", "vocab.txt", "tokenizer.model", "vocab.json")):
        raise ModelConfigError(f"{folder}: no tokenizer files (tokenizer.json) found; the model folder is incomplete")
    weights = _weights(folder, allow_pickle)
    is_decoder = model_type in DECODER_TYPES
    hidden = int(config.get("hidden_size") or config.get("dim") or 0)
    head = _head_kind(architecture)

    modules_path = folder / "modules.json"
    st_layout = modules_path.is_file()
    seq_pooling = "LAST" if is_decoder else "CLS"
    normalize = True
    projector: list[DenseSpec] = []
    splade: dict[str, Any] | None = None
    logit_score: dict[str, Any] | None = None
    if st_layout:
        modules = _read_json(modules_path)
        types = [m.get("type", "") for m in modules]
        normalize = any(t in _ST_TYPES["normalize"] for t in types)
        for module in modules:
            kind = module.get("type", "")
            if kind in _ST_TYPES["pooling"]:
                seq_pooling = _st_pooling_type(folder / module["path"] / "config.json")
            elif kind in _ST_TYPES["dense"]:
                projector.append(_dense_spec(folder, module["path"]))
            elif kind in _ST_TYPES["splade_pooling"]:
                splade = _read_json(folder / module["path"] / "config.json")
            elif kind in _ST_TYPES["logit_score"]:
                logit_score = _read_json(folder / module["path"] / "config.json")
            elif kind not in _ST_TYPES["normalize"] + _ST_TYPES["transformer"] + _ST_TYPES["mlm_transformer"]:
                raise ModelConfigError(f"{modules_path}: module type {kind!r} is not supported")

    st_cfg_path = folder / "config_sentence_transformers.json"
    st_cfg = _read_json(st_cfg_path) if st_cfg_path.is_file() else {}
    sbert_path = folder / "sentence_bert_config.json"
    sbert = _read_json(sbert_path) if sbert_path.is_file() else {}

    model_max = int(config.get("max_position_embeddings") or 512)
    if model_type in POSITION_OFFSET_TYPES:
        model_max -= 2
    st_max = sbert.get("max_seq_length")
    if st_layout and not st_max:
        # sentence-transformers >= 6 keeps the limit in the tokenizer config, not sentence_bert_config.json.
        tok_cfg_path = folder / "tokenizer_config.json"
        tok_max = _read_json(tok_cfg_path).get("model_max_length") if tok_cfg_path.is_file() else None
        if isinstance(tok_max, int) and 0 < tok_max < model_max:
            st_max = tok_max
    resolved_max = int(st_max or model_max)
    if max_length is not None:
        if max_length < 1 or max_length > model_max:
            raise ModelConfigError(f"--max-length {max_length} is outside 1..{model_max} for this model")
        resolved_max = max_length

    matryoshka = config.get("matryoshka_dimensions")
    id2label_raw = config.get("id2label") or {}
    num_labels = int(config.get("num_labels") or len(id2label_raw) or (0 if head == "base" else 2))
    id2label = tuple(str(id2label_raw.get(str(i), id2label_raw.get(i, f"LABEL_{i}"))) for i in range(num_labels))
    st_ce = config.get("sentence_transformers") or {}
    embedding_size = projector[-1].out_features if projector else hidden
    if projector and projector[0].in_features != hidden:
        raise ModelConfigError(
            f"{folder / projector[0].path / 'config.json'}: Dense in_features {projector[0].in_features} "
            f"does not match the model's hidden size {hidden}"
        )

    extra: dict[str, Any] = {}
    if splade is not None:
        head = "sparse"
        extra = _splade_fields(folder, architecture, splade, st_cfg)
        embedding_size = int(config.get("vocab_size") or 0)
    elif logit_score is not None or (reranker is not None and reranker.given):
        head = "lm_score"
        extra = _reranker_fields(folder, architecture, logit_score, reranker or RerankerFlags())
        num_labels = 1
        id2label = (extra["score_tokens"][-1],)

    return ModelSpec(
        name=str(model) if model else DEFAULT_MODEL,
        path=str(folder),
        architecture=architecture,
        model_type=model_type,
        head=head,
        is_decoder=is_decoder,
        hidden_size=hidden,
        max_length=resolved_max,
        do_lower_case=bool(sbert.get("do_lower_case", False)),
        seq_pooling_type=seq_pooling,
        normalize=normalize,
        projector=tuple(projector),
        embedding_size=embedding_size,
        is_matryoshka=bool(config.get("is_matryoshka") or matryoshka),
        matryoshka_dimensions=tuple(int(d) for d in matryoshka) if matryoshka else None,
        prompts=tuple((str(k), str(v)) for k, v in (st_cfg.get("prompts") or {}).items()),
        default_prompt_name=st_cfg.get("default_prompt_name"),
        # SparseEncoder's default similarity is the dot product (its config saves null).
        similarity_fn_name=str(st_cfg.get("similarity_fn_name") or ("dot" if head == "sparse" else "cosine")),
        num_labels=num_labels if head not in ("base", "sparse") else 0,
        id2label=id2label if head not in ("base", "sparse") else (),
        problem_type=config.get("problem_type"),
        st_activation=st_ce.get("activation_fn") or config.get("sbert_ce_default_activation_function"),
        sentence_transformers_layout=st_layout,
        weights=weights,
        **extra,
        content_hash=_hash_files(
            folder,
            ["config.json", "tokenizer.json", *weights, *(f"{d.path}/model.safetensors" for d in projector),
             # An LLM reranker's prompt can come from these files (chat template and its kwargs).
             *(("chat_template.jinja", "tokenizer_config.json", "sentence_bert_config.json") if head == "lm_score" else ())],
        ),
    )


def _splade_fields(folder: Path, architecture: str, cfg: dict[str, Any], st_cfg: dict[str, Any]) -> dict[str, Any]:
    """SPLADE settings of a sentence-transformers SparseEncoder folder."""
    where = folder / "modules.json"
    if not architecture.endswith("ForMaskedLM"):
        raise ModelConfigError(
            f"{where}: SpladePooling needs a masked-LM transformer (…ForMaskedLM), this model is {architecture}"
        )
    pooling = str(cfg.get("pooling_strategy", "max"))
    activation = str(cfg.get("activation_function", "relu"))
    if pooling not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
        raise ModelConfigError(
            f"{where}: SpladePooling {pooling!r}/{activation!r} is not supported; embedcli runs max or sum over "
            "relu or log1p_relu"
        )
    top_k = st_cfg.get("max_active_dims")
    return {
        "sparse_pooling": pooling,
        "sparse_activation": activation,
        "sparse_top_k": int(top_k) if isinstance(top_k, int) and top_k > 0 else None,
    }


def _vocabulary(folder: Path) -> Any:
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ModelConfigError(f"{path}: missing; an LLM reranker's score tokens are looked up in tokenizer.json")
    return Tokenizer.from_file(str(path))


def _reranker_fields(
    folder: Path, architecture: str, logit_score: dict[str, Any] | None, flags: RerankerFlags
) -> dict[str, Any]:
    """Score tokens, their ids and the pair template of a causal LM used as a yes/no reranker."""
    if not architecture.endswith("ForCausalLM"):
        raise ModelConfigError(
            f"{folder / 'config.json'}: --classifier-from-tokens / --pair-template / --reranker-preset turn a "
            f"causal LM (…ForCausalLM) into a reranker; this model is {architecture}"
        )
    preset = None
    if flags.preset is not None:
        if flags.preset not in PRESETS:
            raise ModelConfigError(f"--reranker-preset {flags.preset!r}: choose one of {', '.join(PRESETS)}")
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
        tokens = names  # type: ignore[assignment]
    else:
        raise ModelConfigError(
            f"{folder}: a causal LM reranker needs its score tokens: --classifier-from-tokens no,yes "
            "(or --reranker-preset)"
        )
    if len(tokens) not in (1, 2):
        raise ModelConfigError(f"--classifier-from-tokens {','.join(tokens)}: give one token or two (false,true)")
    token_ids = []
    for token in tokens:
        token_id = vocab.token_to_id(token)
        if token_id is None:
            raise ModelConfigError(f"--classifier-from-tokens: {token!r} is not a token of {folder / 'tokenizer.json'}")
        token_ids.append(int(token_id))
    template = flags.pair_template if flags.pair_template is not None else (preset.template if preset else None)
    chat_kwargs: dict[str, Any] | None = None
    if template is None and logit_score is not None:
        chat_kwargs = _st_chat_pairs(folder)
    if template is not None:
        try:
            check_template(template, "--pair-template")
        except ValueError as e:
            raise ModelConfigError(str(e)) from None
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
    cfg = _read_json(path) if path.is_file() else {}
    if "message" not in (cfg.get("modality_config") or {}):
        return None  # pairs are a tokenizer text pair, whatever chat template the tokenizer has
    fmt = (cfg["modality_config"]["message"] or {}).get("format", "flat")
    if fmt != "flat":
        raise ModelConfigError(f"{path}: message format {fmt!r} is not supported (embedcli renders 'flat' messages)")
    kwargs = dict(((cfg.get("processing_kwargs") or {}).get("chat_template")) or {})
    for key in ("restore_suffix", "padding", "truncation", "max_length", "return_tensors"):
        kwargs.pop(key, None)
    if not all(isinstance(v, (str, int, float, bool)) or v is None for v in kwargs.values()):
        raise ModelConfigError(f"{path}: chat_template kwargs {sorted(kwargs)} must be plain values")
    return kwargs
