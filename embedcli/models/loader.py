"""Load a resolved model: tokenizer, the backbone its registry plan names (own, packed; or transformers' modules in
padded batches), projector and classifier heads."""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from torch import nn

from embedcli.errors import ConfigRefusedError, UnsupportedCheckpoint, UsageError
from embedcli.models.backbones.build import load_own_backbone
from embedcli.models.backbones.lm_heads import lm_pooler, lm_score_head, mlm_head
from embedcli.models.backbones.padded import HIDDEN, SEQUENCE_LOGITS, TOKEN_LOGITS, PaddedBackbone
from embedcli.models.checkpoint.remote_code import check_loadable
from embedcli.models.checkpoint.weights_file import check_safetensors
from embedcli.models.kernels.packing import PackInfo
from embedcli.models.m3_heads import m3_pooler
from embedcli.models.options import DTYPE_CHOICES, ModelOptions, check_model_flags
from embedcli.models.precision import (
    cpu_has_native_bf16,
    decide_auto_dtype,
    device_kind,
    task_for_head,
)
from embedcli.models.registry import REGISTRY, BackbonePlan, padding_index, plan_backbone
from embedcli.models.spec import DenseSpec, ModelConfigError, ModelSpec
from embedcli.models.tokenization.decoder_tokenizer import load_decoder_tokenizer_json
from embedcli.models.tokenization.tokenizer import (
    SpecialTokens,
    load_tokenizer_json,
    lowercase_inside,
    rebuilt_at_load,
)
from embedcli.pooling import (
    DispatchPooler,
    Pooler,
    PoolerConfig,
    get_activation,
    pooler_for_classify,
    pooler_for_embed,
    pooler_for_token_classify,
    pooler_for_token_embed,
    resolve_classifier_activation,
)
from embedcli.pooling.activations import load_st_activation, st_classifier_activation
from embedcli.pooling.params import SeqPoolingType
from embedcli.pooling.token_projection import load_token_projection

# Nothing downloads here: transformers only ever gets a resolved local folder and `local_files_only=True`.
# (The environment is left alone: `embedcli.models.checkpoint.resolve` downloads a Hub id before loading, unless the
# user set HF_HUB_OFFLINE.)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str = "auto") -> torch.device:
    """`auto` is CUDA when available, else CPU; `cuda:i` and `cpu` pass through (validated)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: CUDA is not available on this machine; use --device cpu or auto")
    return dev


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto`'s candidate: bfloat16 on CUDA and on CPUs with native bf16 matmuls, float32 elsewhere.

    On such a CPU bf16 runs ~1.9x faster; `LoadedModel` keeps it only where the model passes its parity
    probe (`embedcli.models.precision`), since some models drift past cosine 0.9999 in bf16.
    """
    if dtype == "auto":
        if device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16()):
            return torch.bfloat16
        return torch.float32
    try:
        return DTYPES[dtype]
    except KeyError:
        raise UsageError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPE_CHOICES)}") from None


def _load_dense(folder: Path, dense: DenseSpec) -> nn.Module:
    """A Dense module's Linear + activation; weights that fail to load are an error (vLLM skips silently)."""
    weights_path = folder / dense.path / "model.safetensors"
    if not weights_path.is_file():
        raise ModelConfigError(
            f"{weights_path}: missing; the Dense projector cannot be loaded (embedcli does not fall back to "
            "the raw pooled vector, which would silently change the embedding size)"
        )
    check_safetensors(weights_path)
    state = load_file(str(weights_path))
    linear = nn.Linear(dense.in_features, dense.out_features, bias=dense.bias)
    for prefix in ("linear.", "", "dense."):
        if f"{prefix}weight" in state:
            weight = state[f"{prefix}weight"]
            if tuple(weight.shape) != (dense.out_features, dense.in_features):
                raise ModelConfigError(
                    f"{weights_path}: weight shape {tuple(weight.shape)} does not match "
                    f"({dense.out_features}, {dense.in_features}) in its config.json"
                )
            linear.weight.data.copy_(weight)
            if dense.bias:
                if f"{prefix}bias" not in state:
                    raise ModelConfigError(f"{weights_path}: bias missing but config.json says bias=true")
                linear.bias.data.copy_(state[f"{prefix}bias"])
            return nn.Sequential(linear, load_st_activation(dense.activation))
    raise ModelConfigError(f"{weights_path}: no 'linear.weight' (or 'weight', 'dense.weight') tensor found")


