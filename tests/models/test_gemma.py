"""Own Gemma2 / Gemma3-text backbones (EmbeddingGemma, Gemma2 yes/no rerankers) on tiny random checkpoints.

Oracles: transformers' own modules in eager attention (hidden states, float32; Gemma2ForCausalLM logits in
float64 for the reranker score, its final logit cap included) and sentence-transformers 6.2 (`encode`,
`CrossEncoder.predict`) on checkpoints it saved itself. The texts are longer than every attention window
(bidirectional reach 5, causal 7 or 9), and run alone and packed at three token budgets (24: the causal
models' long rows are prefilled in slices; 96: a few per forward; 4096: all in one).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from embedcli.compute.runner import Runner, RunnerOptions
from embedcli.errors import UnsupportedCheckpoint
from embedcli.models.backbones.gemma import Gemma2Model, Gemma3TextModel, GemmaV1Model, layer_window
from embedcli.models.backbones.layers import JsonConfig
from embedcli.models.backbones.lm_heads import lm_score_head
from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.spec import load_model_spec
from tests.fixtures.gemma import (
    GEMMA_TEXTS,
    build_embeddinggemma,
    build_gemma2_classifier,
    build_gemma2_crossencoder,
    build_gemma2_lm,
    build_gemma3_text,
    build_gemma_lm,
)

BUDGETS = (24, 96, 4096)
TOL = 1e-5
BASES = ("gemma3", "gemma3-legacy", "gemma3-legacy-linear", "gemma3-causal", "gemma2", "gemma")
LINEAR_ROPE = {
    "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10_000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
}


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny checkpoints, by name (read-only)."""
    root = tmp_path_factory.mktemp("gemma")
    models = {
        "gemma3": build_gemma3_text(root / "gemma3"),
        # EmbeddingGemma's own config.json keys (transformers 4.57): rope_theta / rope_local_base_freq.
        "gemma3-legacy": build_gemma3_text(root / "gemma3-legacy", seed=7, legacy=True),
        # Gemma3-1B-like: causal, legacy keys, linear RoPE scaling on the full layers (rope_scaling).
        "gemma3-legacy-linear": build_gemma3_text(
            root / "gemma3-legacy-linear", seed=11, legacy=True, use_bidirectional_attention=False
        ),
        "gemma3-causal": build_gemma3_text(
            root / "gemma3-causal", seed=8, use_bidirectional_attention=False, rope_parameters=LINEAR_ROPE
        ),
        "gemma2": build_gemma2_lm(root / "gemma2"),
        "gemma": build_gemma_lm(root / "gemma"),
        "gemma2-classifier": build_gemma2_classifier(root / "gemma2-classifier"),
    }
    edit = models["gemma3-legacy-linear"] / "config.json"
    edit.write_text(json.dumps({**json.loads(edit.read_text()), "rope_scaling": {"rope_type": "linear", "factor": 8.0}}))
    models["embeddinggemma"] = build_embeddinggemma(models["gemma3"], root / "embeddinggemma")
    models["gemma2-ce"] = build_gemma2_crossencoder(models["gemma2"], root / "gemma2-ce")
    return models


@pytest.fixture(scope="module")
def loaded(gemma: dict[str, Path]):  # type: ignore[no-untyped-def]
    """`loaded(name) -> LoadedModel`, float32 on the CPU, once per name."""
    cache: dict[str, LoadedModel] = {}

    def get(name: str) -> LoadedModel:
        if name not in cache:
            cache[name] = LoadedModel(load_model_spec(str(gemma[name])), ModelOptions(device="cpu", dtype="float32"))
        return cache[name]

    return get


@pytest.fixture(scope="module")
def reference(gemma: dict[str, Path]):  # type: ignore[no-untyped-def]
    """`reference(name)`: transformers' base model of the checkpoint, eager attention, float32."""
    from transformers import AutoModel

    cache: dict[str, torch.nn.Module] = {}

    def get(name: str) -> torch.nn.Module:
        if name not in cache:
            model = AutoModel.from_pretrained(str(gemma[name]), attn_implementation="eager", dtype=torch.float32)
            cache[name] = model.eval()
        return cache[name]

    return get


