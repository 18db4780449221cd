"""embedcli's own ModernBERT backbone (models/modernbert.py) against transformers and sentence-transformers.

Tiny random checkpoints (tests/fixtures/modernbert.py) with an 8-token local window and a global layer
every third, run on texts of up to ~130 tokens: alone and packed under three token budgets.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from embedcli.compute.runner import Runner, RunnerOptions
from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.spec import load_model_spec
from tests.fixtures.modernbert import (
    TEXTS,
    build_modernbert,
    build_modernbert_cross_encoder,
    build_modernbert_st,
)
from tests.fixtures.tiny_models import copy_model, edit_json

BUDGETS = (24, 96, 4096)
PAIRS = [
    ("hello", TEXTS[1]),
    ("market shares rise", TEXTS[6]),
    ("  spaced query ", "zzz"),
    (TEXTS[3], TEXTS[10]),
]
# name -> build_modernbert keyword arguments
VARIANTS: dict[str, dict[str, object]] = {
    "hub-keys": {},
    "transformers5-keys": {"modern_config": True},
    "biases": {"attention_bias": True, "mlp_bias": True, "norm_bias": True, "norm_eps": 1e-6},
    "gelu-tanh-every-2": {"hidden_activation": "gelu_pytorch_tanh", "global_attn_every_n_layers": 2,
                          "local_attention": 6},
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`models(name, **kwargs) -> folder`, each built once per module."""
    root = tmp_path_factory.mktemp("modernbert")
    built: dict[str, Path] = {}

    def get(name: str, builder: Callable[..., Path] = build_modernbert, **kwargs: object) -> Path:
        if name not in built:
            built[name] = builder(root / name, **kwargs)
        return built[name]

    return get


def _load(folder: Path, backbone: str = "own", **options: object) -> LoadedModel:
    return LoadedModel(
        load_model_spec(str(folder)), ModelOptions(device="cpu", dtype="float32", backbone=backbone, **options)
    )


def _packs(lengths: list[int], budget: int) -> list[list[int]]:
    packs: list[list[int]] = [[]]
    used = 0
    for i, n in enumerate(lengths):
        if packs[-1] and used + n > budget:
            packs.append([])
            used = 0
        packs[-1].append(i)
        used += n
    return packs


def _max_diff_alone(loaded: LoadedModel, reference, budget: int) -> float:  # type: ignore[no-untyped-def]
    """Max |ours - transformers| over the last hidden states of TEXTS, ours packed under `budget`."""
    ids = [loaded.tokenizer.encode(t).ids for t in TEXTS]
    lengths = [len(x) for x in ids]
    assert max(lengths) > 100 and sum(n > 8 for n in lengths) >= 6, lengths
    worst = 0.0
    for members in _packs(lengths, budget):
        seqs = [ids[i] for i in members]
        hidden = loaded.forward_packed(torch.tensor([t for s in seqs for t in s]), [len(s) for s in seqs])
        for seq, got in zip(seqs, torch.split(hidden, [len(s) for s in seqs]), strict=True):
            with torch.inference_mode():
                want = reference(input_ids=torch.tensor([seq])).last_hidden_state[0]
            worst = max(worst, (got - want).abs().nan_to_num(nan=float("inf")).max().item())
    return worst


def _reference(folder: Path, cls_name: str = "AutoModel"):  # type: ignore[no-untyped-def]
    import transformers

    model = getattr(transformers, cls_name).from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32)
    return model.eval()


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("budget", BUDGETS)
def test_last_hidden_state_matches_transformers(variant, budget, models) -> None:
    folder = models(variant, **VARIANTS[variant])
    loaded = _load(folder)
    assert loaded.own_backbone
    worst = _max_diff_alone(loaded, _reference(folder), budget)
    assert worst <= 1e-5, f"{variant} at budget {budget}: max |diff| {worst:.3g}"


