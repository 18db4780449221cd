"""A model's config.json sizes checked against its safetensors weights before anything is built (no torch).

An absurd config (a hidden or vocabulary size of 10^9, 10^6 layers, 0 heads) would otherwise end in an
allocator traceback or an hour-long hang while the backbone is allocated. The tensor shapes come from each
safetensors file's JSON header (8-byte length, then the header): nothing is loaded.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from embedcli.errors import ModelConfigError

MAX_SIZE = 1 << 31  # past any real model's hidden, vocabulary or intermediate size
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on a header
_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layer|layers|h|blocks|block)\.(\d+)\.")
_SIZE_KEYS = ("hidden_size", "vocab_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "max_position_embeddings", "head_dim")


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape from a safetensors file's header; ModelConfigError when the header is not one."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ValueError("shorter than a safetensors header")
            (size,) = struct.unpack("<Q", raw)
            if size > MAX_HEADER_BYTES:
                raise ValueError(f"a header of {size:,} bytes")
            header = json.loads(f.read(size))
    except (OSError, ValueError, RecursionError) as e:
        raise ModelConfigError(f"{path}: not a readable safetensors file ({e}); re-download the weights") from None
    if not isinstance(header, dict):
        raise ModelConfigError(f"{path}: the safetensors header is not an object; re-download the weights")
    return {name: tuple(int(d) for d in entry.get("shape", ())) for name, entry in header.items()
            if name != "__metadata__" and isinstance(entry, dict)}


def _sizes(config: Mapping[str, Any]) -> dict[str, Any]:
    """The size keys of a config, from `text_config` where a multimodal config nests them."""
    nested = config.get("text_config")
    source = nested if isinstance(nested, Mapping) and "hidden_size" in nested else config
    return {k: source[k] for k in _SIZE_KEYS if k in source}


def check_config_sizes(folder: Path, config: dict[str, Any], weight_files: tuple[str, ...]) -> None:
    """ModelConfigError (one line: the file, the key, what the weights say) when config.json's sizes cannot
    describe the weights in `weight_files` (names in `folder`; only `.safetensors` ones are read)."""
    where = f"{folder}/config.json"
    sizes = _sizes(config)
    for key, value in sizes.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelConfigError(f"{where}: {key} is {value!r}, not an integer; fix config.json")
        if value < 1 or value > MAX_SIZE:
            raise ModelConfigError(f"{where}: {key} {value:,} is not a usable size (1 to {MAX_SIZE:,}); fix config.json")
    shapes: dict[str, tuple[int, ...]] = {}
    for name in weight_files:
        if name.endswith(".safetensors"):
            shapes.update(safetensors_shapes(folder / name))
    if not shapes:
        return  # pickle weights only: their shapes are known only once loaded
    hidden, vocab = sizes.get("hidden_size"), sizes.get("vocab_size")
    matrices = [s for s in shapes.values() if len(s) == 2]
    if hidden is not None and matrices and not any(hidden in s for s in matrices):
        raise ModelConfigError(f"{where}: hidden_size {hidden:,}, but no weight matrix has that dimension "
                               f"(e.g. {_example(shapes)}); fix config.json or re-download the model")
    if vocab is not None and matrices and not any(vocab in s for s in matrices):
        raise ModelConfigError(f"{where}: vocab_size {vocab:,}, but no embedding matrix has {vocab:,} rows "
                               f"(e.g. {_example(shapes)}); fix config.json or re-download the model")
    layers = sizes.get("num_hidden_layers")
    indices = {int(m.group(1)) for name in shapes for m in [_LAYER_INDEX.search(name)] if m}
    if layers is not None and indices and layers > max(indices) + 1:
        raise ModelConfigError(f"{where}: num_hidden_layers {layers:,}, but the weights hold {max(indices) + 1} "
                               "layers; fix config.json or re-download the model")
    heads = sizes.get("num_attention_heads")
    if heads is not None and hidden is not None and "head_dim" not in sizes and hidden % heads:
        raise ModelConfigError(f"{where}: hidden_size {hidden:,} is not a multiple of num_attention_heads {heads:,}; "
                               "fix config.json")


def _example(shapes: dict[str, tuple[int, ...]]) -> str:
    name, shape = next((n, s) for n, s in shapes.items() if len(s) == 2)
    return f"{name} is {'x'.join(map(str, shape))}"
