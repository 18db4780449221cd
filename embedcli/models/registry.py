"""The model registry: one declarative entry per architecture, and the torch-free resolver of a folder's plan.

An entry says which backbone implements the architecture (embedcli's own varlen module on the packed buffer,
or none: transformers' own modules in padded batches, the exact fallback), which heads the own backbone
serves, and every config.json key that changes the numbers, with the values the own backbone computes. A
checkpoint whose config holds any other value of such a key runs on the fallback, never on a backbone that
would ignore it. `plan_backbone` is the one place that decides; the spec (and so the output's provenance),
the loader, the runner and `embedcli info` all read its `BackbonePlan`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from embedcli.errors import ConfigRefusedError

Config = Mapping[str, Any]

# The activations the own backbones implement (`embedcli.models.backbones.layers.ACTIVATIONS`, checked by a test).
OWN_ACTIVATIONS = frozenset(
    {"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "quick_gelu", "relu", "silu", "swish", "tanh"}
)
# The own backbones' RoPE kinds (`embedcli.models.backbones.llama.rope_inv_freq`).
OWN_ROPE_TYPES = frozenset({"default", "linear", "llama3"})

HEADS = ("base", "sequence_classification", "token_classification", "lm_score", "sparse")
# What an own backbone serves unless its entry says otherwise: the LM-head families (yes/no rerankers, SPLADE)
# keep transformers' modules, whose LM heads they slice.
OWN_HEADS = frozenset({"base", "sequence_classification", "token_classification"})
LM_HEADS = frozenset({"base", "sequence_classification", "lm_score"})


@dataclass(frozen=True)
class ConfigKey:
    """A config.json key that changes the numbers, and which of its values the own backbone computes."""

    name: str
    default: Any  # its value when config.json lacks it (or holds null), as transformers' config class has it
    accepts: Callable[[Any, Config], bool]  # (value, whole config) -> implemented by the own backbone
    means: str  # what the key does, for `embedcli info` and the fallback's reason

    def value(self, config: Config) -> Any:
        """The key's value in `config`, or its default."""
        value = config.get(self.name)
        return self.default if value is None else value


def any_value(_value: Any, _config: Config) -> bool:
    """Every value is implemented (the key is read by the own backbone)."""
    return True


def equals(*allowed: Any) -> Callable[[Any, Config], bool]:
    """Only these values are implemented."""
    return lambda value, _config: value in allowed


def falsy(value: Any, _config: Config) -> bool:
    """Implemented only while off (false, 0, empty)."""
    return not value


def _activation(value: Any, _config: Config) -> bool:
    return isinstance(value, str) and value in OWN_ACTIVATIONS


def _rope(value: Any, config: Config) -> bool:
    params = dict(value or {})
    kind = params.get("rope_type", params.get("type", "default"))
    partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor"))
    return kind in OWN_ROPE_TYPES and (partial is None or float(partial) == 1.0)


def _no_short_window(value: Any, config: Config) -> bool:
    """A sliding window counts only where it is shorter than the context and switched on."""
    if value is None or config.get("use_sliding_window") is False:
        return True
    return int(value) >= int(config.get("max_position_embeddings") or 0)


def _no_sliding_layers(value: Any, _config: Config) -> bool:
    return "sliding_attention" not in (value or [])