def _ids(model: LoadedModel) -> list[list[int]]:
    return [model.tokenizer.encode(t).ids for t in GEMMA_TEXTS]


def _packs(ids: list[list[int]], budget: int) -> list[list[int]]:
    """Indices of `ids` laid into forwards of at most `budget` tokens, in order (a longer one alone)."""
    packs: list[list[int]] = [[]]
    used = 0
    for i, seq in enumerate(ids):
        if packs[-1] and used + len(seq) > budget:
            packs.append([])
            used = 0
        packs[-1].append(i)
        used += len(seq)
    return packs


@torch.inference_mode()
def _alone(reference: torch.nn.Module, seq: list[int]) -> torch.Tensor:
    return reference(input_ids=torch.tensor([seq])).last_hidden_state[0]


# -- backbone parity ---------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("name", BASES)
def test_packed_hidden_states_match_transformers(name, budget, loaded, reference) -> None:
    model, ref = loaded(name), reference(name)
    assert model.own_backbone
    ids = _ids(model)
    assert max(len(x) for x in ids) > 4 * 10, "the texts must reach past every window"
    worst = 0.0
    for pack in _packs(ids, budget):
        seqs = [ids[i] for i in pack]
        flat = torch.tensor([t for s in seqs for t in s])
        hidden = model.forward_packed(flat, [len(s) for s in seqs])
        for seq, got in zip(seqs, torch.split(hidden, [len(s) for s in seqs]), strict=True):
            worst = max(worst, (got - _alone(ref, seq)).abs().max().item())
    assert worst <= TOL, f"{name} at {budget}: max |diff| {worst:.3g}"


def ref_tok(model: LoadedModel, text: str) -> list[int]:
    """The text tokenized by transformers' own tokenizer of the checkpoint (bos, and eos for EmbeddingGemma)."""
    return list(model.hf_tokenizer(text)["input_ids"])


@pytest.mark.parametrize("name", ["gemma3", "gemma3-causal", "gemma2"])
def test_tokens_are_transformers_tokens(name, loaded) -> None:
    model = loaded(name)
    for text in GEMMA_TEXTS:
        ids = model.tokenizer.encode(text).ids
        assert ids == ref_tok(model, text)
        assert ids[0] == 2  # <bos>
        assert (ids[-1] == 1) == (name == "gemma3")  # <eos> appended by EmbeddingGemma's tokenizer only


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("name", ["gemma3", "gemma3-causal", "gemma2", "gemma"])
def test_runner_last_token_at_three_budgets(name, budget, loaded, reference) -> None:
    """Through the runner: at 24 tokens the causal models prefill their long rows in slices (KV cache with the
    window and the cap), the bidirectional one runs them alone."""
    model, ref = loaded(name), reference(name)
    runner = Runner(model, RunnerOptions(normalize=False, max_batch_tokens=budget))
    assert runner.sliceable == (name != "gemma3")
    got = runner.embed(list(GEMMA_TEXTS))
    want = np.stack([_alone(ref, ref_tok(model, t))[-1].numpy() for t in GEMMA_TEXTS])
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    if budget == 24 and name != "gemma3":
        assert runner.stats.sliced_rows > 0


def test_windows_and_caps_change_the_numbers(gemma, reference) -> None:
    """The fixtures are built so that dropping a window or a cap is visible: the same weights without them differ."""
    from transformers import AutoModel

    seq = [2, *range(300, 360)]
    for name, change in [("gemma3", {"sliding_window": 4096}), ("gemma2", {"sliding_window": 4096}),
                         ("gemma2", {"attn_logit_softcapping": None})]:
        config = json.loads((gemma[name] / "config.json").read_text(encoding="utf-8"))
        config.update(change)
        other = AutoModel.from_pretrained(
            str(gemma[name]), config=type(reference(name).config).from_dict(config),
            attn_implementation="eager", dtype=torch.float32,
        ).eval()
        assert (_alone(other, seq) - _alone(reference(name), seq)).abs().max().item() > 1e-2, (name, change)


