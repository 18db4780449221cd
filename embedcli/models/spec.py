"""Read a model folder (HF config + sentence-transformers layout) into one resolved, hashable `ModelSpec`."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from embedcli.errors import ConfigRefusedError, ModelConfigError
from embedcli.models.checkpoint.config_sizes import check_config_sizes
from embedcli.models.checkpoint.content_hash import hash_files
from embedcli.models.checkpoint.families import FAMILY_FIELDS, read_reranker, read_splade
from embedcli.models.checkpoint.late_interaction import (
    LateInteraction,
    is_pylate,
    is_stanford,
    read_native,
    read_pylate,
    read_stanford,
)
from embedcli.models.checkpoint.m3 import read_m3
from embedcli.models.checkpoint.remote_code import check_loadable
from embedcli.models.checkpoint.resolve import DEFAULT_MODEL, resolve_model_path
from embedcli.models.checkpoint.st_config import (
    MODE_TYPES,
    ST_CONFIG,
    ST_TYPES,
    PoolingChoice,
    check_activation,
    check_module_chain,
    read_classifier_activation,
    read_json,
    read_pooling,
    read_sbert_config,
    read_similarity,
    read_truncate_dim,
    read_truncation_side,
    refuse_modular_cross_encoder,
    refuse_non_transformer,
    sbert_config,
    sbert_config_name,
)
from embedcli.models.checkpoint.static_layout import STATIC_FIELDS, read_static
from embedcli.models.checkpoint.weights_file import check_safetensors
from embedcli.models.llm_reranker import RerankerFlags, score_formula
from embedcli.models.registry import REGISTRY, BackbonePlan, padding_index, plan_backbone

# How the model runs (own backbone or the fallback) changes the last bits, not what a resumed run must match.
_HOW_IT_RUNS = ("backbone", "backbone_reason", "registry_entry", "packing", "causal", "position_offset")

__all__ = ["ConfigRefusedError", "DenseSpec", "ModelConfigError", "ModelSpec", "load_model_spec"]


# The tasks of each head; "base" (and any other) serves embed and token_embed. A static model (a token table and
# a mean of rows) has no per-token states worth returning and no classifier: embed only.
HEAD_TASKS: dict[str, tuple[str, ...]] = {
    "sequence_classification": ("classify",),
    "token_classification": ("token_classify",),
    "lm_score": ("classify",),
    "sparse": ("sparse_embed",),
    "static": ("embed",),
}


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
    seq_pooling_type: str  # CLS, LAST, MEAN, MAX, MEAN_SQRT_LEN, WEIGHTEDMEAN; several joined by "+"
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
    pooling_modes: tuple[str, ...] = ()  # sentence-transformers names, concatenated in this order
    include_prompt: bool = True
    pooling_source: str = ""
    # Classifier activation under sentence-transformers' CrossEncoder rules (import path); None: vLLM's rule.
    ce_activation: str | None = None
    activation_source: str = ""
    similarity_source: str = ""
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
    # BGE-M3 (FlagEmbedding's heads beside the encoder): (colbert head file, sparse head file); () otherwise.
    m3_heads: tuple[str, ...] = ()
    # The registry's plan (`embedcli.models.registry.plan_backbone`): what runs the model, and why.
    registry_entry: str = ""
    backbone: str = "transformers"  # "module:Class" of the own backbone, or "transformers" (padded batches)
    backbone_reason: str = ""
    packing: bool = False
    causal: bool = False  # causal attention (decoders): chunked prefill can slice a long sequence
    position_offset: bool = False  # fairseq position ids (RoBERTa, MPNet): they start after the padding index
    # Static embeddings (head "static", `embedcli.models.checkpoint.static_layout`): the layout whose rules apply
    # (model2vec / sentence-transformers), the table's folder, its token limit (None: none) and default dims.
    static_layout: str | None = None
    static_folder: str | None = None
    static_max_tokens: int | None = None
    truncate_dim: int | None = None
    # The side the tokenizer cuts over-long inputs on (`--truncation-side`'s default), and where it was read.
    truncation_side: str | None = None
    truncation_side_source: str = ""
    # A late-interaction (ColBERT) model: its projector is the token projection, its vectors come per role.
    late_interaction: LateInteraction | None = None
    content_hash: str = field(default="", compare=False)

    @property
    def own_backbone(self) -> bool:
        """Whether embedcli's own varlen backbone runs the model (else transformers' modules, padded)."""
        return self.backbone != "transformers"

    @property
    def tasks(self) -> tuple[str, ...]:
        """The pooling tasks this model can serve."""
        if self.late_interaction is not None:
            return ("token_embed",)
        if self.m3_heads:
            return ("embed", "token_embed", "sparse_embed", "hybrid_embed")
        return HEAD_TASKS.get(self.head, ("embed", "token_embed"))

    @property
    def score_type(self) -> str | None:
        """How pairs are scored: cross-encoder, bi-encoder cosine or late interaction (vLLM score types)."""
        if self.head == "sequence_classification":
            return "cross-encoder" if self.num_labels == 1 else None
        if self.head == "lm_score":
            return "cross-encoder"
        if self.head == "sparse":
            return "sparse"
        if self.late_interaction is not None:
            return "late-interaction"
        if self.head == "base":
            return "bi-encoder"
        return None  # static: embed only (its vectors score with `search`)

    @property
    def pooled_size(self) -> int:
        """Width of the pooled vector before any projector or classifier (hidden size times the modes)."""
        return self.hidden_size * max(1, len(self.pooling_modes)) if self.head == "base" else self.hidden_size

    @property
    def chunkable(self) -> bool:
        """Whether `--long-inputs chunk` (a token-weighted mean of chunk vectors) is defined for the pooling."""
        return self.include_prompt and self.seq_pooling_type in ("CLS", "MEAN", "LAST")

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
        if self.late_interaction is not None:
            data["late_interaction_head"] = self.late_interaction.describe()
        if self.head == "sparse":
            data["sparse_head"] = (
                f"masked-LM logits -> {'log1p(log1p(relu(x)))' if self.sparse_activation == 'log1p_relu' else 'log1p(relu(x))'}"
                f" -> {self.sparse_pooling} over tokens -> {self.embedding_size}-dim sparse vector"
                + (f", top {self.sparse_top_k}" if self.sparse_top_k else "")
            )
        if self.m3_heads:
            data["m3_outputs"] = (
                f"BGE-M3 (FlagEmbedding): dense = normalize(h[CLS]); sparse = relu({self.m3_heads[1]}(h)), max per "
                f"token id, specials left out; colbert = normalize({self.m3_heads[0]}(h[1:]))"
            )
        return data

    def config_hash(self) -> str:
        """A short hash of everything that changes the numbers this model produces."""
        data = self.to_dict()
        for volatile in ("name", "path", *_HOW_IT_RUNS):
            data.pop(volatile)
        # The side a run cuts on is in its own config (`truncation_side`, the flag or this default): left out here,
        # every model keeps the hash its outputs were made with.
        for key in ("truncation_side", "truncation_side_source"):
            data.pop(key)
        # Fields of the LLM-reranker and SPLADE heads are left out while unset, so every other model keeps
        # the hash (and its outputs stay resumable and --incremental) across this addition.
        for key in (*FAMILY_FIELDS, *STATIC_FIELDS):
            if data.get(key) in (None, (), []):
                data.pop(key, None)
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _dense_spec(folder: Path, rel: str) -> DenseSpec:
    cfg_path = folder / rel / "config.json"
    if not cfg_path.is_file():
        raise ModelConfigError(f"{cfg_path}: missing; the Dense module {rel!r} in modules.json cannot be loaded")
    cfg = read_json(cfg_path)
    if cfg.get("use_residual"):
        # sentence-transformers >= 6: output = activation(linear(x)) + x (or a projected x); not implemented.
        raise ModelConfigError(f"{cfg_path}: use_residual=true (a residual Dense) is not supported")
    try:
        return DenseSpec(
            path=rel,
            in_features=int(cfg["in_features"]),
            out_features=int(cfg["out_features"]),
            bias=bool(cfg.get("bias", True)),
            activation=check_activation(
                cfg.get("activation_function", "torch.nn.modules.activation.Tanh"), cfg_path, "activation_function"
            ),
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
        for name in safetensors:
            check_safetensors(folder / name)  # a truncated file: one line now, not a SafetensorError later
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
    return hash_files(folder, names)  # remembered per file state: a rerun stats the weights, not reads them


@dataclass(frozen=True)
class _BaseConfig:
    """What config.json says: architecture, head, model type and size, and the registry's plan for it."""

    config: dict[str, Any]
    architecture: str
    model_type: str
    head: str
    is_decoder: bool
    hidden: int


