"""The exact fallback: transformers' modules (or a checkpoint's own code) in padded batches, never packed.

References are the libraries the models' users use: the transformers model run on each text alone, and
sentence-transformers 6.2 `encode` / CrossEncoder `predict` on checkpoints saved with their `save_pretrained`.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from embedcli.compute.runner import Runner, RunnerOptions
from embedcli.errors import ModelConfigError
from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.spec import load_model_spec
from tests.fixtures.tiny_models import LONG_TEXT, SAMPLE_TEXTS, write_tokenizer

TEXTS = [*SAMPLE_TEXTS, LONG_TEXT[:300], "fox"]
BUDGETS = (16, 64, 4096)

CUSTOM_CODE = textwrap.dedent(
    '''
    """A model whose code does its own attention (no transformers attention interface)."""
    import math

    import torch
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel
    from transformers.modeling_outputs import BaseModelOutput


    class CustomAttnConfig(PretrainedConfig):
        model_type = "custom_attn"

        def __init__(self, vocab_size=400, hidden_size=32, num_heads=4, num_layers=2, max_positions=512, **kw):
            super().__init__(**kw)
            self.vocab_size, self.hidden_size = vocab_size, hidden_size
            self.num_heads, self.num_layers, self.max_positions = num_heads, num_layers, max_positions


    class CustomAttnModel(PreTrainedModel):
        config_class = CustomAttnConfig
        base_model_prefix = "custom"

        def __init__(self, config):
            super().__init__(config)
            h = config.hidden_size
            self.emb = nn.Embedding(config.vocab_size, h)
            self.pos = nn.Embedding(config.max_positions, h)
            self.qkv = nn.ModuleList(nn.Linear(h, 3 * h) for _ in range(config.num_layers))
            self.out = nn.ModuleList(nn.Linear(h, h) for _ in range(config.num_layers))
            self.post_init()

        def forward(self, input_ids, attention_mask=None, **kwargs):
            b, n = input_ids.shape
            heads = self.config.num_heads
            d = self.config.hidden_size // heads
            if attention_mask is None:
                attention_mask = torch.ones_like(input_ids)
            x = self.emb(input_ids) + self.pos(torch.arange(n, device=input_ids.device))[None]
            keep = attention_mask[:, None, None, :].bool()
            for qkv, out in zip(self.qkv, self.out):
                q, k, v = qkv(x).view(b, n, 3, heads, d).permute(2, 0, 3, 1, 4)
                scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
                probs = scores.masked_fill(~keep, float("-inf")).softmax(-1)
                x = x + torch.tanh(out((probs @ v).transpose(1, 2).reshape(b, n, -1)))
            return BaseModelOutput(last_hidden_state=x)
    '''
)


def _remote_code_model(folder: Path) -> Path:
    """A tiny checkpoint whose architecture lives in its own modeling file (auto_map), saved as such models ship."""
    folder.mkdir(parents=True)
    vocab = write_tokenizer(folder)
    (folder / "modeling_custom.py").write_text(CUSTOM_CODE)
    sys.path.insert(0, str(folder))
    try:
        import modeling_custom  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("modeling_custom", None)
    torch.manual_seed(3)
    config = modeling_custom.CustomAttnConfig(vocab_size=vocab, pad_token_id=1)
    config.auto_map = {"AutoConfig": "modeling_custom.CustomAttnConfig", "AutoModel": "modeling_custom.CustomAttnModel"}
    config.architectures = ["CustomAttnModel"]
    model = modeling_custom.CustomAttnModel(config).eval()
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def remote_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _remote_code_model(tmp_path_factory.mktemp("remote") / "m")


def test_remote_code_is_refused_without_the_flag(remote_folder: Path) -> None:
    with pytest.raises(ModelConfigError, match=r"own Python code \(auto_map\).*pass --trust-remote-code if you trust it"):
        load_model_spec(str(remote_folder))


@pytest.mark.parametrize("budget", BUDGETS)
def test_remote_code_texts_do_not_attend_to_each_other(remote_folder: Path, budget: int) -> None:
    spec = load_model_spec(str(remote_folder), trust_remote_code=True)
    assert not spec.own_backbone and not spec.packing
    loaded = LoadedModel(spec, ModelOptions(device="cpu", dtype="float32", trust_remote_code=True))
    options = RunnerOptions(max_batch_tokens=budget, normalize=False)
    together = Runner(loaded, options).embed(TEXTS)
    alone = np.concatenate([Runner(loaded, options).embed([t]) for t in TEXTS])
    assert len(TEXTS) == 8
    np.testing.assert_allclose(together, alone, atol=1e-6, rtol=0)
    # And what the model itself computes for each text alone (CLS: its first row).
    model = loaded.backbone.model
    for text, got in zip(TEXTS, together, strict=True):
        ids = torch.tensor([loaded.hf_tokenizer(text).input_ids])
        with torch.inference_mode():
            want = model(input_ids=ids).last_hidden_state[0, 0].numpy()
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


# -- families served by the fallback, compared with sentence-transformers --------------------------------


def _t5_sentence_encoder(folder: Path) -> Path:
    """sentence-t5 / gtr-t5's layout: T5EncoderModel, mean pooling, Dense (no bias, identity), Normalize."""
    import transformers as tf
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    base = folder.parent / f"{folder.name}-t5"
    base.mkdir(parents=True)
    vocab = write_tokenizer(base)
    torch.manual_seed(5)
    config = tf.T5Config(
        vocab_size=vocab, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
        relative_attention_max_distance=20, feed_forward_proj="gated-gelu", pad_token_id=1, eos_token_id=2,
        decoder_start_token_id=1,
    )
    tf.T5EncoderModel(config).eval().save_pretrained(str(base))
    transformer = Transformer(str(base), max_seq_length=128)
    dense = Dense(32, 24, bias=False, activation_function=torch.nn.Identity())
    st = SentenceTransformer(modules=[transformer, Pooling(32, "mean"), dense, Normalize()], device="cpu")
    st.save(str(folder))
    return folder