def test_transformers_fallback_keeps_the_local_window(models) -> None:
    """The transformers modules on the packed attention (EMBEDCLI_BACKBONE=transformers) honour the window too."""
    folder = models("hub-keys")
    loaded = _load(folder, "transformers")
    assert not loaded.own_backbone
    assert _max_diff_alone(loaded, _reference(folder), 4096) <= 1e-5


def test_window_and_thetas_are_read(models, tmp_path) -> None:
    """Another window, layer pattern or theta changes the numbers: the own backbone follows each key."""
    base = models("hub-keys")
    reference = _reference(base)
    for change in ({"local_attention": 16}, {"global_attn_every_n_layers": 1}, {"local_rope_theta": 10000.0},
                   {"global_rope_theta": 160000.0}):
        folder = copy_model(base, tmp_path / "-".join(change))
        edit_json(folder / "config.json", lambda c, change=change: c.update(change))
        assert _max_diff_alone(_load(folder), reference, 4096) > 1e-3, change
        assert _max_diff_alone(_load(folder), _reference(folder), 4096) <= 1e-5, change


def test_own_backbone_is_used(models) -> None:
    loaded = _load(models("hub-keys"), "auto")
    assert loaded.own_backbone and type(loaded.backbone).__module__ == "embedcli.models.backbones.modernbert"
    assert loaded.spec.model_type == "modernbert" and loaded.position_ids([3, 2]).tolist() == [0, 1, 2, 0, 1]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
        ({"rope_parameters": {"full_attention": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1.0}}},
         "rope_parameters=.*'dynamic'"),
        ({"classifier_pooling": "max"}, "classifier_pooling"),
        ({"hidden_activation": "mish"}, "hidden_activation='mish'"),
        ({"layer_types": ["full_attention", "chunked_attention"] * 2 + ["full_attention"]}, "layer_types"),
        ({"head_dim": 16}, "head_dim"),
    ],
)
def test_unsupported_configs_fall_back(change, why, models, tmp_path) -> None:
    from embedcli.errors import ConfigRefusedError

    folder = copy_model(models("hub-keys"), tmp_path / "refused")
    edit_json(folder / "config.json", lambda c: c.update(change))
    with pytest.raises(ConfigRefusedError, match=why):
        _load(folder, "own")
    if why == "rope_scaling":  # one transformers computes: `auto` runs its modules instead
        assert not _load(folder, "auto").own_backbone


# -- end to end: sentence-transformers -----------------------------------------------------------------


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_embed_matches_sentence_transformers(pooling, models) -> None:
    """modernbert-embed (mean, prompts) and gte-modernbert (cls) layouts, as SentenceTransformer.encode."""
    from sentence_transformers import SentenceTransformer

    folder = models(f"st-{pooling}", build_modernbert_st, base=models("hub-keys"), pooling=pooling)
    loaded = _load(folder, "auto")
    assert loaded.own_backbone and loaded.spec.normalize and loaded.spec.seq_pooling_type == pooling.upper()
    st = SentenceTransformer(str(folder), device="cpu")
    for prompt_name in (None, "query", "document"):
        prompt = loaded.spec.prompt(prompt_name) if prompt_name else ""
        for budget in (24, 4096):
            got = Runner(loaded, RunnerOptions(prompt=prompt, max_batch_tokens=budget)).embed(list(TEXTS))
            want = st.encode(list(TEXTS), prompt_name=prompt_name)
            assert np.abs(got - want).max() <= 1e-5, (prompt_name, budget)


@pytest.mark.parametrize("classifier_pooling", ["mean", "cls"])
def test_cross_encoder_matches_predict(classifier_pooling, models) -> None:
    from sentence_transformers import CrossEncoder

    folder = models(f"ce-{classifier_pooling}", build_modernbert_cross_encoder, classifier_pooling=classifier_pooling)
    loaded = _load(folder, "auto")
    assert loaded.own_backbone and loaded.spec.num_labels == 1
    want = CrossEncoder(str(folder), device="cpu").predict(PAIRS)
    for budget in (24, 4096):
        got = Runner(loaded, RunnerOptions(task="classify", max_batch_tokens=budget)).embed(PAIRS)
        assert np.abs(np.asarray(got).reshape(-1) - want).max() <= 1e-5, budget