def _is_decoder(model_type: str, architecture: str, config: dict[str, Any]) -> bool:
    entry = REGISTRY.get(model_type)
    if entry is not None:
        return entry.decoder
    # A type only transformers knows: its causal-LM classes name it.
    return architecture.endswith(("ForCausalLM", "LMHeadModel")) or bool(config.get("is_decoder"))


def _read_base_config(folder: Path) -> _BaseConfig:
    config_path = folder / "config.json"
    if not config_path.is_file():
        refuse_non_transformer(folder)
        raise ModelConfigError(f"{config_path}: missing; pass a model folder that holds config.json")
    config = read_json(config_path)
    architecture = (config.get("architectures") or ["AutoModel"])[0]
    model_type = str(config.get("model_type", ""))
    if not model_type:
        raise ModelConfigError(f"{config_path}: no model_type; is this a transformers model folder?")
    if not any((folder / n).is_file() for n in TOKENIZER_FILES):
        raise ModelConfigError(f"{folder}: no tokenizer files (tokenizer.json) found; the model folder is incomplete")
    return _BaseConfig(
        config=config,
        architecture=architecture,
        model_type=model_type,
        head=_head_kind(architecture),
        is_decoder=_is_decoder(model_type, architecture, config),
        hidden=int(config.get("hidden_size") or config.get("dim") or config.get("d_model") or config.get("n_embd") or 0),
    )