# -- EmbeddingGemma end to end -------------------------------------------------------------------------


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("prompt_name", [None, "query", "document"])
def test_embeddinggemma_cli_matches_sentence_transformers(cli, gemma, tmp_path, prompt_name, budget) -> None:
    from sentence_transformers import SentenceTransformer

    folder = gemma["embeddinggemma"]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(GEMMA_TEXTS)))
    out = tmp_path / "e.parquet"
    flags = [] if prompt_name is None else ["--prompt-name", prompt_name]
    cli("embed", corpus, "-m", folder, "-o", out, "--max-batch-tokens", budget, *flags, "-q")
    got = np.asarray(pq.read_table(out).column("embedding").to_pylist(), dtype=np.float32)
    st = SentenceTransformer(str(folder), device="cpu")
    want = st.encode(list(GEMMA_TEXTS), prompt_name=prompt_name)
    assert got.shape == want.shape == (len(GEMMA_TEXTS), 32)
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)


def test_embeddinggemma_on_the_transformers_path_matches_too(cli, gemma, tmp_path) -> None:
    """transformers' Gemma3 modules on the packed attention keep the bidirectional window (packing's band)."""
    from sentence_transformers import SentenceTransformer

    folder = gemma["embeddinggemma"]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(GEMMA_TEXTS)))
    out = tmp_path / "e.parquet"
    cli("embed", corpus, "-m", folder, "-o", out, "--max-batch-tokens", 24, "--prompt-name", "query", "-q",
        env={"EMBEDCLI_BACKBONE": "transformers"})
    got = np.asarray(pq.read_table(out).column("embedding").to_pylist(), dtype=np.float32)
    want = SentenceTransformer(str(folder), device="cpu").encode(list(GEMMA_TEXTS), prompt_name="query")
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)


def test_embeddinggemma_runs_on_the_own_backbone_unsliced(loaded) -> None:
    model = loaded("embeddinggemma")
    assert model.own_backbone and not model.causal
    assert [d.out_features for d in model.spec.projector] == [64, 32]
    assert model.spec.prompt("query") == "task: search result | query: "
    assert not Runner(model, RunnerOptions(max_batch_tokens=8)).sliceable


# -- Gemma2 yes/no rerankers ---------------------------------------------------------------------------

PAIRS = [
    ("who won the election", "labour won the election"),
    ("market shares", "the quick brown fox jumps over the lazy dog"),
    ("hello", "zzz"),
    ("bank talks", " ".join(["shares rise after bank talks and the economy grows"] * 2)),
]
TEMPLATE = "query : {query} document : {document} answer yes or no :"


class LogitsReference:
    """Gemma2ForCausalLM (eager, float64): `sigmoid(logit_yes - logit_no)` at the last token, logits capped."""

    def __init__(self, folder: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32)
        self.model = model.double().eval()
        self.yes, self.no = self.tok.convert_tokens_to_ids("yes"), self.tok.convert_tokens_to_ids("no")

    @torch.no_grad()
    def score(self, ids: list[int], one: bool = False) -> float:
        logits = self.model(input_ids=torch.tensor([ids])).logits[0, -1]
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        assert cap is None or logits.abs().max() <= cap  # the cap is in the logits
        return float(torch.sigmoid(logits[self.yes] if one else logits[self.yes] - logits[self.no]))


def _pairs_file(tmp_path: Path) -> Path:
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "left": q, "right": d}) + "\n" for i, (q, d) in enumerate(PAIRS)))
    return path


def _scores(path: Path) -> np.ndarray:
    return np.asarray(pq.read_table(path).column("score").to_pylist(), dtype=np.float64)


@pytest.mark.parametrize("budget", BUDGETS)
def test_gemma2_template_score_matches_transformers_logits(cli, gemma, tmp_path, budget) -> None:
    flags = ("--classifier-from-tokens", "no,yes", "--pair-template", TEMPLATE)
    out = tmp_path / "s.parquet"
    cli("score", _pairs_file(tmp_path), "-m", gemma["gemma2"], *flags, "--max-batch-tokens", budget, "-o", out, "-q")
    ref = LogitsReference(gemma["gemma2"])
    want = [ref.score(ref.tok(TEMPLATE.format(query=q, document=d))["input_ids"]) for q, d in PAIRS]
    got = _scores(out)
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    assert np.ptp(got) > 1e-3


