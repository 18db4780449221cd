"""embedcli's own packed backbones (models/backbones/bert.py ... qwen3.py) against transformers.

The reference is transformers' own eager forward of each sequence alone; ours runs packed under three
token budgets. Heads are checked against the transformers-module path of the same loader.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from embedcli.compute.runner import Runner, RunnerOptions
from embedcli.errors import UsageError
from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.spec import ModelConfigError, load_model_spec
from tests.fixtures.tiny_models import (
    DECODER_KW,
    DECODERS,
    ENCODER_KW,
    ENCODERS,
    LONG_TEXT,
    SAMPLE_TEXTS,
    copy_model,
    edit_json,
    write_tokenizer,
)

BUDGETS = (24, 96, 4096)
FAMILIES = ENCODERS + DECODERS
TEXTS = (*SAMPLE_TEXTS, LONG_TEXT[:200], "fox", "the bank deal", SAMPLE_TEXTS[1])


def _load(folder: Path, backbone: str) -> LoadedModel:
    return LoadedModel(load_model_spec(str(folder)), ModelOptions(device="cpu", dtype="float32", backbone=backbone))


def _packs(lengths: list[int], budget: int) -> list[list[int]]:
    """Sequence indices of each forward, in input order, greedily filled up to `budget` tokens."""
    packs: list[list[int]] = [[]]
    used = 0
    for i, n in enumerate(lengths):
        if packs[-1] and used + n > budget:
            packs.append([])
            used = 0
        packs[-1].append(i)
        used += n
    return packs


@pytest.mark.parametrize("name", FAMILIES)
def test_own_backbone_is_used(name, tiny_model) -> None:
    loaded = _load(tiny_model(name), "auto")
    assert loaded.own_backbone
    assert type(loaded.backbone).__module__.startswith("embedcli.models.")
    forced = _load(tiny_model(name), "transformers")
    assert not forced.own_backbone and type(forced.backbone.model).__module__.startswith("transformers.")


def _max_diff_alone(loaded: LoadedModel, reference, texts, budget: int) -> float:  # type: ignore[no-untyped-def]
    """Max |ours - transformers| over the last hidden states of `texts`, ours packed under `budget`."""
    ids = [loaded.tokenizer.encode(t.strip()).ids for t in texts]
    lengths = [len(x) for x in ids]
    packs = _packs(lengths, budget)
    assert (len(packs) == 1) == (budget >= sum(lengths))
    worst = 0.0
    for members in packs:
        seqs = [ids[i] for i in members]
        hidden = loaded.forward_packed(torch.tensor([t for s in seqs for t in s]), [len(s) for s in seqs])
        for seq, got in zip(seqs, torch.split(hidden, [len(s) for s in seqs]), strict=True):
            with torch.inference_mode():
                want = reference(input_ids=torch.tensor([seq])).last_hidden_state[0]
            # NaN-safe: max() would skip a NaN difference (garbage weights), inf does not pass.
            worst = max(worst, (got - want).abs().nan_to_num(nan=float("inf")).max().item())
    return worst


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("budget", BUDGETS)
def test_last_hidden_state_matches_transformers(name, budget, tiny_model, tiny_reference) -> None:
    loaded, reference = _load(tiny_model(name), "own"), tiny_reference(name)
    worst = _max_diff_alone(loaded, reference, TEXTS, budget)
    assert worst <= 1e-5, f"{name} at budget {budget}: max |diff| {worst:.3g}"


@pytest.mark.parametrize("name", FAMILIES)
def test_biases_and_norm_weights_are_loaded(name, tiny_model, tmp_path) -> None:
    """transformers initializes biases to 0 and norm weights to 1: perturb them, so each must be read."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModel

    folder = copy_model(tiny_model(name), tmp_path / f"{name}-perturbed")
    state = load_file(str(folder / "model.safetensors"))
    gen = torch.Generator().manual_seed(5)
    for key, value in state.items():
        if key.endswith("bias") or "norm" in key.lower():
            state[key] = value + 0.3 * torch.randn(value.shape, generator=gen)
    if name == "qwen2":
        assert any(k.endswith("q_proj.bias") for k in state)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    reference = AutoModel.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32).eval()
    assert _max_diff_alone(_load(folder, "own"), reference, TEXTS, 96) <= 1e-5


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 500.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
        },
    ],
    ids=lambda r: r["rope_type"],
)
def test_rope_scaling_matches_transformers(rope, tiny_model, tmp_path) -> None:
    from transformers import AutoModel

    folder = copy_model(tiny_model("llama"), tmp_path / "llama-rope")
    edit_json(folder / "config.json", lambda c: c.update(rope_parameters=rope))
    reference = AutoModel.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32).eval()
    texts = [*TEXTS, LONG_TEXT[:400]]
    assert _max_diff_alone(_load(folder, "own"), reference, texts, 96) <= 1e-5