def _plan(folder: Path, base: _BaseConfig, head: str, trust_remote_code: bool, backbone: str | None) -> BackbonePlan:
    """The registry's plan for the checkpoint, refused here if nothing can load it as asked."""
    choice = backbone or os.environ.get("EMBEDCLI_BACKBONE", "auto")
    plan = plan_backbone(base.config, head, choice)
    check_loadable(folder, base.config, plan, trust_remote_code)
    return plan


@dataclass(frozen=True)
class _Modules:
    """What modules.json and its module folders say: pooling, projector, normalization."""

    st_layout: bool
    pooling: PoolingChoice
    normalize: bool
    projector: tuple[DenseSpec, ...]
    types: tuple[str, ...]
    splade: dict[str, Any] | None = None  # a SparseEncoder's SpladePooling config
    logit_score: dict[str, Any] | None = None  # a causal-LM CrossEncoder's LogitScore config
    multi_vector_mask: dict[str, Any] | None = None  # a MultiVectorEncoder's MultiVectorMask config


def _check_module_path(folder: Path, module: dict[str, Any], kind: str) -> None:
    """A module folder named in modules.json must lie inside the model folder (one that exists elsewhere would
    be used silently; one that does not is a broken layout)."""
    folder_modules = (
        ST_TYPES["pooling"] + ST_TYPES["dense"] + ST_TYPES["splade_pooling"] + ST_TYPES["logit_score"]
        + ST_TYPES["multi_vector_mask"]
    )
    if kind not in folder_modules:
        return  # the Transformer reads the model folder itself; Normalize has none; others are refused by type
    rel = str(module.get("path", ""))
    target = (folder / rel).resolve()
    if Path(rel).is_absolute() or not target.is_relative_to(folder.resolve()):
        raise ConfigRefusedError(
            f"{folder / 'modules.json'}: module {kind.rpartition('.')[2]} has path {rel!r}, outside the model folder; "
            "module paths must be folders inside it"
        )
    if not target.is_dir():
        raise ModelConfigError(f"{folder / 'modules.json'}: module {kind.rpartition('.')[2]} folder {rel!r} is missing")