@pytest.mark.parametrize("budget", BUDGETS)
def test_gemma2_crossencoder_checkpoint_matches_crossencoder(cli, gemma, tmp_path, budget) -> None:
    from sentence_transformers import CrossEncoder

    folder = gemma["gemma2-ce"]
    out = tmp_path / "s.parquet"
    cli("score", _pairs_file(tmp_path), "-m", folder, "--max-batch-tokens", budget, "-o", out, "-q")
    got = _scores(out)
    np.testing.assert_allclose(got, CrossEncoder(str(folder), device="cpu").predict(PAIRS), rtol=0, atol=TOL)
    ref = LogitsReference(folder)
    np.testing.assert_allclose(got, [ref.score(ref.tok(q, d)["input_ids"]) for q, d in PAIRS], rtol=0, atol=TOL)


def test_gemma2_rerank_orders_by_the_capped_score(cli, gemma, tmp_path) -> None:
    docs = [d for _, d in PAIRS]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": d}) + "\n" for i, d in enumerate(docs)))
    query = "who won the election"
    cli("rerank", path, "-m", gemma["gemma2"], "--query", query, "--classifier-from-tokens", "no,yes",
        "--pair-template", TEMPLATE, "-o", tmp_path / "r.parquet", "-q")
    rows = pq.read_table(tmp_path / "r.parquet").to_pylist()
    ref = LogitsReference(gemma["gemma2"])
    want = {f"d{i}": ref.score(ref.tok(TEMPLATE.format(query=query, document=d))["input_ids"]) for i, d in enumerate(docs)}
    assert [r["id"] for r in rows] == sorted(want, key=lambda k: -want[k])
    for row in rows:
        assert abs(row["score"] - want[row["id"]]) <= TOL


@pytest.mark.parametrize("budget", BUDGETS)
def test_gemma2_score_on_the_transformers_path_matches_too(cli, gemma, tmp_path, budget) -> None:
    """transformers' modules on the packed attention: window (packing) and cap (the eager path) kept, long rows
    run alone rather than in slices (the KV-cache attention would drop both), the head's logits capped."""
    flags = ("--classifier-from-tokens", "no,yes", "--pair-template", TEMPLATE)
    out = tmp_path / "s.parquet"
    cli("score", _pairs_file(tmp_path), "-m", gemma["gemma2"], *flags, "--max-batch-tokens", budget, "-o", out, "-q",
        env={"EMBEDCLI_BACKBONE": "transformers"})
    ref = LogitsReference(gemma["gemma2"])
    want = [ref.score(ref.tok(TEMPLATE.format(query=q, document=d))["input_ids"]) for q, d in PAIRS]
    np.testing.assert_allclose(_scores(out), want, rtol=0, atol=TOL)


def test_transformers_path_never_slices_a_windowed_or_capped_model(gemma) -> None:
    spec = load_model_spec(str(gemma["gemma2-ce"]))
    model = LoadedModel(spec, ModelOptions(device="cpu", dtype="float32", backbone="transformers"))
    assert not model.own_backbone and model.causal and not model.can_slice


@pytest.mark.parametrize("budget", BUDGETS)
def test_gemma_v1_one_token_score_matches_transformers_logits(cli, gemma, tmp_path, budget) -> None:
    """bge-reranker-v2-gemma's recipe: Gemma (v1), sigmoid of one token's logit (`--classifier-from-tokens Yes`)."""
    flags = ("--classifier-from-tokens", "yes", "--pair-template", TEMPLATE)
    out = tmp_path / "s.parquet"
    cli("score", _pairs_file(tmp_path), "-m", gemma["gemma"], *flags, "--max-batch-tokens", budget, "-o", out, "-q")
    ref = LogitsReference(gemma["gemma"])
    want = [ref.score(ref.tok(TEMPLATE.format(query=q, document=d))["input_ids"], one=True) for q, d in PAIRS]
    np.testing.assert_allclose(_scores(out), want, rtol=0, atol=TOL)


