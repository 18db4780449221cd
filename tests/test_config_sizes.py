"""Issue 22, poor errors: absurd config.json sizes (hidden or vocabulary 10^9, 10^6 layers, 0 heads) are one
line naming the key and what the weights say, before anything is allocated (`embedcli.models.checkpoint.config_sizes`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embedcli.errors import ModelConfigError
from embedcli.models.checkpoint.config_sizes import check_config_sizes, safetensors_shapes

REAL = ["bert-st", "bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "llama", "mistral", "qwen2", "qwen3"]


def _config(folder: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("name", REAL)
def test_the_configs_as_saved_pass(tiny_model, name: str) -> None:  # type: ignore[no-untyped-def]
    folder = tiny_model(name)
    check_config_sizes(folder, _config(folder), ("model.safetensors",))


def test_shapes_come_from_the_header_without_loading(tiny_model) -> None:  # type: ignore[no-untyped-def]
    from safetensors import safe_open

    path = tiny_model("bert") / "model.safetensors"
    with safe_open(str(path), "pt") as f:
        expected = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert safetensors_shapes(path) == expected


@pytest.mark.parametrize("name", ["bert", "llama"])
@pytest.mark.parametrize("change,says", [
    ({"hidden_size": 10**9}, "hidden_size 1,000,000,000"),
    ({"vocab_size": 10**9}, "vocab_size 1,000,000,000"),
    ({"num_hidden_layers": 10**6}, "num_hidden_layers 1,000,000, but the weights hold 2 layers"),
    ({"num_attention_heads": 0}, "num_attention_heads 0 is not a usable size"),
    ({"hidden_size": 10**12}, "not a usable size"),
    ({"num_hidden_layers": "2"}, "not an integer"),
])
def test_absurd_sizes_are_one_line(tiny_model, name: str, change: dict, says: str) -> None:  # type: ignore[no-untyped-def,type-arg]
    folder = tiny_model(name)
    with pytest.raises(ModelConfigError) as err:
        check_config_sizes(folder, {**_config(folder), **change}, ("model.safetensors",))
    assert says in str(err.value) and "config.json" in str(err.value) and "\n" not in str(err.value)


def test_a_truncated_header_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(ModelConfigError, match="not a readable safetensors file"):
        check_config_sizes(tmp_path, {"hidden_size": 4}, ("model.safetensors",))


def test_heads_that_do_not_divide_the_hidden_size(tiny_model) -> None:  # type: ignore[no-untyped-def]
    folder = tiny_model("bert")  # no head_dim in its config: hidden / heads is the head size
    with pytest.raises(ModelConfigError, match="not a multiple of num_attention_heads 5"):
        check_config_sizes(folder, {**_config(folder), "num_attention_heads": 5}, ("model.safetensors",))
