"""NomicBERT (`nomic_bert`) and GTE "NewModel" (`new`): embedcli's own backbones against float64 references.

The references below are written here, independently of embedcli, from the published modeling code:
NomicBERT from nomic-ai/nomic-bert-2048 `modeling_hf_nomic_bert.py` (the checkpoints' remote code), GTE
from Alibaba-NLP/new-impl `modeling.py`. Neither can run here (remote code, offline), so each reference
is checked against the published port transformers 5.24 ships, run in float64 on the same folder:
`NomicBertModel` (model_type nomic_bert, reading the BERT style keys the updated hub configs carry) and
`GteModel` (model_type gte, a port of new-impl; NTK rope written as the `linear` rope it equals). The
rope tables are built in float32 as all of them build their caches.

The own backbones run float32, packed at three token budgets and alone; texts reach ~130 tokens, so
rope rotates far. End to end: LoadedModel + Runner (and the CLI) on the sentence-transformers layout
written by hand, against the reference + pooling + normalize done here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from typer.testing import CliRunner

from embedcli.cli import app
from embedcli.compute.runner import Runner, RunnerOptions
from embedcli.errors import ConfigRefusedError
from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.spec import ModelConfigError, load_model_spec
from tests.fixtures.nomic_gte import build_gte, build_nomic
from tests.fixtures.tiny_models import LONG_TEXT, SAMPLE_TEXTS, edit_json

BUDGETS = (24, 96, 4096)
TEXTS = (*SAMPLE_TEXTS, LONG_TEXT, LONG_TEXT[:200], "fox", "the bank deal")
TOL = 1e-5

# -- float64 references ------------------------------------------------------------------------------


def _rope_f32(length: int, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`[length, rot / 2]` cos and sin: float32 angles (position x inverse frequency), as every reference caches them."""
    freqs = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq.to(torch.float32))
    return freqs.cos().double(), freqs.sin().double()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotary embedding of `[len, heads, dim]` on its first `2 * cos.shape[-1]` channels."""
    rot = 2 * cos.shape[-1]
    xr, rest = x[..., :rot], x[..., rot:]
    if interleaved:  # GPT-J: pairs (x0, x1), (x2, x3) ...
        c, s = cos.repeat_interleave(2, -1)[:, None], sin.repeat_interleave(2, -1)[:, None]
        pairs = torch.stack((-xr[..., 1::2], xr[..., ::2]), dim=-1).flatten(-2)
    else:  # GPT-NeoX: halves
        c, s = torch.cat((cos, cos), -1)[:, None], torch.cat((sin, sin), -1)[:, None]
        x1, x2 = xr.chunk(2, dim=-1)
        pairs = torch.cat((-x2, x1), dim=-1)
    return torch.cat((xr * c + pairs * s, rest), dim=-1)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(q.shape[0], -1)


def _lin(w: dict[str, torch.Tensor], name: str, x: torch.Tensor) -> torch.Tensor:
    out = x @ w[f"{name}.weight"].T
    return out + w[f"{name}.bias"] if f"{name}.bias" in w else out


def _ln(w: dict[str, torch.Tensor], name: str, x: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], w[f"{name}.weight"], w[f"{name}.bias"], eps)


def _rms(w: dict[str, torch.Tensor], name: str, x: torch.Tensor, eps: float) -> torch.Tensor:
    return w[f"{name}.weight"] * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def nomic_reference(config: dict[str, Any], w: dict[str, torch.Tensor], ids: list[int]) -> torch.Tensor:
    """NomicBertModel (remote code, post-norm) on one sequence: `[len, n_embd]` float64."""
    hidden, heads = config["n_embd"], config["n_head"]
    d, n, eps = hidden // heads, len(ids), config["layer_norm_epsilon"]
    idx = torch.tensor(ids)
    x = w["embeddings.word_embeddings.weight"][idx]
    if config["type_vocab_size"] > 0:
        x = x + w["embeddings.token_type_embeddings.weight"][torch.zeros_like(idx)]
    x = _ln(w, "emb_ln", x, eps)
    rot = d * config["rotary_emb_fraction"]
    base, factor, trained = float(config["rotary_emb_base"]), config["rotary_scaling_factor"], config["max_trained_positions"]
    if factor and n > trained:  # NomicBertDynamicNTKRotaryEmbedding, for this sequence alone
        base = base * ((factor * n / trained) - (factor - 1)) ** (rot / (rot - 2))
    cos, sin = _rope_f32(n, 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot)))
    act = {"swiglu": F.silu, "geglu": F.gelu, "glu": torch.sigmoid}[config["activation_function"]]
    inter = config["rotary_emb_interleaved"]
    for i in range(config["n_layer"]):
        p = f"encoder.layers.{i}."
        q, k, v = _lin(w, f"{p}attn.Wqkv", x).view(n, 3, heads, d).unbind(1)
        context = _attention(_rotate(q, cos, sin, inter), _rotate(k, cos, sin, inter), v)
        x = _ln(w, f"{p}norm1", _lin(w, f"{p}attn.out_proj", context) + x, eps)
        y = _lin(w, f"{p}mlp.fc11", x) * act(_lin(w, f"{p}mlp.fc12", x))
        x = _ln(w, f"{p}norm2", _lin(w, f"{p}mlp.fc2", y) + x, eps)
    return x


def gte_inv_freq(config: dict[str, Any], d: int) -> torch.Tensor:
    """new-impl's RotaryEmbedding / NTKScalingRotaryEmbedding frequencies (the NTK cache is built at load)."""
    base, scaling = float(config["rope_theta"]), config["rope_scaling"]
    inv = 1.0 / (base ** (torch.arange(0, d, 2).float() / d))
    if scaling and config["max_position_embeddings"] * scaling["factor"] > config["max_position_embeddings"]:
        f, mixed_b = scaling["factor"], scaling.get("mixed_b")
        inv = 1.0 / ((base * (f if mixed_b is None else 1)) ** (torch.arange(0, d, 2).float() / d))
        if mixed_b is None:
            inv = inv / f ** (2 / d)
        else:
            a = torch.tensor(f).log() / (d / 2) ** mixed_b
            inv = inv / (a * torch.arange(1, d // 2 + 1).float() ** mixed_b).exp()
    return inv


def gte_reference(config: dict[str, Any], w: dict[str, torch.Tensor], ids: list[int], prefix: str = "") -> torch.Tensor:
    """NewModel (new-impl) on one sequence: `[len, hidden]` float64."""
    w = {k.removeprefix(prefix): v for k, v in w.items()}
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    d, n, eps = hidden // heads, len(ids), config["layer_norm_eps"]
    norm = _rms if config["layer_norm_type"] == "rms_norm" else _ln
    idx = torch.tensor(ids)
    x = w["embeddings.word_embeddings.weight"][idx]
    if config["type_vocab_size"] > 0:
        x = x + w["embeddings.token_type_embeddings.weight"][torch.zeros_like(idx)]
    x = _ln(w, "embeddings.LayerNorm", x, eps)
    cos, sin = _rope_f32(n, gte_inv_freq(config, d))
    act = {"gelu": F.gelu, "silu": F.silu}[config["hidden_act"]]
    scale = None
    if config["logn_attention_scale"]:
        scale = torch.tensor([n]).log() / torch.tensor(config["max_position_embeddings"]).log()
        scale = (scale.clip(1) if config["logn_attention_clip1"] else scale).double()
    for i in range(config["num_hidden_layers"]):
        a = f"encoder.layer.{i}.attention."
        if config["pack_qkv"]:
            q, k, v = _lin(w, f"{a}qkv_proj", x).view(n, 3, heads, d).unbind(1)
        else:
            q, k, v = (_lin(w, f"{a}{part}_proj", x).view(n, heads, d) for part in "qkv")
        q, k = _rotate(q, cos, sin, False), _rotate(k, cos, sin, False)
        if scale is not None:
            q = q * scale
        x = norm(w, f"encoder.layer.{i}.attn_ln", x + _lin(w, f"{a}o_proj", _attention(q, k, v)), eps)
        up, gate = _lin(w, f"encoder.layer.{i}.mlp.up_gate_proj", x).chunk(2, dim=-1)
        x = norm(w, f"encoder.layer.{i}.mlp_ln", x + _lin(w, f"encoder.layer.{i}.mlp.down_proj", act(gate) * up), eps)
    return x


# -- fixtures ------------------------------------------------------------------------------------------

NOMIC_VARIANTS: dict[str, dict[str, Any]] = {
    "v1.5": {},
    "biases-partial-interleaved": {
        "qkv_proj_bias": True, "mlp_fc1_bias": True, "mlp_fc2_bias": True,
        "rotary_emb_fraction": 0.5, "rotary_emb_interleaved": True, "activation_function": "geglu",
    },
    "dynamic-ntk": {"rotary_scaling_factor": 2, "max_trained_positions": 16, "type_vocab_size": 0},
    "glu": {"activation_function": "glu", "n_inner": 300, "layer_norm_epsilon": 1e-5},
}
GTE_VARIANTS: dict[str, dict[str, Any]] = {
    "base-en-v1.5": {},
    "ntk-mixed": {"rope_scaling": {"type": "ntk", "factor": 4.0, "mixed_b": 0.7}, "type_vocab_size": 2},
    "plain-rope-unpacked": {"rope_scaling": None, "pack_qkv": False, "type_vocab_size": 1, "rope_theta": 160000},
    "rms-logn": {"layer_norm_type": "rms_norm", "logn_attention_scale": True, "max_position_embeddings": 64,
                 "hidden_act": "silu"},
    "logn-clip1": {"logn_attention_scale": True, "logn_attention_clip1": True, "max_position_embeddings": 16},
}


def _build(family: str, variant: str, root: Path) -> Path:
    folder = root / f"{family}-{variant}"
    if not folder.exists():
        if family == "nomic":
            build_nomic(folder, **NOMIC_VARIANTS[variant])
        else:
            build_gte(folder, **GTE_VARIANTS[variant])
    return folder


CASES = [("nomic", v) for v in NOMIC_VARIANTS] + [("gte", v) for v in GTE_VARIANTS]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nomic_gte")


def _load(folder: Path, backbone: str = "own", **kw: Any) -> LoadedModel:
    return LoadedModel(load_model_spec(str(folder)), ModelOptions(device="cpu", dtype="float32", backbone=backbone, **kw))


def _reference(folder: Path, family: str, ids: list[int]) -> torch.Tensor:
    config = json.loads((folder / "config.json").read_text())
    w = {k: v.double() for k, v in load_file(str(folder / "model.safetensors")).items()}
    return nomic_reference(config, w, ids) if family == "nomic" else gte_reference(config, w, ids)


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


# -- the references against transformers' ports ----------------------------------------------------------


def _native_nomic(folder: Path, dst: Path) -> Path:
    """`folder` as the updated hub config ships it: BERT style keys added, no auto_map (transformers' own model)."""
    import shutil

    shutil.copytree(folder, dst)
    c = json.loads((folder / "config.json").read_text())
    inner = (c["n_inner"] + 255) // 256 * 256
    edit_json(dst / "config.json", lambda cfg: (cfg.pop("auto_map"), cfg.update(
        hidden_size=c["n_embd"], num_attention_heads=c["n_head"], num_hidden_layers=c["n_layer"],
        intermediate_size=inner, hidden_act="silu", layer_norm_eps=c["layer_norm_epsilon"],
        max_position_embeddings=2048, rope_parameters={"rope_theta": float(c["rotary_emb_base"]), "rope_type": "default"},
        pad_token_id=1,
    )))
    return dst


def test_nomic_reference_matches_transformers_nomic_bert(root: Path, tmp_path: Path) -> None:
    from transformers import AutoModel

    folder = _native_nomic(_build("nomic", "v1.5", root), tmp_path / "native")
    model = AutoModel.from_pretrained(str(folder), dtype=torch.float64, attn_implementation="eager").eval()
    assert type(model).__module__.startswith("transformers.models.nomic_bert")
    loaded = _load(folder)
    for text in TEXTS:
        ids = loaded.tokenizer.encode(text.strip()).ids
        with torch.inference_mode():
            want = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
        assert (_reference(folder, "nomic", ids) - want).abs().max().item() < 1e-10


def _gte_as_transformers(folder: Path, dst: Path) -> Path:
    """The same weights under transformers' `gte` model_type; new-impl's fixed NTK equals its `linear` rope."""
    import shutil

    shutil.copytree(folder, dst)
    c = json.loads((folder / "config.json").read_text())
    d = c["hidden_size"] // c["num_attention_heads"]
    f = c["rope_scaling"]["factor"]
    native = {
        "model_type": "gte", "architectures": ["GteModel"], "vocab_size": c["vocab_size"],
        "hidden_size": c["hidden_size"], "num_attention_heads": c["num_attention_heads"],
        "num_hidden_layers": c["num_hidden_layers"], "intermediate_size": c["intermediate_size"],
        "hidden_act": c["hidden_act"], "layer_norm_eps": c["layer_norm_eps"], "type_vocab_size": c["type_vocab_size"],
        "max_position_embeddings": c["max_position_embeddings"], "pad_token_id": 1,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        "rope_parameters": {"rope_type": "linear", "factor": f ** (2 / d), "rope_theta": float(c["rope_theta"]) * f},
    }
    (dst / "config.json").write_text(json.dumps(native))
    return dst


def test_gte_reference_matches_transformers_gte(root: Path, tmp_path: Path) -> None:
    from transformers import AutoModel

    for variant in ("base-en-v1.5", "ntk-mixed"):
        src = _build("gte", variant, root)
        config = json.loads((src / "config.json").read_text())
        if config["rope_scaling"].get("mixed_b") is not None:
            continue  # transformers has no mixed NTK; the variant still checks the own backbone below
        folder = _gte_as_transformers(src, tmp_path / variant)
        model = AutoModel.from_pretrained(str(folder), dtype=torch.float64, attn_implementation="eager").eval()
        assert type(model).__module__.startswith("transformers.models.gte")
        loaded = _load(src)
        for text in TEXTS:
            ids = loaded.tokenizer.encode(text.strip()).ids
            with torch.inference_mode():
                want = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            assert (_reference(src, "gte", ids) - want).abs().max().item() < 1e-10


# -- the own backbones -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("family", "variant"), CASES)
def test_own_backbone_serves_without_remote_code(family: str, variant: str, root: Path) -> None:
    folder = _build(family, variant, root)
    assert json.loads((folder / "config.json").read_text())["auto_map"]
    loaded = _load(folder, "auto")  # no --trust-remote-code
    assert loaded.own_backbone
    assert type(loaded.backbone).__module__ in ("embedcli.models.backbones.nomic_bert", "embedcli.models.backbones.gte")


@pytest.mark.parametrize(("family", "variant"), CASES)
@pytest.mark.parametrize("budget", (*BUDGETS, 0))
def test_packed_forward_matches_reference(family: str, variant: str, budget: int, root: Path) -> None:
    """Budget 0: each text alone."""
    folder = _build(family, variant, root)
    loaded = _load(folder)
    ids = [loaded.tokenizer.encode(t.strip()).ids for t in TEXTS]
    lengths = [len(x) for x in ids]
    assert max(lengths) > 100
    packs = [[i] for i in range(len(ids))] if budget == 0 else _packs(lengths, budget)
    worst = 0.0
    for members in packs:
        seqs = [ids[i] for i in members]
        hidden = loaded.forward_packed(torch.tensor([t for s in seqs for t in s]), [len(s) for s in seqs])
        for seq, got in zip(seqs, torch.split(hidden, [len(s) for s in seqs]), strict=True):
            diff = (got.double() - _reference(folder, family, seq)).abs().nan_to_num(nan=float("inf"))
            worst = max(worst, diff.max().item())
    assert worst <= TOL, f"{family} {variant} at budget {budget}: max |diff| {worst:.3g}"


def test_dynamic_ntk_really_rescales_long_sequences(root: Path) -> None:
    """The variant's texts pass max_trained_positions (16); plain rope would give other numbers."""
    folder = _build("nomic", "dynamic-ntk", root)
    loaded = _load(folder)
    ids = loaded.tokenizer.encode(LONG_TEXT).ids
    assert len(ids) > 16
    config = json.loads((folder / "config.json").read_text())
    w = {k: v.double() for k, v in load_file(str(folder / "model.safetensors")).items()}
    plain = nomic_reference({**config, "rotary_scaling_factor": None}, w, ids)
    got = loaded.forward_packed(torch.tensor(ids), [len(ids)]).double()
    assert (got - plain).abs().max().item() > 1e-3
    assert (got - nomic_reference(config, w, ids)).abs().max().item() <= TOL


# -- end to end ------------------------------------------------------------------------------------------


def _pooled(family: str, folder: Path, ids: list[int]) -> np.ndarray:
    hidden = _reference(folder, family, ids)
    vec = hidden.mean(0) if family == "nomic" else hidden[0]  # 1_Pooling: mean (nomic) / cls (gte)
    return F.normalize(vec, dim=-1).numpy()


@pytest.mark.parametrize(("family", "variant"), [("nomic", "v1.5"), ("gte", "base-en-v1.5"), ("gte", "rms-logn")])
def test_runner_matches_reference_with_pooling_and_prompt(family: str, variant: str, root: Path) -> None:
    folder = _build(family, variant, root)
    loaded = _load(folder, "auto")
    prompt = loaded.spec.prompt("query") if family == "nomic" else ""
    if family == "nomic":
        assert loaded.spec.seq_pooling_type == "MEAN" and prompt == "search_query: "
    got = Runner(loaded, RunnerOptions(prompt=prompt, max_batch_tokens=64)).embed(list(TEXTS))
    want = np.stack([_pooled(family, folder, loaded.tokenizer.encode(prompt + t).ids) for t in TEXTS])
    np.testing.assert_allclose(got, want, atol=TOL)


def test_cli_embed_with_prompt_name(root: Path, tmp_path: Path) -> None:
    folder = _build("nomic", "v1.5", root)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    result = CliRunner().invoke(app, [
        "embed", str(corpus), "-o", "-", "-m", str(folder), "--dtype", "float32", "--prompt-name", "document", "-q",
    ])
    assert result.exit_code == 0, result.output
    got = np.asarray([json.loads(line)["embedding"] for line in result.stdout.splitlines()])
    tok = _load(folder).tokenizer
    want = np.stack([_pooled("nomic", folder, tok.encode("search_document: " + t).ids) for t in TEXTS])
    np.testing.assert_allclose(got, want, atol=TOL)


def test_gte_reranker_head_matches_reference(root: Path) -> None:
    """NewForSequenceClassification: pooler (dense + tanh on the first token) then the classifier."""
    folder = build_gte(root / "gte-reranker", classifier=True)
    loaded = _load(folder, "auto")
    assert loaded.own_backbone and loaded.spec.head == "sequence_classification"
    got = Runner(loaded, RunnerOptions(task="classify")).embed(list(TEXTS))
    config = json.loads((folder / "config.json").read_text())
    w = {k: v.double() for k, v in load_file(str(folder / "model.safetensors")).items()}
    for row, text in zip(got, TEXTS, strict=True):
        first = gte_reference(config, w, loaded.tokenizer.encode(text).ids, prefix="new.")[0]
        logit = _lin(w, "classifier", torch.tanh(_lin(w, "new.pooler.dense", first)))
        np.testing.assert_allclose(row, torch.sigmoid(logit).numpy(), atol=TOL)


# -- refusals --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "key", "value"),
    [("nomic", "prenorm", True), ("nomic", "rotary_emb_scale_base", 512), ("nomic", "rotary_emb_fraction", 0.0),
     ("nomic", "activation_function", "gelu"), ("gte", "position_embedding_type", "absolute"),
     ("gte", "rope_scaling", {"type": "dynamic", "factor": 2.0}), ("gte", "rope_scaling", {"type": "ntk", "factor": 1.0})],
)
def test_unsupported_remote_code_config_is_refused_not_sent_to_transformers(family, key, value, root, tmp_path) -> None:
    import shutil

    folder = shutil.copytree(_build(family, "v1.5" if family == "nomic" else "base-en-v1.5", root), tmp_path / "m")
    edit_json(folder / "config.json", lambda c: c.update({key: value}))
    with pytest.raises(ModelConfigError, match=f"{key}=.*--trust-remote-code"):
        _load(folder, "auto")


def test_transformers_backbone_choice_is_refused_for_remote_code(root: Path) -> None:
    with pytest.raises(ModelConfigError, match=r"EMBEDCLI_BACKBONE=transformers; only its own Python code"):
        _load(_build("gte", "base-en-v1.5", root), "transformers")


def test_other_remote_code_models_are_still_refused(root: Path, tmp_path: Path) -> None:
    import shutil

    folder = shutil.copytree(_build("gte", "base-en-v1.5", root), tmp_path / "m")
    edit_json(folder / "config.json", lambda c: c.update(model_type="bert"))
    with pytest.raises(ModelConfigError, match="auto_map"):
        load_model_spec(str(folder))


def test_native_nomic_config_disagreeing_with_its_gpt2_keys_falls_back(root: Path, tmp_path: Path) -> None:
    """Without auto_map transformers' own nomic_bert computes the numbers; where it reads other values, it serves."""
    folder = _native_nomic(_build("nomic", "v1.5", root), tmp_path / "native")
    assert _load(folder, "auto").own_backbone
    # transformers reads rope_parameters (10000), the GPT-2 style keys say rotary_emb_base 1000.
    edit_json(folder / "config.json", lambda c: c.update(rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}))
    assert not _load(folder, "auto").own_backbone


def test_nomic_length_limit_reads_n_positions(root: Path) -> None:
    """The GPT-2 style config has no max_position_embeddings: n_positions (8192) bounds --max-length."""
    folder = _build("nomic", "v1.5", root)
    spec = load_model_spec(str(folder), max_length=4096)
    assert (spec.max_length, spec.hidden_size, spec.model_type) == (4096, 32, "nomic_bert")
    assert load_model_spec(str(folder)).max_length == 8192  # sentence_bert_config.json
    with pytest.raises(ConfigRefusedError, match="max_position_embeddings"):
        load_model_spec(str(folder), max_length=9000)