def test_gemma_rerankers_run_on_the_own_backbone(gemma, loaded) -> None:
    from embedcli.models.llm_reranker import RerankerFlags

    model = loaded("gemma2-ce")
    assert model.own_backbone and model.can_slice and model.spec.head == "lm_score"
    spec = load_model_spec(str(gemma["gemma"]), reranker=RerankerFlags(classifier_from_tokens=("yes",)))
    model = LoadedModel(spec, ModelOptions(device="cpu", dtype="float32"))
    assert model.own_backbone and model.can_slice and model.spec.head == "lm_score"


def test_transformers_path_score_head_caps_the_logits(gemma) -> None:
    """The fallback's head (rows of transformers' lm_head) caps each logit as Gemma2ForCausalLM does."""
    from transformers import AutoModelForCausalLM

    spec = load_model_spec(str(gemma["gemma2-ce"]))
    model = AutoModelForCausalLM.from_pretrained(str(gemma["gemma2-ce"]), attn_implementation="eager").eval()
    ids = torch.tensor([[2, *range(300, 340)]])
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
        last = out.hidden_states[-1][:, -1]
        false_id, true_id = spec.score_token_ids
        want = out.logits[0, -1, true_id] - out.logits[0, -1, false_id]
        got = lm_score_head(model, spec)(last)[0, 0]
        raw = (last @ model.lm_head.weight[[true_id]].T - last @ model.lm_head.weight[[false_id]].T)[0, 0]
    assert abs(float(got - want)) <= 1e-6
    assert abs(float(raw - want)) > 1e-2  # uncapped would differ


@pytest.mark.parametrize("budget", BUDGETS)
def test_gemma2_sequence_classifier_matches_transformers(gemma, loaded, budget) -> None:
    from transformers import AutoModelForSequenceClassification

    model = loaded("gemma2-classifier")
    assert model.own_backbone and model.spec.head == "sequence_classification"
    runner = Runner(model, RunnerOptions(task="classify", max_batch_tokens=budget))
    got = runner.embed(list(GEMMA_TEXTS))
    ref = AutoModelForSequenceClassification.from_pretrained(str(gemma["gemma2-classifier"]), attn_implementation="eager")
    with torch.no_grad():
        logits = torch.cat([ref(input_ids=torch.tensor([ref_tok(model, t)])).logits for t in GEMMA_TEXTS])
    np.testing.assert_allclose(got, torch.softmax(logits, -1).numpy(), rtol=0, atol=TOL)


@pytest.mark.parametrize("name", ["embeddinggemma", "gemma3-causal", "gemma2"])
def test_bf16_autocast_stays_close_to_float32(gemma, loaded, name) -> None:
    """bf16 on the CPU (autocast over float32 weights) through the same paths, sliced prefill included."""
    bf16 = LoadedModel(load_model_spec(str(gemma[name])), ModelOptions(device="cpu", dtype="bfloat16"))
    assert bf16.own_backbone
    options = RunnerOptions(max_batch_tokens=24, normalize=True)
    got = Runner(bf16, options).embed(list(GEMMA_TEXTS))
    want = Runner(loaded(name), options).embed(list(GEMMA_TEXTS))
    cosines = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    assert cosines.min() > 0.999, cosines


# -- what check() refuses --------------------------------------------------------------------------------


def _config(folder: Path, **change: object) -> JsonConfig:
    data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    data.update(change)
    return JsonConfig(**data)