def _read_modules(folder: Path, base: _BaseConfig) -> _Modules:
    modules_path = folder / "modules.json"
    default_mode = "lasttoken" if base.is_decoder else "cls"
    why = f"the {base.architecture} head's token" if base.head != "base" else "no Pooling module, as vLLM"
    pooling = PoolingChoice((default_mode,), True, f"default ({default_mode}: {why})")
    if not modules_path.is_file():
        return _Modules(False, pooling, True, (), ())
    modules = read_json(modules_path)
    types = tuple(str(m.get("type", "")) for m in modules)
    projector: list[DenseSpec] = []
    family: dict[str, dict[str, Any]] = {}
    for module, kind in zip(modules, types, strict=True):
        _check_module_path(folder, module, kind)
        if kind in ST_TYPES["pooling"]:
            pooling = read_pooling(folder / module["path"] / "config.json", folder)
        elif kind in ST_TYPES["dense"]:
            projector.append(_dense_spec(folder, module["path"]))
        elif kind in ST_TYPES["splade_pooling"] + ST_TYPES["logit_score"] + ST_TYPES["multi_vector_mask"]:
            key = next(k for k in ("splade_pooling", "logit_score", "multi_vector_mask") if kind in ST_TYPES[k])
            family[key] = read_json(folder / module["path"] / "config.json")
        elif kind not in ST_TYPES["normalize"] + ST_TYPES["transformer"] + ST_TYPES["mlm_transformer"]:
            raise ConfigRefusedError(f"{modules_path}: module type {kind!r} is not supported")
    check_module_chain(folder, modules, types)
    pooled = base.hidden * len(pooling.modes)
    if projector and projector[0].in_features != pooled:
        raise ModelConfigError(
            f"{folder / projector[0].path / 'config.json'}: Dense in_features {projector[0].in_features} "
            f"does not match the pooled size {pooled} (hidden {base.hidden} x {len(pooling.modes)} pooling modes)"
        )
    normalize = any(t in ST_TYPES["normalize"] for t in types)
    return _Modules(True, pooling, normalize, tuple(projector), types, family.get("splade_pooling"),
                    family.get("logit_score"), family.get("multi_vector_mask"))


TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer.model", "vocab.json", "spiece.model", "sentencepiece.bpe.model")


def _max_length(folder: Path, base: _BaseConfig, sbert: dict[str, Any], st_layout: bool, requested: int | None) -> int:
    entry = REGISTRY.get(base.model_type)
    model_max = int(base.config.get("max_position_embeddings") or base.config.get("n_positions") or 512)
    if entry is not None and entry.position_offset:
        model_max -= padding_index(base.model_type, base.config) + 1  # positions start after the padding index
    if requested is not None:
        if requested < 1 or requested > model_max:
            raise ConfigRefusedError(
                f"--max-length {requested} is outside 1..{model_max} for this model "
                f"({folder / 'config.json'}: max_position_embeddings)"
            )
        return requested
    st_max = sbert.get("max_seq_length")
    if st_layout and not st_max:
        # sentence-transformers >= 6 keeps the limit in the tokenizer config, not sentence_bert_config.json.
        tok_cfg_path = folder / "tokenizer_config.json"
        tok_max = read_json(tok_cfg_path).get("model_max_length") if tok_cfg_path.is_file() else None
        if isinstance(tok_max, int) and 0 < tok_max < model_max:
            st_max = tok_max
    if st_max and entry is not None and entry.has_absolute_positions(base.config) and int(st_max) > model_max:
        # The first longer input would index past the position table (sentence-transformers and the forward fail
        # there, mid-run): refused now. Rotary and relative families legitimately run past max_position_embeddings.
        offset = ", less the padding offset" if entry.position_offset else ""
        raise ModelConfigError(
            f"{folder / sbert_config_name(folder)}: max_seq_length {st_max} exceeds the {model_max} learned positions "
            f"of {base.architecture} ({folder / 'config.json'}: max_position_embeddings{offset}); lower it to "
            f"{model_max} or pass --max-length {model_max}"
        )
    return int(st_max or model_max)