ENCODER_ACT = ConfigKey("hidden_act", "gelu", _activation, "the feed-forward activation")
EPS = ConfigKey("layer_norm_eps", 1e-12, any_value, "LayerNorm epsilon")
BERT_KEYS = (
    ConfigKey("position_embedding_type", "absolute", equals("absolute"), "absolute or relative position embeddings"),
    ConfigKey("is_decoder", False, falsy, "causal self-attention"),
    ConfigKey("add_cross_attention", False, falsy, "cross-attention layers"),
    ENCODER_ACT,
    EPS,
    ConfigKey("type_vocab_size", 2, any_value, "token type embeddings"),
)
DECODER_KEYS = (
    ConfigKey("hidden_act", "silu", _activation, "the MLP activation"),
    ConfigKey("rms_norm_eps", 1e-6, any_value, "RMSNorm epsilon"),
    ConfigKey("rope_theta", 10000.0, any_value, "RoPE base"),
    ConfigKey("rope_scaling", None, _rope, "RoPE scaling kind (older name)"),
    ConfigKey("rope_parameters", None, _rope, "RoPE kind and base"),
    ConfigKey("partial_rotary_factor", 1.0, equals(1, 1.0), "the share of each head RoPE rotates"),
    ConfigKey("head_dim", None, any_value, "per-head width"),
    ConfigKey("num_key_value_heads", None, any_value, "grouped-query attention"),
    ConfigKey("sliding_window", None, _no_short_window, "sliding-window attention"),
    ConfigKey("layer_types", None, _no_sliding_layers, "per-layer attention kinds (sliding layers)"),
    ConfigKey("use_bidirectional_attention", False, falsy, "bidirectional instead of causal attention"),
    ConfigKey("attn_logit_softcapping", None, equals(None), "tanh softcap of the attention scores"),
)


def _gated(value: Any, _config: Config) -> bool:
    return value in ("swiglu", "geglu", "glu")