def _deberta_cross_encoder(folder: Path) -> Path:
    """A DeBERTa-v2 cross-encoder (mxbai-rerank / NLI style) saved by CrossEncoder."""
    import transformers as tf
    from sentence_transformers import CrossEncoder

    base = folder.parent / f"{folder.name}-deberta"
    base.mkdir(parents=True)
    vocab = write_tokenizer(base)
    torch.manual_seed(6)
    config = tf.DebertaV2Config(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=128, relative_attention=True, position_buckets=16, pos_att_type=["p2c", "c2p"],
        position_biased_input=False, pad_token_id=1, num_labels=1, type_vocab_size=0,
    )
    tf.DebertaV2ForSequenceClassification(config).eval().save_pretrained(str(base))
    CrossEncoder(str(base), device="cpu", max_length=128).save_pretrained(str(folder))
    return folder


@pytest.mark.parametrize("budget", BUDGETS)
def test_t5_encoder_matches_sentence_transformers(tmp_path: Path, budget: int) -> None:
    from sentence_transformers import SentenceTransformer

    folder = _t5_sentence_encoder(tmp_path / "st5")
    spec = load_model_spec(str(folder))
    assert (spec.model_type, spec.own_backbone, spec.embedding_size) == ("t5", False, 24)
    loaded = LoadedModel(spec, ModelOptions(device="cpu", dtype="float32"))
    got = Runner(loaded, RunnerOptions(max_batch_tokens=budget)).embed(TEXTS)
    want = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_numpy=True)
    assert np.abs(got - want).max() <= 1e-5


@pytest.mark.parametrize("budget", BUDGETS)
def test_deberta_cross_encoder_matches_predict(tmp_path: Path, budget: int) -> None:
    from sentence_transformers import CrossEncoder

    folder = _deberta_cross_encoder(tmp_path / "ce")
    spec = load_model_spec(str(folder))
    assert spec.model_type == "deberta-v2" and spec.head == "sequence_classification" and not spec.own_backbone
    loaded = LoadedModel(spec, ModelOptions(device="cpu", dtype="float32"))
    pairs = [(q, d) for q in ("the bank deal", "fox") for d in TEXTS]
    runner = Runner(loaded, RunnerOptions(task="classify", max_batch_tokens=budget))
    got = np.concatenate([np.asarray(r) for r in runner.map([pairs])])
    want = CrossEncoder(str(folder), device="cpu").predict(pairs, convert_to_numpy=True)
    assert np.abs(np.asarray(got).ravel() - want.ravel()).max() <= 1e-5


def test_clip_folder_is_refused_by_name_and_an_empty_static_folder_names_its_table(tmp_path: Path) -> None:
    clip = tmp_path / "clip"
    clip.mkdir()
    (clip / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_CLIPModel", "type": "sentence_transformers.models.CLIPModel"},
    ]))
    with pytest.raises(ModelConfigError, match=r"first module is .*CLIPModel .*image models \(CLIP, SigLIP\) are not supported"):
        load_model_spec(str(clip))
    folder = tmp_path / "static"
    folder.mkdir()
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_StaticEmbedding",
         "type": "sentence_transformers.sentence_transformer.modules.static_embedding.StaticEmbedding"},
    ]))
    with pytest.raises(ModelConfigError, match=r"0_StaticEmbedding/model.safetensors: missing; the static embedding table"):
        load_model_spec(str(folder))


def test_info_says_what_runs_the_model(tiny_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from embedcli.cli import app

    own = CliRunner().invoke(app, ["info", str(tiny_model("bert")), "--json"])
    assert own.exit_code == 0, own.output
    data = json.loads(own.stdout)
    assert data["runs_on"] == "own backbone embedcli.models.backbones.bert:BertModel [registry entry: BertModel]"
    assert data["packing_mode"].startswith("on")
    t5 = _t5_sentence_encoder(tmp_path / "st5")
    fallback = CliRunner().invoke(app, ["info", str(t5)])
    assert fallback.exit_code == 0, fallback.output
    for words in ("transformers modules (exact fallback)", "has no own backbone", "off (padded batches"):
        assert words in " ".join(fallback.stdout.split()), fallback.stdout