def _labels(config: dict[str, Any], head: str, config_path: Path) -> tuple[int, tuple[str, ...]]:
    if head == "base":
        return 0, ()
    id2label_raw = config.get("id2label") or {}
    num_labels = int(config.get("num_labels") or len(id2label_raw) or 2)
    # A label id past the count (a gap: {0, 1, 3}) names an output row the labels cannot reach; transformers
    # sizes the head by the count and refuses such a checkpoint, and the rows' labels would be misnamed.
    stray = sorted(str(k) for k in id2label_raw if not (str(k).isdigit() and int(k) < num_labels))
    if stray:
        raise ModelConfigError(
            f"{config_path}: id2label ids {', '.join(stray)} are not in 0..{num_labels - 1} (the model's "
            f"{num_labels} labels); number the labels 0, 1, 2, ... with one entry per classifier output"
        )
    id2label = tuple(str(id2label_raw.get(str(i), id2label_raw.get(i, f"LABEL_{i}"))) for i in range(num_labels))
    return num_labels, id2label


def _optional_json(path: Path) -> dict[str, Any]:
    return read_json(path) if path.is_file() else {}


def _family(
    folder: Path, base: _BaseConfig, mods: _Modules, st_cfg: dict[str, Any], reranker: RerankerFlags | None
) -> tuple[str, dict[str, Any]]:
    """The head of a SPLADE model or an LLM reranker and the ModelSpec fields it sets; else config.json's head."""
    if mods.splade is not None:
        fields = read_splade(folder, base.architecture, mods.splade, st_cfg)
        fields["embedding_size"] = int(base.config.get("vocab_size") or 0)
        if st_cfg.get("similarity_fn_name") is None:  # SparseEncoder's default similarity (its config saves null)
            fields.update(similarity_fn_name="dot", similarity_source="default (dot, as SparseEncoder)")
        return "sparse", fields
    if mods.logit_score is not None or (reranker is not None and reranker.given):
        fields = read_reranker(folder, base.architecture, mods.logit_score, reranker or RerankerFlags())
        return "lm_score", {**fields, "num_labels": 1, "id2label": (fields["score_tokens"][-1],)}
    m3 = read_m3(folder, base.architecture, mods.pooling.modes)
    if m3 is not None:
        return base.head, m3
    return base.head, {}


IDENTITY = "torch.nn.modules.linear.Identity"