def test_sliding_window_falls_back_to_transformers(tiny_model, tmp_path) -> None:
    """A Mistral window shorter than the context is not implemented: `auto` keeps transformers' modules."""
    folder = copy_model(tiny_model("mistral"), tmp_path / "mistral-window")
    edit_json(folder / "config.json", lambda c: c.update(sliding_window=16))
    assert not _load(folder, "auto").own_backbone
    with pytest.raises(ModelConfigError, match="sliding-window"):
        _load(folder, "own")


@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_token_type_ids_reach_the_embeddings(name, tiny_model, tiny_reference) -> None:
    """Text pairs carry token types 0/1; BERT's second segment embeds differently (RoBERTa has one type)."""
    loaded, reference = _load(tiny_model(name), "own"), tiny_reference(name)
    enc = loaded.tokenizer.encode("market shares rise", "after bank talks")
    ids, types = torch.tensor(enc.ids), torch.tensor(enc.type_ids)
    if name == "bert":
        assert types.max() == 1
    else:
        types = torch.zeros_like(types)
    got = loaded.forward_packed(ids, [len(ids)], types)
    with torch.inference_mode():
        want = reference(input_ids=ids[None], token_type_ids=types[None]).last_hidden_state[0]
    assert (got - want).abs().max().item() <= 1e-5


def _with_head(kind: str, head: str, folder: Path) -> Path:
    """A tiny encoder saved as `*For{head}` (seeded), with the shared tokenizer."""
    import transformers as tf

    torch.manual_seed(11)
    vocab = write_tokenizer(folder)
    prefix = {"bert": "Bert", "roberta": "Roberta", "distilbert": "DistilBert", "mpnet": "MPNet"}[kind]
    config_cls = getattr(tf, f"{prefix}Config")
    if kind == "distilbert":
        config = config_cls(
            vocab_size=vocab, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=128,
            pad_token_id=1, dropout=0.0, attention_dropout=0.0, initializer_range=0.2, num_labels=3,
        )
    else:
        config = config_cls(vocab_size=vocab, num_labels=3, **ENCODER_KW)
    model = getattr(tf, f"{prefix}For{head}")(config).eval()
    model.save_pretrained(str(folder))
    return folder


@pytest.mark.parametrize("kind", ["bert", "roberta", "distilbert", "mpnet"])
@pytest.mark.parametrize(
    ("head", "task"), [("SequenceClassification", "classify"), ("TokenClassification", "token_classify")]
)
def test_heads_match_the_transformers_path(kind, head, task, tmp_path) -> None:
    folder = _with_head(kind, head, tmp_path / f"{kind}-{head}")
    texts = list(TEXTS)
    own, forced = _load(folder, "own"), _load(folder, "transformers")
    assert own.own_backbone and not forced.own_backbone
    got = next(Runner(own, RunnerOptions(task=task)).map([texts]))
    want = next(Runner(forced, RunnerOptions(task=task)).map([texts]))
    for g, w in zip(got, want, strict=True):
        assert np.abs(np.asarray(g) - np.asarray(w)).max() <= 1e-5


@pytest.mark.parametrize("kind", DECODERS)
def test_decoder_score_head_matches_the_transformers_path(kind, tmp_path) -> None:
    import transformers as tf

    folder = tmp_path / f"{kind}-score"
    torch.manual_seed(12)
    vocab = write_tokenizer(folder, decoder=True)
    prefix = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}[kind]
    config = getattr(tf, f"{prefix}Config")(vocab_size=vocab, num_labels=3, **DECODER_KW)
    getattr(tf, f"{prefix}ForSequenceClassification")(config).eval().save_pretrained(str(folder))
    own, forced = _load(folder, "own"), _load(folder, "transformers")
    assert own.own_backbone and not forced.own_backbone
    texts = list(TEXTS)
    got = Runner(own, RunnerOptions(task="classify")).embed(texts)
    want = Runner(forced, RunnerOptions(task="classify")).embed(texts)
    assert np.abs(got - want).max() <= 1e-5