def quantize_linear_int8(module: nn.Module) -> nn.Module:
    """Int8 dynamic quantization (per output channel) of every Linear layer; CPU only, lossy, opt-in."""
    # Imported here: torch.ao.quantization is loaded only for the opt-in int8 path.
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        # torch.ao.quantization is deprecated in favour of torchao, which is not a dependency here.
        warnings.simplefilter("ignore")
        return quantize_dynamic(module, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)


class LoadedModel:
    """A model ready to run packed forwards: tokenizer, backbone, pooler, on one device and dtype."""

    def __init__(self, spec: ModelSpec, options: ModelOptions | None = None) -> None:
        options = options or ModelOptions()
        check_model_flags(options)  # the options may have been changed since they were made
        self.spec = spec
        self.options = options
        self.device = resolve_device(options.device)
        if options.quantize and self.device.type != "cpu":
            raise UsageError(
                f"--quantize (int8 dynamic) runs on the CPU; --device {options.device} chose {self.device.type}: "
                "pass --device cpu or drop --quantize"
            )
        # int8 dynamic quantization runs on float32 weights; `auto` must not pick bf16 under it.
        quantized_auto = options.quantize and options.dtype == "auto"
        self.dtype = torch.float32 if quantized_auto else resolve_dtype(options.dtype, self.device)
        self.dtype_reason = _explicit_reason(options, self.dtype, quantized_auto)
        # `auto` with a bf16 candidate loads float32 weights and keeps bf16 only if the parity probe passes.
        probe_auto = options.dtype == "auto" and self.dtype == torch.bfloat16
        if probe_auto:
            self.dtype = torch.float32
        # bf16 on a CPU runs as autocast over float32 weights: matmuls in bf16, norms and the residual
        # stream in float32. Same speed as bf16 weights here, but min cosine vs float32 0.9999+ instead
        # of 0.99990 on long BBC articles (bf16 LayerNorm/residual rounding accumulates over layers).
        self.autocast = self.device.type == "cpu" and self.dtype == torch.bfloat16
        self.weight_dtype = torch.float32 if self.autocast else self.dtype
        self.plan = self._plan()
        own = self._load_own_backbone()
        self.own_backbone = own is not None
        self.tokenizer = self._load_tokenizer()
        if spec.do_lower_case:
            lowercase_inside(self.tokenizer)
        self.backbone, classifier = own if own is not None else self._load_backbone()
        self.pooler_config = PoolerConfig(
            seq_pooling_type=spec.seq_pooling_type,  # type: ignore[arg-type]  # a checked pooling name, kept as str in the spec
            include_prompt=spec.include_prompt,
            tok_pooling_type="STEP" if options.step_tag_id is not None or options.returned_token_ids else "ALL",
            use_activation=spec.normalize if spec.head == "base" else None,
            logit_mean=options.logit_mean,
            logit_sigma=options.logit_sigma,
            step_tag_id=options.step_tag_id,
            returned_token_ids=options.returned_token_ids,
        )
        self.pooler = self._build_pooler(classifier).to(self.device).eval()
        if probe_auto:
            self._settle_auto_dtype()

    # -- loading -----------------------------------------------------------------------------------
    def _plan(self) -> BackbonePlan:
        """The registry's plan: the spec's (planned with EMBEDCLI_BACKBONE), or again for another choice."""
        spec = self.spec
        if self.options.backbone == "auto" and spec.backbone_reason:
            return BackbonePlan(spec.registry_entry, spec.own_backbone, spec.backbone, spec.backbone_reason, spec.causal)
        config = read_config(spec.path)
        plan = plan_backbone(config, spec.head, self.options.backbone)
        check_loadable(Path(spec.path), config, plan, self.options.trust_remote_code)
        return plan

    def _load_own_backbone(self) -> tuple[nn.Module, nn.Module | None] | None:
        """embedcli's own backbone (and head) for this model, or None where transformers' modules serve it."""
        if not self.plan.own:
            return None
        try:
            model, classifier = load_own_backbone(self.spec, self.plan.backbone, self.weight_dtype, self.device)
        except UnsupportedCheckpoint as e:
            # The registry declared every numbers-changing key implemented: a refusal here is a registry gap.
            raise ConfigRefusedError(f"{self.spec.path}: the own backbone {self.plan.backbone} refused it: {e}") from e
        if self.options.quantize:  # on the CPU in float32: checked in __init__ and by ModelOptions
            model = quantize_linear_int8(model)
        return model, classifier

    def _load_tokenizer(self) -> Tokenizer:
        path = Path(self.spec.path)
        if self.own_backbone and (path / "tokenizer.json").is_file():
            if self.spec.is_decoder:
                # transformers rebuilds some decoder tokenizers (Qwen2Tokenizer, LlamaTokenizer, ...) at load;
                # only those it takes from tokenizer.json as they are load here, the others below. A file the
                # mirror cannot read goes to transformers too, which loads it or says what is wrong.
                try:
                    loaded = load_decoder_tokenizer_json(path)
                except Exception:
                    loaded = None
            elif rebuilt_at_load(path):
                loaded = None  # transformers' class rebuilds it (XLM-R's SentencePiece): its ids, as ST's
            else:
                try:
                    loaded = load_tokenizer_json(path)
                except Exception as e:
                    raise ModelConfigError(f"{path / 'tokenizer.json'}: the tokenizer could not be loaded ({e})") from e
            if loaded is not None:
                tokenizer, self.hf_tokenizer = loaded
                return tokenizer
        from transformers import AutoTokenizer  # heavy; only the fallback path needs it

        try:
            hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
        except Exception as e:
            raise ModelConfigError(f"{path}: the tokenizer could not be loaded ({e}); is tokenizer.json intact?") from e
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is None:
            raise ModelConfigError(f"{path}: no fast tokenizer (tokenizer.json) could be built for this model")
        tokenizer = Tokenizer.from_str(backend.to_str())
        # tokenizer.json does not carry split_special_tokens; transformers sets it on its backend at load.
        tokenizer.encode_special_tokens = backend.encode_special_tokens
        # The runner packs without padding and truncates per call.
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.hf_tokenizer = cast("SpecialTokens", hf)
        return tokenizer

    def _load_backbone(self) -> tuple[nn.Module, nn.Module | None]:
        """transformers' own modules (the exact fallback), in padded batches with their own attention."""
        import transformers  # heavy; loaded only when a model is built

        # Our own progress goes to stderr; transformers' per-weight loading bar is noise there.
        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()

        spec = self.spec
        # Any: from_pretrained's stubs type each keyword apart, and a dict[str, object] matches none of them.
        kwargs: dict[str, Any] = {
            "dtype": self.weight_dtype,
            "local_files_only": True,
            "trust_remote_code": self.options.trust_remote_code,
            "use_safetensors": not any(w.endswith((".bin", ".pt")) for w in spec.weights),
        }
        auto = {
            "base": transformers.AutoModel,
            "sequence_classification": transformers.AutoModelForSequenceClassification,
            "token_classification": transformers.AutoModelForTokenClassification,
            "lm_score": transformers.AutoModelForCausalLM,
            "sparse": transformers.AutoModelForMaskedLM,
        }[spec.head]
        entry = REGISTRY.get(spec.model_type)
        if spec.head == "base" and entry is not None and entry.base_class is not None:
            auto = getattr(transformers, entry.base_class)
        try:
            model = auto.from_pretrained(spec.path, **kwargs)
        except (OSError, ValueError, RuntimeError, ImportError) as e:
            raise ModelConfigError(f"{spec.path}: transformers could not load the model: {_first_line(e)}") from e
        model = model.to(self.device).eval()
        if self.options.quantize:
            model = quantize_linear_int8(model)
        for p in model.parameters():
            p.requires_grad_(False)
        pad_id = _pad_id(model.config, getattr(self, "hf_tokenizer", None))
        padded: dict[str, Any] = {"pad_id": pad_id, "token_types": True}
        classifier: nn.Module | None = None
        if spec.head == "base":
            return PaddedBackbone(model, output=HIDDEN, **padded), None
        if spec.head in ("lm_score", "sparse"):
            # Only the LM head's rows for the score tokens are kept; the [vocab, hidden] head is dropped.
            classifier = lm_score_head(model, spec) if spec.head == "lm_score" else mlm_head(model, spec)
            return PaddedBackbone(getattr(model, model.base_model_prefix), output=HIDDEN, **padded), classifier
        # A classifier runs whole, as transformers (and CrossEncoder) run it, whatever its head is made of: its
        # logits come out on the row the classify pooler picks, which then applies the identity.
        if spec.head == "sequence_classification":
            backbone = PaddedBackbone(model, output=SEQUENCE_LOGITS, pool_last=spec.is_decoder, **padded)
        else:
            backbone = PaddedBackbone(model, output=TOKEN_LOGITS, **padded)
        return backbone, nn.Identity()

    def _build_pooler(self, classifier: nn.Module | None) -> Pooler:
        spec, cfg = self.spec, self.pooler_config
        head_dtype = torch.float32
        if spec.head in ("lm_score", "sparse"):
            return lm_pooler(spec, self.options, classifier)
        if spec.head == "base" and spec.late_interaction is not None:
            # ColBERT: hidden -> token projection -> L2 per token (the head's normalization), token_embed only.
            return DispatchPooler({"token_embed": pooler_for_token_embed(cfg, self._token_projection(), head_dtype)})
        if spec.head == "base":
            projector = None
            if spec.projector:
                folder = Path(spec.path)
                projector = nn.Sequential(*(_load_dense(folder, d) for d in spec.projector)).to(torch.float32)
            if spec.m3_heads:  # BGE-M3: FlagEmbedding's colbert and sparse heads beside the dense vector
                return m3_pooler(spec, pooler_for_embed(cfg, projector, head_dtype), self.hf_tokenizer,
                                 self.options.m3_outputs)
            return DispatchPooler(
                {
                    "embed": pooler_for_embed(cfg, projector, head_dtype),
                    "token_embed": pooler_for_token_embed(cfg, projector, head_dtype),
                }
            )
        config = self.backbone.config
        if spec.head == "sequence_classification":
            if self.options.activation:
                activation = get_activation(self.options.activation, spec.num_labels)
            elif spec.ce_activation:
                activation = st_classifier_activation(load_st_activation(spec.ce_activation))
            else:
                activation = resolve_classifier_activation(config)
            default: SeqPoolingType = "LAST" if spec.is_decoder else "CLS"
            pooling = getattr(config, "classifier_pooling", None) or "cls"
            if self.own_backbone and spec.model_type == "modernbert" and pooling == "mean":
                default = "MEAN"  # ModernBERT's classifier_pooling: its head takes the mean of the tokens
            return DispatchPooler(
                {
                    "classify": pooler_for_classify(
                        PoolerConfig(seq_pooling_type=default, logit_mean=cfg.logit_mean, logit_sigma=cfg.logit_sigma),
                        classifier,
                        activation,
                        head_dtype,
                        num_labels=spec.num_labels,
                    )
                }
            )
        if self.options.activation:
            activation = get_activation(self.options.activation, None)
        else:
            activation = resolve_classifier_activation(config, static_num_labels=False)
        return DispatchPooler({"token_classify": pooler_for_token_classify(cfg, classifier, activation, head_dtype)})

    def _token_projection(self) -> nn.Module:
        """A late-interaction model's token projection: its Dense modules (PyLate), or the Linear whose weight
        lies beside the encoder's (Stanford's root `linear.weight`), loaded alone."""
        spec, folder = self.spec, Path(self.spec.path)
        layers: list[nn.Module] = []
        for dense in spec.projector:
            if dense.path or dense.activation != "torch.nn.modules.linear.Identity":
                layers.append(_load_dense(folder, dense))
                continue
            layers.append(load_token_projection(
                folder / "model.safetensors", "linear.weight", "linear.bias" if dense.bias else None,
                (dense.out_features, dense.in_features),
            ))
        return nn.Sequential(*layers).to(torch.float32)

    def _settle_auto_dtype(self) -> None:
        """Resolve `auto` between float32 (loaded) and bf16 by the model's parity probe (cached per model)."""
        task = self.options.task or task_for_head(self.spec.head)
        decision = decide_auto_dtype(
            self, task, self._bf16_trial, kind=device_kind(self.device), bar=self.options.parity_bar
        )
        # The same words whether probed now or read from the cache: outputs of one set must agree.
        self.dtype_decision = decision
        self.dtype_reason = decision.reason
        if decision.dtype == "bfloat16":
            self._use_bf16()

    def _use_bf16(self) -> None:
        self.dtype = torch.bfloat16
        # CPU: autocast over float32 weights (see __init__); CUDA: bf16 weights.
        self.autocast = self.device.type == "cpu"
        if not self.autocast:
            self.backbone.to(torch.bfloat16)
            self.weight_dtype = torch.bfloat16

    @contextlib.contextmanager
    def _bf16_trial(self) -> Iterator[None]:
        """Forwards inside run as `--dtype bfloat16` would; the float32 weights are left untouched."""
        saved = self.dtype, self.autocast, self.weight_dtype, self.backbone
        if self.device.type != "cpu":
            self.backbone = copy.deepcopy(self.backbone)
        try:
            self._use_bf16()
            yield
        finally:
            self.dtype, self.autocast, self.weight_dtype, self.backbone = saved

    @property
    def causal(self) -> bool:
        """Whether attention is causal (what chunked prefill needs): the registry's plan for the checkpoint."""
        return self.plan.causal

    @property
    def can_slice(self) -> bool:
        """Whether a sequence over the token budget may run in chunked-prefill slices: causal attention on an own
        backbone (whose KV-cache attention keeps its windows and caps); the fallback runs such a sequence whole."""
        return self.plan.causal and self.own_backbone

    # -- running -----------------------------------------------------------------------------------
    def position_ids(self, lengths: list[int], input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Positions restarting at each sequence; fairseq style where the model has it (RoBERTa, MPNet): from the
        padding index + 1, a token equal to the padding id taking the padding index and not counted, as
        transformers' `create_position_ids_from_input_ids` numbers them from the ids."""
        if not self.spec.position_offset:
            return torch.cat([torch.arange(n) for n in lengths])
        pad = padding_index(self.spec.model_type, {"pad_token_id": getattr(self.backbone.config, "pad_token_id", None)})
        if input_ids is None:
            return torch.cat([torch.arange(pad + 1, n + pad + 1) for n in lengths])
        # A literal pad token in a text ("<pad>"), which the tokenizer turns into the padding id.
        real = input_ids.ne(pad).long()
        counted = torch.cat([real.new_zeros(1), real.cumsum(0)])
        sizes = torch.tensor(lengths, dtype=torch.long, device=input_ids.device)
        starts = sizes.cumsum(0) - sizes
        before = counted[starts].repeat_interleave(sizes)
        return (counted[1:] - before) * real + pad

    def compute_context(self) -> contextlib.AbstractContextManager[object]:
        """The autocast region every backbone forward runs in (a no-op unless CPU bf16)."""
        if not self.autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type="cpu", dtype=torch.bfloat16)

    @torch.inference_mode()
    def forward_packed(
        self,
        input_ids: torch.Tensor,
        lengths: list[int],
        token_type_ids: torch.Tensor | None = None,
        keys: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Last hidden states `[total, hidden]` of sequences laid end to end in `input_ids`; `keys` (bool per
        token): False for a token no other token attends to (ColBERT's unattended query expansion)."""
        with self.compute_context():
            return self._forward_packed(input_ids, lengths, token_type_ids, keys)

    def forward_with_prefix(
        self, input_ids: torch.Tensor, positions: torch.Tensor, pack: PackInfo | None, prefix: object
    ) -> torch.Tensor:
        """Decoders, chunked prefill: hidden states of whole sequences (`pack`) then one slice (`prefix`).

        Runs inside the caller's inference mode and `compute_context`; `prefix` is a `kv_cache.PrefixSlice`.
        """
        if not self.own_backbone:
            raise RuntimeError("chunked prefill runs on own backbones only (the fallback runs whole sequences)")
        return self.backbone(input_ids, positions, pack, None, prefix)

    def _forward_packed(
        self, input_ids: torch.Tensor, lengths: list[int], token_type_ids: torch.Tensor | None,
        keys: torch.Tensor | None = None,
    ) -> torch.Tensor:
        pack = PackInfo.build(lengths, self.device, keys)
        ids = input_ids.to(self.device, non_blocking=True)
        positions = self.position_ids(lengths, input_ids).to(self.device, non_blocking=True)
        types = None if token_type_ids is None else token_type_ids.to(self.device, non_blocking=True)
        return self.backbone(ids, positions, pack, types)


def _explicit_reason(options: ModelOptions, dtype: torch.dtype, quantized_auto: bool) -> str:
    """Why the dtype is what it is when no parity probe runs."""
    name = str(dtype).removeprefix("torch.")
    if options.dtype != "auto":
        return f"--dtype {options.dtype}"
    if quantized_auto:
        return "auto: float32 under --quantize (int8 dynamic quantization runs on float32 weights)"
    if dtype == torch.float32:
        return "auto: float32 on this device (no native bf16 matmul)"
    return f"auto: {name}"


def read_config(folder: str) -> dict[str, object]:
    """The model's config.json."""
    import json

    with (Path(folder) / "config.json").open(encoding="utf-8") as f:
        return dict(json.load(f))


def _pad_id(config: object, tokenizer: object) -> int:
    """The id padded slots get: the config's, else the tokenizer's, else 0 (masked out either way; RoBERTa-style
    position ids need the config's padding index there)."""
    for value in (getattr(config, "pad_token_id", None), getattr(tokenizer, "pad_token_id", None)):
        if isinstance(value, int) and value >= 0:
            return value
    return 0


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