@pytest.mark.parametrize(
    "name, change, message",
    [
        ("gemma2", {"use_bidirectional_attention": True}, "bidirectional"),
        ("gemma2", {"layer_types": ["chunked_attention"] * 4}, "layer_types"),
        ("gemma2", {"layer_types": ["full_attention"] * 3}, "layer_types"),
        ("gemma2", {"sliding_window": None}, "sliding_window"),
        ("gemma2", {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}}, "rope_parameters"),
        ("gemma2", {"hidden_activation": "mish"}, "activation"),
        ("gemma2", {"attn_logit_softcapping": 0.0}, "attn_logit_softcapping"),
        ("gemma3", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
        ("gemma3", {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "rope_parameters"),  # not beside it
        ("gemma3-legacy", {"rope_scaling": {"type": "linear", "factor": 8.0}}, "rope_scaling"),
        ("gemma", {"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
        ("gemma", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ("gemma", {"hidden_act": "gelu_fancy"}, "activation"),
        ("gemma3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope_parameters"),
        ("gemma3", {"rope_parameters": {**LINEAR_ROPE, "sliding_attention": {"rope_type": "dynamic", "factor": 2.0}}},
         "rope_parameters"),
        ("gemma3", {"rope_parameters": {**LINEAR_ROPE, "full_attention": {"rope_type": "default",
                                                                          "partial_rotary_factor": 0.5}}},
         "partial"),
    ],
)
def test_check_refuses_what_it_does_not_compute(gemma, name, change, message) -> None:
    """The load-time guard (the registry's declarations) names the key it does not compute."""
    cls = {"gemma2": Gemma2Model, "gemma": GemmaV1Model}.get(name, Gemma3TextModel)
    cls.check(_config(gemma[name]))
    with pytest.raises(UnsupportedCheckpoint, match=message):
        cls.check(_config(gemma[name], **change))


def test_refused_config_falls_back_to_transformers(gemma, tmp_path) -> None:
    folder = Path(shutil.copytree(gemma["gemma2"], tmp_path / "g2"))
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10_000.0}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    model = LoadedModel(load_model_spec(str(folder)), ModelOptions(device="cpu", dtype="float32"))
    assert not model.own_backbone


def test_default_layer_types_follow_the_config_classes(gemma) -> None:
    g2 = _config(gemma["gemma2"], layer_types=None, num_hidden_layers=3)
    assert Gemma2Model.types_of_layers(g2) == ["sliding_attention", "full_attention", "sliding_attention"]
    g3 = _config(gemma["gemma3"], layer_types=None, num_hidden_layers=7)
    assert Gemma3TextModel.types_of_layers(g3) == ["sliding_attention"] * 5 + ["full_attention", "sliding_attention"]
    legacy = _config(gemma["gemma3-legacy"])
    assert Gemma3TextModel.rope_parameters(legacy, "sliding_attention") == {"rope_type": "default", "rope_theta": 100.0}
    assert Gemma3TextModel.rope_parameters(legacy, "full_attention")["rope_theta"] == 1_000_000.0


def test_window_reach_as_transformers_masks_it(gemma) -> None:
    # EmbeddingGemma's config stores the whole span (10 here, 512 real): transformers attends |i - j| < 10 // 2 + 1.
    assert layer_window(_config(gemma["gemma3"]), causal=False) == (5, 5)
    assert layer_window(_config(gemma["gemma2"]), causal=True) == (7, 0)
    data = json.loads((gemma["gemma2"] / "config.json").read_text(encoding="utf-8"))
    del data["sliding_window"]
    absent = JsonConfig(**data)
    Gemma2Model.check(absent)
    assert layer_window(absent, causal=True) == (4095, 0)  # Gemma2Config's default, 4096


def test_absent_caps_are_the_config_class_defaults(gemma) -> None:
    data = json.loads((gemma["gemma2"] / "config.json").read_text(encoding="utf-8"))
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        del data[key]
    absent = JsonConfig(**data)
    assert Gemma2Model.cap(absent, "attn_logit_softcapping") == 50.0  # Gemma2Config's defaults
    assert Gemma2Model.cap(absent, "final_logit_softcapping") == 30.0
    assert Gemma2Model.cap(_config(gemma["gemma2"], attn_logit_softcapping=None), "attn_logit_softcapping") is None
    assert Gemma3TextModel.cap(absent, "final_logit_softcapping") is None
    assert Gemma2Model(absent).layers[0].attn.softcap == 50.0