def _late_interaction(
    folder: Path, base: _BaseConfig, mods: _Modules, st_cfg: dict[str, Any], max_length: int | None
) -> tuple[tuple[DenseSpec, ...], LateInteraction | None]:
    """The projector and `LateInteraction` of a ColBERT checkpoint (Stanford or PyLate layout); else the
    modules' projector and None."""
    stanford = is_stanford(base.config)
    native = mods.multi_vector_mask is not None or st_cfg.get("model_type") == "MultiVectorEncoder"
    if not stanford and not (mods.st_layout and (native or is_pylate(st_cfg))):
        return mods.projector, None
    if base.is_decoder or base.head != "base":
        raise ConfigRefusedError(
            f"{folder / 'config.json'}: a late-interaction (ColBERT) head on {base.architecture} is not supported; "
            "embedcli runs ColBERT on bidirectional encoders"
        )
    model_max = _max_length(folder, base, {}, False, max_length)
    # Without a length of its own a role is cut where sentence-transformers' Transformer cuts (max_seq_length).
    st_max = _max_length(folder, base, read_sbert_config(folder), mods.st_layout, max_length)
    if stanford:
        late, (dim, hidden) = read_stanford(folder, base.hidden, model_max)
        return (DenseSpec(path="", in_features=hidden, out_features=dim, bias=False, activation=IDENTITY),), late
    pooling = [t for t in mods.types if t in ST_TYPES["pooling"]]
    if pooling or mods.splade is not None or mods.logit_score is not None:
        raise ConfigRefusedError(
            f"{folder / 'modules.json'}: a MaxSim (PyLate) model with a {pooling[0].rpartition('.')[2] if pooling else 'sparse or score'} "
            "module is not supported; a ColBERT model is a Transformer and Dense projections"
        )
    dim = mods.projector[-1].out_features if mods.projector else base.hidden
    if native:
        if mods.multi_vector_mask is None or not mods.normalize:
            raise ConfigRefusedError(
                f"{folder / 'modules.json'}: a MultiVectorEncoder without a MultiVectorMask and a Normalize module "
                "is not supported"
            )
        sbert = read_sbert_config(folder)
        return mods.projector, read_native(folder, st_cfg, sbert, mods.multi_vector_mask, dim, model_max, st_max)
    return mods.projector, read_pylate(folder, st_cfg, dim, model_max, st_max)


def load_model_spec(
    model: str | None,
    *,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    max_length: int | None = None,
    reranker: RerankerFlags | None = None,
    backbone: str | None = None,
) -> ModelSpec:
    """Resolve `model` (offline first; a Hub id not found locally is downloaded) and read it into a `ModelSpec`.

    `reranker`: flags that turn a causal LM into a yes/no reranker (or override what its checkpoint says).
    `backbone`: auto / own / transformers (default: the EMBEDCLI_BACKBONE environment variable, else auto).
    """
    folder = resolve_model_path(model, allow_pickle=allow_pickle)
    static = read_static(folder, max_length)
    if static is not None:
        return _static_spec(str(model) if model else DEFAULT_MODEL, folder, static)
    base = _read_base_config(folder)
    weights = _weights(folder, allow_pickle)
    check_config_sizes(folder, base.config, weights)  # absurd sizes: one line now, not an allocator traceback
    mods = _read_modules(folder, base)
    st_cfg = _optional_json(folder / ST_CONFIG)
    head, family = _family(folder, base, mods, st_cfg, reranker)
    plan = _plan(folder, base, head, trust_remote_code, backbone)
    refuse_modular_cross_encoder(folder, st_cfg, mods.types, head)
    sbert_name, sbert = sbert_config(folder)
    side, side_source = read_truncation_side(folder, sbert_name, sbert)
    config = base.config
    num_labels, id2label = _labels(config, base.head, folder / "config.json")
    # An LLM reranker's activation is its score formula (the LM head's pooler), not a classifier rule.
    classifier = base.head != "base" and head != "lm_score"
    activation = read_classifier_activation(folder, config, st_cfg, num_labels) if classifier else None
    projector, late = _late_interaction(folder, base, mods, st_cfg, max_length)
    if late is not None:
        similarity, similarity_source = "maxsim", f"late interaction ({late.source})"
    else:
        similarity, similarity_source = read_similarity(folder, st_cfg)
    matryoshka = config.get("matryoshka_dimensions")
    embedding_size = projector[-1].out_features if projector else base.hidden * len(mods.pooling.modes)
    spec = ModelSpec(
        name=str(model) if model else DEFAULT_MODEL,
        path=str(folder),
        architecture=base.architecture,
        model_type=base.model_type,
        head=head,
        is_decoder=base.is_decoder,
        hidden_size=base.hidden,
        max_length=_max_length(folder, base, sbert, mods.st_layout, max_length),
        do_lower_case=bool(sbert.get("do_lower_case", False)),
        seq_pooling_type="+".join(MODE_TYPES[m] for m in mods.pooling.modes),
        normalize=mods.normalize or late is not None,
        projector=projector,
        embedding_size=embedding_size,
        is_matryoshka=bool(config.get("is_matryoshka") or matryoshka),
        matryoshka_dimensions=tuple(int(d) for d in matryoshka) if matryoshka else None,
        prompts=tuple((str(k), str(v)) for k, v in (st_cfg.get("prompts") or {}).items()),
        default_prompt_name=st_cfg.get("default_prompt_name"),
        similarity_fn_name=similarity,
        num_labels=num_labels,
        id2label=id2label,
        problem_type=config.get("problem_type"),
        st_activation=(config.get("sentence_transformers") or {}).get("activation_fn")
        or config.get("sbert_ce_default_activation_function"),
        sentence_transformers_layout=mods.st_layout,
        pooling_modes=mods.pooling.modes,
        include_prompt=mods.pooling.include_prompt,
        pooling_source=mods.pooling.source,
        ce_activation=activation.path if activation else None,
        activation_source=activation.source if activation else "",
        similarity_source=similarity_source,
        weights=weights,
        registry_entry=plan.entry,
        backbone=plan.backbone,
        backbone_reason=plan.reason,
        packing=plan.packing,
        causal=plan.causal,
        position_offset=bool(REGISTRY.get(base.model_type) and REGISTRY[base.model_type].position_offset),
        late_interaction=late,
        # sentence-transformers' encode keeps the first truncate_dim values of a sentence embedding by default.
        truncate_dim=read_truncate_dim(folder, st_cfg, embedding_size) if head == "base" and late is None else None,
        truncation_side=side,
        truncation_side_source=side_source,
        content_hash=_hash_files(
            folder,
            ["config.json", "tokenizer.json", *weights, *(f"{d.path}/model.safetensors" for d in projector if d.path),
             *(("artifact.metadata", ST_CONFIG) if late is not None else ()),
             # An LLM reranker's prompt can come from these files (chat template and its kwargs).
             *(("chat_template.jinja", "tokenizer_config.json", "sentence_bert_config.json") if head == "lm_score" else ()),
             *family.get("m3_heads", ())],
        ),
    )
    return replace(spec, **family)


