"""The model registry: every numbers-changing config key either keeps parity on the own backbone or sends the
model to the exact fallback (where parity holds) — never exit 0 with other numbers.

The flips below are this test's own list, written from transformers' config classes, not read from the
registry: dropping a key from an entry makes the own backbone run a config it does not compute (it refuses,
or its numbers move), and the parity check here fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from embedcli.models import registry
from embedcli.models.backbones import layers
from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.registry import REGISTRY, plan_backbone
from embedcli.models.spec import load_model_spec
from tests.fixtures.tiny_models import (
    DECODER_KW,
    ENCODER_KW,
    LONG_TEXT,
    PAD_ID,
    SAMPLE_TEXTS,
    write_tokenizer,
)

TEXTS = (*SAMPLE_TEXTS[:4], LONG_TEXT[:200])  # longer than every window flipped on below (8 tokens)
BUDGETS = (24, 96, 4096)
YARN = {"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0, "original_max_position_embeddings": 64}
LINEAR = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}

# (model_type, config key, flipped value): each changes what transformers computes on these texts.
FLIPS: list[tuple[str, str, Any]] = [
    ("bert", "hidden_act", "gelu_new"),
    ("bert", "hidden_act", "mish"),
    ("bert", "layer_norm_eps", 1e-3),
    ("bert", "type_vocab_size", 3),
    ("bert", "is_decoder", True),
    ("bert", "position_embedding_type", "relative_key"),
    ("roberta", "hidden_act", "relu"),
    ("xlm-roberta", "layer_norm_eps", 1e-3),
    ("distilbert", "activation", "relu"),
    ("distilbert", "sinusoidal_pos_embds", True),
    ("mpnet", "hidden_act", "silu"),
    ("mpnet", "relative_attention_num_buckets", 64),
    ("llama", "rope_parameters", LINEAR),
    ("llama", "rope_parameters", YARN),
    ("llama", "mlp_bias", True),
    ("llama", "attention_bias", True),
    ("llama", "hidden_act", "gelu_pytorch_tanh"),
    ("llama", "rms_norm_eps", 1e-2),
    ("mistral", "sliding_window", 8),
    ("mistral", "head_dim", 16),
    ("qwen2", "use_sliding_window", True),
    ("qwen2", "hidden_act", "mish"),
    ("qwen3", "rope_parameters", YARN),
    ("qwen3", "attention_bias", True),
    ("gemma2", "attn_logit_softcapping", 2.0),
    ("gemma2", "sliding_window", 4),
    ("gemma3_text", "attn_logit_softcapping", 2.0),
    ("gemma3_text", "sliding_window", 4),
    ("gemma3_text", "use_bidirectional_attention", True),
    ("modernbert", "local_attention", 8),
    ("modernbert", "hidden_activation", "mish"),
]


def _build(model_type: str, folder: Path, key: str, value: Any) -> Path:
    """A tiny random checkpoint of `model_type` built by transformers with `key` set to `value`."""
    import transformers as tf

    folder.mkdir(parents=True)
    decoder = model_type in ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text")
    vocab = write_tokenizer(folder, decoder=decoder)
    torch.manual_seed(11)
    kw: dict[str, Any] = {"vocab_size": vocab}
    if model_type == "distilbert":
        kw.update(dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=128, pad_token_id=PAD_ID,
                  dropout=0.0, attention_dropout=0.0, initializer_range=0.2)
    elif decoder:
        kw.update(DECODER_KW)
    elif model_type == "modernbert":
        kw.update(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=128, pad_token_id=PAD_ID, global_attn_every_n_layers=2, local_attention=16)
    else:
        kw.update(ENCODER_KW)
        if model_type in ("roberta", "xlm-roberta"):
            kw["type_vocab_size"] = 1
    if model_type == "qwen2" and key == "use_sliding_window":
        kw.update(sliding_window=8, max_window_layers=0)
    kw[key] = value
    config = tf.AutoConfig.for_model(model_type, **kw)
    model = (tf.AutoModelForCausalLM if decoder else tf.AutoModel).from_config(config).eval()
    model.save_pretrained(str(folder))
    return folder


def _max_diff(loaded: LoadedModel, reference: torch.nn.Module, budget: int) -> float:
    ids = [loaded.hf_tokenizer(t).input_ids for t in TEXTS]
    worst, start = 0.0, 0
    while start < len(ids):  # greedy packs under the budget, in order
        end, used = start, 0
        while end < len(ids) and (end == start or used + len(ids[end]) <= budget):
            used += len(ids[end])
            end += 1
        seqs = ids[start:end]
        hidden = loaded.forward_packed(torch.tensor([t for s in seqs for t in s]), [len(s) for s in seqs])
        for seq, got in zip(seqs, torch.split(hidden, [len(s) for s in seqs]), strict=True):
            with torch.inference_mode():
                want = reference(input_ids=torch.tensor([seq])).last_hidden_state[0]
            worst = max(worst, (got - want).abs().nan_to_num(nan=float("inf")).max().item())
        start = end
    return worst


@pytest.mark.parametrize(("model_type", "key", "value"), FLIPS, ids=[f"{t}-{k}={v}" for t, k, v in FLIPS])
def test_flipped_key_keeps_parity_or_falls_back(tmp_path: Path, model_type: str, key: str, value: Any) -> None:
    import transformers as tf

    folder = _build(model_type, tmp_path / "m", key, value)
    spec = load_model_spec(str(folder), backbone="auto")
    loaded = LoadedModel(spec, ModelOptions(device="cpu", dtype="float32", backbone="auto"))
    assert loaded.own_backbone == spec.own_backbone
    if not spec.own_backbone:
        assert spec.backbone_reason, "a fallback says why"
    reference = tf.AutoModel.from_pretrained(str(folder)).eval()
    for budget in BUDGETS:
        assert _max_diff(loaded, reference, budget) <= 1e-5, (spec.backbone, spec.backbone_reason, budget)


@pytest.mark.parametrize("model_type", sorted({t for t, _, _ in FLIPS}))
def test_unflipped_checkpoint_runs_on_the_own_backbone(tmp_path: Path, model_type: str) -> None:
    key = "initializer_range"  # changes no number
    spec = load_model_spec(str(_build(model_type, tmp_path / "m", key, 0.2)), backbone="auto")
    assert spec.own_backbone and spec.packing, spec.backbone_reason


def test_declared_activations_are_the_implemented_ones() -> None:
    assert set(layers.ACTIVATIONS) == registry.OWN_ACTIVATIONS


def test_every_own_entry_names_an_importable_backbone() -> None:
    from embedcli.models.backbones.build import backbone_class

    for entry in set(REGISTRY.values()):
        if entry.backbone is not None:
            assert isinstance(backbone_class(entry.backbone), type), entry.name


@pytest.mark.parametrize(
    ("config", "head", "choice", "own", "why"),
    [
        ({"model_type": "bert"}, "base", "auto", True, "implements every"),
        ({"model_type": "bert"}, "base", "transformers", False, "EMBEDCLI_BACKBONE=transformers"),
        ({"model_type": "bert"}, "lm_score", "auto", False, "does not serve the lm_score head"),
        ({"model_type": "bert", "hidden_act": "mish"}, "base", "auto", False, "hidden_act='mish'"),
        ({"model_type": "bert", "auto_map": {"AutoModel": "m.M"}}, "base", "auto", False, "own Python code (auto_map)"),
        ({"model_type": "t5"}, "base", "auto", False, "has no own backbone"),
        ({"model_type": "whatever"}, "base", "auto", False, "has no registry entry"),
        ({"model_type": "mistral", "sliding_window": 4096, "max_position_embeddings": 32768}, "base", "auto", False,
         "sliding_window=4096"),
        ({"model_type": "mistral", "sliding_window": 4096, "max_position_embeddings": 4096}, "base", "auto", True, ""),
    ],
)
def test_plan_backbone(config: dict[str, Any], head: str, choice: str, own: bool, why: str) -> None:
    plan = plan_backbone(config, head, choice)
    assert plan.own == own and plan.packing == own
    assert why in plan.reason


def test_own_choice_refuses_the_fallback() -> None:
    from embedcli.errors import ConfigRefusedError

    with pytest.raises(ConfigRefusedError, match=r"hidden_act='mish'.*EMBEDCLI_BACKBONE=own"):
        plan_backbone({"model_type": "bert", "hidden_act": "mish"}, "base", "own")


@pytest.mark.parametrize(("model_type", "key", "value"), FLIPS, ids=[f"{t}-{k}={v}" for t, k, v in FLIPS])
def test_an_own_backbone_built_directly_refuses_what_its_entry_does_not_implement(
    tmp_path: Path, model_type: str, key: str, value: Any
) -> None:
    """The backbone's load-time guard reads the same declarations as the plan: no second list to drift."""
    from embedcli.models.backbones.build import backbone_class
    from embedcli.models.backbones.layers import JsonConfig, UnsupportedCheckpoint, skip_init_weights
    from embedcli.models.registry import REGISTRY, unimplemented_key

    folder = _build(model_type, tmp_path / "m", key, value)
    config = JsonConfig.read(folder)
    entry = REGISTRY[model_type]
    assert entry.backbone is not None
    with skip_init_weights():
        if unimplemented_key(entry, vars(config)) is None:
            backbone_class(entry.backbone)(config)
        else:
            with pytest.raises(UnsupportedCheckpoint, match="not implemented by the own backbone"):
                backbone_class(entry.backbone)(config)