@pytest.mark.parametrize("classifier_pooling", ["mean", "cls"])
def test_sequence_classifier_logits_match_transformers(classifier_pooling, models) -> None:
    folder = models(
        f"seq-{classifier_pooling}", head="ForSequenceClassification", classifier_pooling=classifier_pooling,
        classifier_bias=True, classifier_activation="silu",
    )
    reference = _reference(folder, "ModernBertForSequenceClassification")
    for backbone in ("own", "transformers"):
        loaded = _load(folder, backbone, activation="none")
        assert loaded.own_backbone is (backbone == "own")
        got = Runner(loaded, RunnerOptions(task="classify", max_batch_tokens=96)).embed(list(TEXTS))
        with torch.inference_mode():
            want = torch.cat([reference(input_ids=torch.tensor([loaded.tokenizer.encode(t).ids])).logits for t in TEXTS])
        assert np.abs(np.asarray(got) - want.numpy()).max() <= 1e-5, backbone


def test_token_classifier_matches_transformers(models) -> None:
    folder = models("tok", head="ForTokenClassification", num_labels=5)
    reference = _reference(folder, "ModernBertForTokenClassification")
    for backbone in ("own", "transformers"):
        loaded = _load(folder, backbone, activation="none")
        assert loaded.own_backbone is (backbone == "own")
        results = next(Runner(loaded, RunnerOptions(task="token_classify", max_batch_tokens=96)).map([list(TEXTS)]))
        for text, got in zip(TEXTS, results, strict=True):
            with torch.inference_mode():
                want = reference(input_ids=torch.tensor([loaded.tokenizer.encode(text).ids])).logits[0]
            assert np.asarray(got).shape == tuple(want.shape)
            assert np.abs(np.asarray(got) - want.numpy()).max() <= 1e-5, backbone


def test_tokenizer_matches_transformers(models) -> None:
    """The BPE tokenizer.json with its [CLS] ... [SEP] template, read without transformers, as AutoTokenizer."""
    from transformers import AutoTokenizer

    folder = models("hub-keys")
    loaded = _load(folder, "own")
    hf = AutoTokenizer.from_pretrained(str(folder))
    for text in TEXTS:
        assert loaded.tokenizer.encode(text).ids == hf(text)["input_ids"]
    for a, b in PAIRS:
        assert loaded.tokenizer.encode(a, b).ids == hf(a, b)["input_ids"]
    ids = loaded.tokenizer.encode("hello").ids
    assert ids[0] == loaded.hf_tokenizer.cls_token_id and ids[-1] == loaded.hf_tokenizer.sep_token_id


def test_bf16_autocast_runs_close_to_float32(models) -> None:
    """CPU bf16 (autocast over float32 weights): RoPE stays float32, the band mask goes to the bf16 matmuls."""
    folder = models("st-mean", build_modernbert_st, base=models("hub-keys"), pooling="mean")
    want = Runner(_load(folder, "auto"), RunnerOptions(max_batch_tokens=96)).embed(list(TEXTS))
    loaded = LoadedModel(load_model_spec(str(folder)), ModelOptions(device="cpu", dtype="bfloat16", backbone="own"))
    assert loaded.own_backbone and loaded.autocast
    got = Runner(loaded, RunnerOptions(max_batch_tokens=96)).embed(list(TEXTS))
    cosine = (got * want).sum(axis=1)
    print(f"bf16 vs float32: min cosine {cosine.min():.6f}")
    assert np.isfinite(got).all() and cosine.min() >= 0.999