def _rotary_fraction(value: Any, config: Config) -> bool:
    heads = int(config.get("n_head") or 1)
    rotary = float(value) * (int(config.get("n_embd") or 0) // heads)
    return rotary > 0 and rotary == int(rotary) and int(rotary) % 2 == 0


def _same_heads(value: Any, config: Config) -> bool:
    return value is None or int(value) == int(config.get("n_head") or 0)


def nomic_intermediate(config: Config) -> int:
    """NomicBERT's gated MLP width: n_inner (or 8/3 n_embd) rounded up to a multiple of 256, as its code does."""
    hidden = int(config["n_embd"])
    inner = config.get("n_inner")
    width = int(inner) if inner is not None else int(8 * hidden / 3)
    return (width + 255) // 256 * 256


def nomic_native_mismatch(config: Config) -> str | None:
    """Why transformers' own `nomic_bert` (which reads BERT-style keys, not the checkpoint's GPT-2-style ones)
    would compute other numbers than the checkpoint's code, or None."""
    rope = dict(config.get("rope_parameters") or {})
    native: dict[str, tuple[object, object]] = {
        "hidden_size": (config.get("hidden_size", 768), int(config["n_embd"])),
        "num_attention_heads": (config.get("num_attention_heads", 12), int(config["n_head"])),
        "num_hidden_layers": (config.get("num_hidden_layers", 12), int(config["n_layer"])),
        "intermediate_size": (config.get("intermediate_size", 3072), nomic_intermediate(config)),
        "hidden_act": (config.get("hidden_act", "silu"), "silu" if config.get("activation_function") == "swiglu" else None),
        "layer_norm_eps": (float(config.get("layer_norm_eps", 1e-12)), float(config.get("layer_norm_epsilon", 1e-5))),
        "rope_theta": (float(rope.get("rope_theta", config.get("rope_theta", 1000.0)) or 1000.0),
                       float(config.get("rotary_emb_base", 10000))),
        "rope_type": (rope.get("rope_type", "default"), "default"),
        "qkv_proj_bias": (False, bool(config.get("qkv_proj_bias", True))),
        "mlp_fc1_bias": (False, bool(config.get("mlp_fc1_bias", True))),
        "mlp_fc2_bias": (False, bool(config.get("mlp_fc2_bias", True))),
        "rotary_emb_fraction": (1.0, float(config.get("rotary_emb_fraction", 0.0))),
        "rotary_emb_interleaved": (False, bool(config.get("rotary_emb_interleaved", False))),
    }
    head_dim = config.get("head_dim")
    if head_dim is not None:
        native["head_dim"] = (int(head_dim), int(config["n_embd"]) // int(config["n_head"]))
    for key, (theirs, ours) in native.items():
        if theirs != ours:
            return f"{key}: transformers' nomic_bert computes {theirs!r}, the GPT-2 style keys say {ours!r}"
    return None


def _nomic_code_or_native(value: Any, config: Config) -> bool:
    """With its auto_map the checkpoint's code defines the numbers (the own backbone follows it); without, the
    native transformers model does, and the own backbone serves only configs where both agree."""
    return bool(value) or nomic_native_mismatch(config) is None


def _gte_rope_scaling(value: Any, _config: Config) -> bool:
    # A factor <= 1 would make the frequencies depend on the longest sequence of each forward.
    return value is None or (
        isinstance(value, Mapping) and value.get("type") == "ntk" and float(value.get("factor", 0)) > 1.0
    )


NOMIC_KEYS = (
    *(ConfigKey(k, None, lambda v, _c: v is not None, "GPT-2 style size keys (read by the own backbone)")
      for k in ("n_embd", "n_head", "n_layer")),
    ConfigKey("activation_function", "gelu_new", _gated, "the gated MLP (swiglu, geglu, glu)"),
    *(ConfigKey(k, False, falsy, "a block layout the plain post-norm encoder does not have")
      for k in ("prenorm", "parallel_block", "use_rms_norm", "causal", "norm_mlp", "rotary_head_dim")),
    ConfigKey("rotary_emb_scale_base", None, equals(None), "xPos rotary scaling"),
    ConfigKey("rotary_emb_fraction", 0.0, _rotary_fraction, "the share of each head RoPE rotates"),
    ConfigKey("rotary_emb_base", 10000, any_value, "RoPE base"),
    ConfigKey("rotary_emb_interleaved", False, any_value, "interleaved RoPE pairs"),
    ConfigKey("rotary_scaling_factor", None, any_value, "dynamic NTK beyond max_trained_positions (per sequence)"),
    ConfigKey("num_heads_kv", None, _same_heads, "grouped key/value heads"),
    *(ConfigKey(k, True, any_value, "projection biases") for k in ("qkv_proj_bias", "mlp_fc1_bias", "mlp_fc2_bias")),
    ConfigKey("layer_norm_epsilon", 1e-5, any_value, "LayerNorm epsilon"),
    ConfigKey("auto_map", None, _nomic_code_or_native, "which code defines the numbers (the checkpoint's, or transformers')"),
)
GTE_KEYS = (
    ConfigKey("position_embedding_type", "rope", equals("rope"), "rotary position embeddings"),
    ConfigKey("layer_norm_type", "layer_norm", equals("layer_norm", "rms_norm"), "LayerNorm or RMSNorm"),
    ConfigKey("hidden_act", "gelu", _activation, "the gated MLP activation"),
    ConfigKey("rope_theta", 10000.0, any_value, "RoPE base"),
    ConfigKey("rope_scaling", None, _gte_rope_scaling, "NTK RoPE scaling"),
    ConfigKey("logn_attention_scale", False, any_value, "log-n attention scaling"),
    ConfigKey("logn_attention_clip1", False, any_value, "log-n scale clipped at 1"),
    ConfigKey("pack_qkv", True, any_value, "fused or separate q/k/v weights"),
    ConfigKey("type_vocab_size", 1, any_value, "token type embeddings"),
    ConfigKey("layer_norm_eps", 1e-12, any_value, "norm epsilon"),
)


def _modernbert_layer_types(value: Any, config: Config) -> bool:
    layers = int(config.get("num_hidden_layers") or 0)
    return value is None or (
        len(value) == layers and all(t in ("full_attention", "sliding_attention") for t in value)
    )


def _modernbert_rope(value: Any, _config: Config) -> bool:
    """Only per-kind default RoPE entries (`full_attention` / `sliding_attention`)."""
    if value is None:
        return True
    if not isinstance(value, Mapping):
        return False
    entries = value.values() if set(value) <= {"full_attention", "sliding_attention"} else [value]
    return all(isinstance(e, Mapping) and e.get("rope_type", "default") == "default" for e in entries)


def _modernbert_window(value: Any, config: Config) -> bool:
    return value is None or int(value) == int(config.get("local_attention", 128)) // 2


def _head_dim(value: Any, config: Config) -> bool:
    heads = int(config.get("num_attention_heads") or 1)
    return value is None or int(value) == int(config.get("hidden_size") or 0) // heads


MODERNBERT_KEYS = (
    ConfigKey("hidden_activation", "gelu", _activation, "the GeGLU activation"),
    ConfigKey("classifier_activation", "gelu", _activation, "the classifier head's activation"),
    ConfigKey("classifier_pooling", "cls", equals("cls", "mean"), "the classifier's pooling"),
    ConfigKey("norm_eps", 1e-5, any_value, "LayerNorm epsilon"),
    *(ConfigKey(k, False, any_value, "biases") for k in ("norm_bias", "attention_bias", "mlp_bias", "classifier_bias")),
    ConfigKey("head_dim", None, _head_dim, "per-head width"),
    ConfigKey("layer_types", None, _modernbert_layer_types, "global / local attention per layer"),
    ConfigKey("global_attn_every_n_layers", 3, lambda v, _c: int(v) >= 1, "the global-attention period"),
    ConfigKey("local_attention", 128, lambda v, _c: int(v) >= 0, "the local attention window"),
    ConfigKey("sliding_window", None, _modernbert_window, "the local window's reach"),
    ConfigKey("rope_parameters", None, _modernbert_rope, "RoPE per attention kind"),
    ConfigKey("global_rope_theta", 160000.0, any_value, "RoPE base of the global layers"),
    ConfigKey("local_rope_theta", 10000.0, any_value, "RoPE base of the local layers"),
    ConfigKey("rope_scaling", None, lambda v, _c: not v, "RoPE scaling"),
)


_GEMMA_ROPE_TYPES = frozenset({"default", "linear"})


def _gemma_layer_types(value: Any, config: Config) -> bool:
    if value is None:
        return True
    layers = int(config.get("num_hidden_layers") or 0)
    return len(value) == layers and all(t in ("sliding_attention", "full_attention") for t in value)


def _gemma_window(_value: Any, config: Config) -> bool:
    """An absent window is transformers' default (4096); an explicit null beside sliding layers is undefined."""
    explicit_null = "sliding_window" in config and config["sliding_window"] is None
    return not (explicit_null and "sliding_attention" in (config.get("layer_types") or ["sliding_attention"]))


def _rope_kind_ok(params: Any) -> bool:
    return isinstance(params, Mapping) and params.get("rope_type", params.get("type", "default")) in _GEMMA_ROPE_TYPES \
        and "partial_rotary_factor" not in params


def _gemma3_rope(value: Any, config: Config) -> bool:
    """Nested per layer type (default or linear), not beside a legacy rope_scaling."""
    if value is None:
        return True
    if config.get("rope_scaling") is not None or not isinstance(value, Mapping):
        return False
    return set(value) <= {"sliding_attention", "full_attention"} and all(_rope_kind_ok(v) for v in value.values())


def _gemma_legacy_scaling(value: Any, _config: Config) -> bool:
    return value is None or (_rope_kind_ok(value) and "rope_type" in value)


def _flat_rope(value: Any, _config: Config) -> bool:
    return value is None or _rope_kind_ok(value)


def _positive_or_none(value: Any, _config: Config) -> bool:
    return value is None or float(value) > 0


GEMMA_KEYS = (
    ConfigKey("head_dim", 256, any_value, "per-head width"),
    ConfigKey("rms_norm_eps", 1e-6, any_value, "RMSNorm epsilon (x * (1 + w))"),
    ConfigKey("attention_bias", False, any_value, "q/k/v/o biases"),
    ConfigKey("num_key_value_heads", None, any_value, "grouped-query attention"),
    ConfigKey("hidden_activation", "gelu_pytorch_tanh", _activation, "the MLP activation"),
    ConfigKey("query_pre_attn_scalar", 256, any_value, "the attention score scale"),
    ConfigKey("final_logit_softcapping", None, _positive_or_none, "tanh cap of the LM-head logits"),
    ConfigKey("rope_theta", 10000.0, any_value, "RoPE base"),
)
GEMMA3_KEYS = (
    *GEMMA_KEYS,
    ConfigKey("use_bidirectional_attention", False, any_value, "bidirectional attention (EmbeddingGemma)"),
    ConfigKey("sliding_window", 4096, _gemma_window, "the local layers' window"),
    ConfigKey("layer_types", None, _gemma_layer_types, "sliding or full attention per layer"),
    ConfigKey("rope_parameters", None, _gemma3_rope, "RoPE per layer type"),
    ConfigKey("rope_scaling", None, _gemma_legacy_scaling, "RoPE scaling of the full layers (older name)"),
    ConfigKey("rope_local_base_freq", 10000.0, any_value, "RoPE base of the sliding layers (older name)"),
    ConfigKey("attn_logit_softcapping", None, equals(None), "tanh cap of the attention scores (Gemma3 ignores it)"),
)
GEMMA2_KEYS = (
    *GEMMA_KEYS,
    ConfigKey("use_bidirectional_attention", False, falsy, "bidirectional attention"),
    ConfigKey("sliding_window", 4096, _gemma_window, "the local layers' window"),
    ConfigKey("layer_types", None, _gemma_layer_types, "sliding or full attention per layer"),
    ConfigKey("rope_parameters", None, _flat_rope, "RoPE kind"),
    ConfigKey("rope_scaling", None, _flat_rope, "RoPE scaling (older name)"),
    ConfigKey("attn_logit_softcapping", 50.0, _positive_or_none, "tanh cap of the attention scores"),
)
GEMMA1_KEYS = (
    *GEMMA_KEYS,
    ConfigKey("hidden_act", "gelu", _activation, "the MLP activation (Gemma v1 reads hidden_act; gelu is the tanh form)"),
    *(ConfigKey(k, None, falsy, "not in Gemma v1")
      for k in ("use_bidirectional_attention", "attn_logit_softcapping", "final_logit_softcapping", "layer_types")),
    ConfigKey("rope_parameters", None, _flat_rope, "RoPE kind"),
    ConfigKey("rope_scaling", None, _flat_rope, "RoPE scaling (older name)"),
)


@dataclass(frozen=True)
class ModelEntry:
    """One architecture: its backbone, the heads that backbone serves, and the config keys that change numbers."""

    name: str
    model_types: tuple[str, ...]
    backbone: str | None  # "module:Class" of the own varlen backbone; None: transformers' modules only
    heads: frozenset[str] = OWN_HEADS  # the heads the own backbone serves
    keys: tuple[ConfigKey, ...] = ()
    decoder: bool = False  # a causal-LM family: LAST pooling by default, decoder tokenizers, LM-head rerankers
    position_offset: bool = False  # fairseq position ids, starting after the padding index
    # A learned (or fixed) table of absolute positions: no sequence may be longer than it (max_position_embeddings,
    # less the offset). Rotary and relative families have no such table and may run past max_position_embeddings.
    absolute_positions: bool = False
    # A config.json boolean that switches such a table on per checkpoint (DeBERTa's position_biased_input, on
    # when absent, as transformers' config classes default it); it overrides `absolute_positions`.
    absolute_positions_key: str | None = None
    token_types: bool = False  # the forward takes token type ids
    bidirectional_key: str | None = None  # a decoder whose config can switch causal attention off
    # The checkpoints ship their architecture as remote code (auto_map) that the own backbone reimplements
    # natively, as vLLM and TEI do (NomicBERT, GTE NewModel); for any other entry an auto_map means the
    # checkpoint's own code defines the model, and only that code (--trust-remote-code) runs it.
    replaces_remote_code: bool = False
    # The transformers class the fallback loads for embeddings (None: AutoModel), as sentence-transformers'
    # Transformer module picks it (T5 and mT5 run their encoder alone).
    base_class: str | None = None

    def has_absolute_positions(self, config: Config) -> bool:
        """Whether this checkpoint adds a learned absolute position table (no sequence may be longer)."""
        if self.absolute_positions_key is None:
            return self.absolute_positions
        value = config.get(self.absolute_positions_key)
        return True if value is None else bool(value)

    def causal(self, config: Config) -> bool:
        """Whether attention is causal for this checkpoint (what chunked prefill needs)."""
        return self.decoder and not (self.bidirectional_key and config.get(self.bidirectional_key))


def padding_index(model_type: str, config: Config) -> int:
    """The padding index fairseq-style position ids start after (`position_offset` entries): the config's
    pad_token_id for RoBERTa / XLM-R / CamemBERT, always 1 for MPNet (transformers hard-codes it)."""
    pad = config.get("pad_token_id")
    return pad if model_type != "mpnet" and isinstance(pad, int) and not isinstance(pad, bool) else 1


def _entries() -> tuple[ModelEntry, ...]:
    bert_like: dict[str, Any] = {"keys": BERT_KEYS, "token_types": True, "absolute_positions": True}
    roberta_like: dict[str, Any] = {
        **bert_like,
        "keys": (*BERT_KEYS, ConfigKey("pad_token_id", 1, any_value, "the padding id (position offset)")),
        "position_offset": True,
    }
    decoder: dict[str, Any] = {"keys": DECODER_KEYS, "decoder": True}
    biased = (
        ConfigKey("attention_bias", False, any_value, "q/k/v/o projection biases"),
        ConfigKey("mlp_bias", False, any_value, "MLP biases"),
    )
    return (
        ModelEntry("BertModel", ("bert",), "embedcli.models.backbones.bert:BertModel", **bert_like),
        ModelEntry(
            "RobertaModel", ("roberta", "xlm-roberta", "camembert"), "embedcli.models.backbones.roberta:RobertaModel",
            **roberta_like,
        ),
        ModelEntry(
            "DistilBertModel", ("distilbert",), "embedcli.models.backbones.distilbert:DistilBertModel",
            absolute_positions=True,  # learned, or sinusoidal rows of the same fixed table
            keys=(
                ConfigKey("activation", "gelu", _activation, "the feed-forward activation"),
                ConfigKey("sinusoidal_pos_embds", False, falsy, "fixed sinusoidal position embeddings"),
            ),
        ),
        ModelEntry(
            "MPNetModel", ("mpnet",), "embedcli.models.backbones.mpnet:MPNetModel",
            keys=(
                ENCODER_ACT, EPS,
                ConfigKey("relative_attention_num_buckets", 32, any_value, "relative position buckets"),
            ),
            position_offset=True,
            absolute_positions=True,  # a relative bias on top of learned absolute positions
        ),
        ModelEntry("LlamaModel", ("llama", "mistral"), "embedcli.models.backbones.llama:LlamaModel",
                   **{**decoder, "keys": (*DECODER_KEYS, *biased)}),
        ModelEntry("Qwen2Model", ("qwen2",), "embedcli.models.backbones.qwen2:Qwen2Model", **decoder),
        ModelEntry("Qwen3Model", ("qwen3",), "embedcli.models.backbones.qwen3:Qwen3Model",
                   **{**decoder, "keys": (*DECODER_KEYS, *biased)}),
        ModelEntry("ModernBertModel", ("modernbert",), "embedcli.models.backbones.modernbert:ModernBertModel",
                   keys=MODERNBERT_KEYS),
        # NomicBERT and GTE NewModel ship as remote code; vLLM and TEI run them natively, and so does embedcli.
        ModelEntry("NomicBertModel", ("nomic_bert",), "embedcli.models.backbones.nomic_bert:NomicBertModel",
                   heads=frozenset({"base"}), keys=NOMIC_KEYS, token_types=True, replaces_remote_code=True),
        ModelEntry("NewModel", ("new",), "embedcli.models.backbones.gte:GteModel",
                   heads=frozenset({"base", "sequence_classification"}), keys=GTE_KEYS, token_types=True,
                   replaces_remote_code=True),
        # Families served by transformers' modules alone (padded batches): the exact fallback by name.
        ModelEntry("ElectraModel", ("electra",), None, token_types=True, absolute_positions=True),
        ModelEntry("T5EncoderModel", ("t5",), None, base_class="T5EncoderModel"),
        ModelEntry("MT5EncoderModel", ("mt5",), None, base_class="MT5EncoderModel"),
        ModelEntry("UMT5EncoderModel", ("umt5",), None, base_class="UMT5EncoderModel"),
        # DeBERTa-v3 (position_biased_input false) has relative positions only; v1/v2 configs that leave the
        # key out or set it true add a learned absolute table too.
        ModelEntry("DebertaV2Model", ("deberta-v2", "deberta"), None, token_types=True,
                   absolute_positions_key="position_biased_input"),
        # Gemma: the own backbones serve the yes/no LM-head score too (final logit cap included).
        ModelEntry("GemmaModel", ("gemma",), "embedcli.models.backbones.gemma:GemmaV1Model", heads=LM_HEADS, keys=GEMMA1_KEYS,
                   decoder=True),
        ModelEntry("Gemma2Model", ("gemma2",), "embedcli.models.backbones.gemma:Gemma2Model", heads=LM_HEADS, keys=GEMMA2_KEYS,
                   decoder=True),
        ModelEntry("Gemma3TextModel", ("gemma3_text",), "embedcli.models.backbones.gemma:Gemma3TextModel", heads=LM_HEADS,
                   keys=GEMMA3_KEYS, decoder=True, bidirectional_key="use_bidirectional_attention"),
        ModelEntry("Phi3Model", ("phi3",), None, decoder=True),
        ModelEntry("OlmoModel", ("olmo", "olmo2"), None, decoder=True),
    )


REGISTRY: dict[str, ModelEntry] = {t: e for e in _entries() for t in e.model_types}
"""model_type -> its entry."""


def register(entry: ModelEntry) -> None:
    """Add (or replace) an entry for its model types."""
    for model_type in entry.model_types:
        REGISTRY[model_type] = entry


@dataclass(frozen=True)
class BackbonePlan:
    """What runs a checkpoint: the registry entry, own backbone or the exact fallback and why, packing."""

    entry: str  # the registry entry's name ("" when the model type has none)
    own: bool
    backbone: str  # "module:Class" of the own backbone, or "transformers"
    reason: str  # why it is own or fallback (the config key that sent it to the fallback)
    causal: bool  # causal attention: decoder sequences over the token budget may run as chunked prefill

    @property
    def packing(self) -> bool:
        """Sequences share one flat token buffer (own backbones only); the fallback runs padded batches."""
        return self.own

    def describe(self) -> str:
        """One line for `embedcli info`."""
        where = f"own backbone {self.backbone}" if self.own else "transformers' modules (exact fallback)"
        return f"{where}; packing {'on' if self.packing else 'off (padded batches)'}: {self.reason}"


def unimplemented_key(entry: ModelEntry, config: Config) -> str | None:
    """`key=value (what it does)` of the first numbers-changing key the own backbone does not compute, or None."""
    for key in entry.keys:
        value = key.value(config)
        if not key.accepts(value, config):
            return f"config.json {key.name}={value!r} ({key.means})"
    return None


def plan_backbone(config: Config, head: str, choice: str = "auto") -> BackbonePlan:
    """The plan of a checkpoint with this config.json and head; `choice`: auto, own (refuse the fallback) or
    transformers (force it)."""
    model_type = str(config.get("model_type", ""))
    entry = REGISTRY.get(model_type)
    name = entry.name if entry else ""
    causal = entry.causal(config) if entry else bool(config.get("is_decoder"))
    remote = bool(config.get("auto_map")) and not (entry is not None and entry.replaces_remote_code)
    if remote:
        plan = BackbonePlan(name, False, "transformers", "the checkpoint defines its model in its own Python code (auto_map)", causal)
    elif entry is None or entry.backbone is None:
        why = (
            f"model_type {model_type!r} has no own backbone"
            if entry is not None
            else f"model_type {model_type!r} has no registry entry"
        )
        plan = BackbonePlan(name, False, "transformers", why, causal)
    elif head not in entry.heads:
        plan = BackbonePlan(name, False, "transformers", f"the own backbone does not serve the {head} head", causal)
    elif (key := unimplemented_key(entry, config)) is not None:
        plan = BackbonePlan(name, False, "transformers", f"{key} is not implemented by the own backbone", causal)
    elif choice == "transformers":
        plan = BackbonePlan(name, False, "transformers", "EMBEDCLI_BACKBONE=transformers", causal)
    else:
        plan = BackbonePlan(name, True, entry.backbone, f"registry entry {name} implements every numbers-changing key", causal)
    if choice == "own" and not plan.own:
        raise ConfigRefusedError(f"embedcli's own backbone cannot run this model: {plan.reason} (EMBEDCLI_BACKBONE=own)")
    return plan