def _static_spec(name: str, folder: Path, fields: dict[str, Any]) -> ModelSpec:
    """The spec of a static embedding folder (`read_static`'s fields): embed only, mean of rows, no backbone."""
    st_cfg = _optional_json(folder / ST_CONFIG)
    similarity, similarity_source = read_similarity(folder, st_cfg)
    weights = tuple(fields.pop("weights"))
    for w in weights:
        check_safetensors(folder / w)
    sub = fields["static_folder"].rstrip("/")
    tokenizer = "tokenizer.json" if sub in ("", ".") else f"{sub}/tokenizer.json"
    return ModelSpec(
        name=name,
        path=str(folder),
        model_type="static",
        head="static",
        is_decoder=False,
        max_length=fields["static_max_tokens"] or 0,  # 0: no token limit (every token counts)
        do_lower_case=False,
        seq_pooling_type="MEAN",
        embedding_size=fields["hidden_size"],
        pooling_modes=("mean",),
        prompts=tuple((str(k), str(v)) for k, v in (st_cfg.get("prompts") or {}).items()),
        default_prompt_name=st_cfg.get("default_prompt_name"),
        similarity_fn_name=similarity,
        similarity_source=similarity_source,
        sentence_transformers_layout=fields["static_layout"] != "model2vec",
        weights=weights,
        registry_entry="static",
        backbone="static",
        packing=True,  # every row's token ids laid end to end, one mean per row
        backbone_reason="a static embedding table: tokenizer and a mean of rows in numpy, no forward (no torch)",
        content_hash=_hash_files(folder, ["config.json", "modules.json", tokenizer, *weights]),
        **fields,
    )