def test_unsupported_config_falls_back_to_transformers(tiny_model, tmp_path) -> None:
    """An activation the own backbone lacks: `auto` keeps transformers' modules, `own` refuses in one line."""
    folder = copy_model(tiny_model("bert"), tmp_path / "bert-gelu10")
    edit_json(folder / "config.json", lambda c: c.update(hidden_act="gelu_10"))
    loaded = _load(folder, "auto")
    assert not loaded.own_backbone
    assert Runner(loaded).embed(["hello"]).shape == (1, 32)
    with pytest.raises(ModelConfigError, match=r"own backbone cannot run this model.*gelu_10"):
        _load(folder, "own")


def test_unknown_backbone_choice_is_refused(tiny_model) -> None:
    with pytest.raises(UsageError, match="EMBEDCLI_BACKBONE 'onnx': choose one of auto, own, transformers"):
        _load(tiny_model("bert"), "onnx")


# -- tokenizer without transformers ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bert", "roberta", "distilbert", "mpnet", "minilm"])
def test_tokenizer_json_matches_transformers(name, tiny_model) -> None:
    from transformers import AutoTokenizer

    folder = Path(load_model_spec(None).path) if name == "minilm" else tiny_model(name)
    loaded = _load(folder, "own")
    hf = AutoTokenizer.from_pretrained(str(folder))
    texts = [*TEXTS, LONG_TEXT, "Ünïcödé Café naïve 東京 £5 ... ???"]
    assert [loaded.tokenizer.encode(t).ids for t in texts] == [hf(t).input_ids for t in texts]
    pair = loaded.tokenizer.encode("a question", "an answer")
    assert (pair.ids, pair.type_ids) == (hf("a question", "an answer").input_ids, hf("a question", "an answer").token_type_ids)
    special = loaded.hf_tokenizer
    for kind in ("cls", "sep", "bos", "eos", "pad", "unk", "mask"):
        assert getattr(special, f"{kind}_token_id") == getattr(hf, f"{kind}_token_id"), kind
    assert sorted(special.all_special_ids) == sorted(hf.all_special_ids)
    assert special(LONG_TEXT).input_ids == hf(LONG_TEXT).input_ids


@pytest.mark.parametrize("lower", [True, False])
def test_tokenizer_config_lowercasing_wins(lower, tiny_model, tmp_path) -> None:
    """tokenizer_config.json's do_lower_case overrides tokenizer.json's normalizer, as in transformers."""
    from transformers import AutoTokenizer

    folder = copy_model(tiny_model("bert"), tmp_path / "bert-case")
    edit_json(folder / "tokenizer_config.json", lambda c: c.update(do_lower_case=lower))
    tokenizer = _load(folder, "own").tokenizer
    hf = AutoTokenizer.from_pretrained(str(folder))
    text = "Hello World THE Fox"
    assert tokenizer.encode(text).ids == hf(text).input_ids
    assert (tokenizer.encode(text).ids == tokenizer.encode(text.lower()).ids) == lower


def test_hot_path_never_imports_transformers(tiny_model) -> None:
    """Loading an own-backbone model and embedding with it leaves transformers (and torch._dynamo) unimported."""
    folder = tiny_model("bert-st6")
    code = f"""
import sys
from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.spec import load_model_spec
from embedcli.compute.runner import Runner
loaded = LoadedModel(load_model_spec({str(folder)!r}), ModelOptions(device="cpu", dtype="float32"))
assert loaded.own_backbone
vectors = Runner(loaded).embed(["hello world", "the fox"])
assert vectors.shape == (2, 32), vectors.shape
print(sorted(m for m in sys.modules if m.split(".")[0] in ("transformers", "sentence_transformers") or m == "torch._dynamo"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout.strip().replace("'", '"')) == []
