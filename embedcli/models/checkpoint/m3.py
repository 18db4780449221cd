"""BGE-M3 (BAAI/bge-m3): FlagEmbedding's two heads beside an encoder in the sentence-transformers layout.

The folder is a plain XLM-R checkpoint (Transformer → Pooling(cls) → Normalize: the dense vector) plus root
files `colbert_linear.pt` (Linear hidden → hidden) and `sparse_linear.pt` (Linear hidden → 1), each a
`torch.save`d state dict; a `.safetensors` file of the same stem is read instead where one is there. They are
read with `torch.load(weights_only=True)`, as FlagEmbedding itself reads them: its restricted unpickler builds
tensors and plain containers only and refuses any other object, so no code from the file runs and
`--allow-pickle` (which opts in to the full pickle loader for model weights) is not needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embedcli.errors import ConfigRefusedError, ModelConfigError

M3_HEAD_STEMS: tuple[str, ...] = ("colbert_linear", "sparse_linear")
M3_HEAD_FILES: tuple[str, ...] = tuple(f"{stem}.{ext}" for stem in M3_HEAD_STEMS for ext in ("pt", "safetensors"))
"""The root files a Hub download fetches too (pickle weights are skipped otherwise)."""


def m3_head_files(folder: Path) -> tuple[str, ...] | None:
    """(colbert file, sparse file) of a BGE-M3 folder, safetensors preferred; None when it has neither head."""
    found: list[str | None] = []
    for stem in M3_HEAD_STEMS:
        names = [f"{stem}.safetensors", f"{stem}.pt"]
        found.append(next((n for n in names if (folder / n).is_file()), None))
    if not any(found):
        return None
    if not all(found):
        missing = [s for s, f in zip(M3_HEAD_STEMS, found, strict=True) if f is None]
        raise ModelConfigError(
            f"{folder}: {', '.join(f'{s}.pt' for s in missing)} is missing beside "
            f"{', '.join(f for f in found if f)}; a BGE-M3 folder has both heads (FlagEmbedding would start the "
            "missing one from random weights)"
        )
    return (str(found[0]), str(found[1]))


def read_m3(folder: Path, architecture: str, pooling_modes: tuple[str, ...]) -> dict[str, Any] | None:
    """The ModelSpec fields of a BGE-M3 folder (its head files), or None when the folder is not one."""
    files = m3_head_files(folder)
    if files is None:
        return None
    if architecture.endswith(("ForSequenceClassification", "ForTokenClassification", "ForMaskedLM", "ForCausalLM")):
        raise ConfigRefusedError(
            f"{folder}: colbert_linear / sparse_linear heads beside a {architecture}; BGE-M3's heads sit on the "
            "encoder's hidden states (an XLMRobertaModel)"
        )
    if tuple(pooling_modes) != ("cls",):
        raise ConfigRefusedError(
            f"{folder}: BGE-M3 heads with pooling {'+'.join(pooling_modes)}; FlagEmbedding's dense vector is the "
            "[CLS] row (1_Pooling/config.json: pooling_mode_cls_token)"
        )
    return {"m3_heads": files}
