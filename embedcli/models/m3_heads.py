"""BGE-M3's two FlagEmbedding heads loaded from the model folder, and the poolers that serve its tasks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from embedcli.errors import ModelConfigError
from embedcli.models.checkpoint.weights_file import check_safetensors
from embedcli.models.spec import ModelSpec
from embedcli.pooling import DispatchPooler, Pooler
from embedcli.pooling.m3 import M3ColbertPooler, M3HybridPooler, M3SparsePooler
from embedcli.pooling.token_projection import TokenProjection


def _state_dict(path: Path) -> dict[str, Any]:
    if path.suffix == ".safetensors":
        check_safetensors(path)
        return dict(load_file(str(path)))
    try:
        # Tensors and plain containers only (the restricted unpickler): no object of the file's choosing is
        # built and no code in it runs, so this needs no --allow-pickle (see embedcli.models.checkpoint.m3).
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ModelConfigError(
            f"{path}: not a tensors-only state dict ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
            "BGE-M3's heads are torch.save(linear.state_dict()) files"
        ) from e
    if not isinstance(state, dict):
        raise ModelConfigError(f"{path}: holds a {type(state).__name__}, not a Linear layer's state dict")
    return dict(state)


def load_m3_linear(path: Path, in_features: int, out_features: int) -> TokenProjection:
    """The float32 token projection `Linear(in_features, out_features)` saved in `path` (FlagEmbedding's
    `module.` prefix allowed): the one head type of per-token projections, as ColBERT's."""
    state = {k.removeprefix("module."): v for k, v in _state_dict(path).items()}
    weight, bias = state.get("weight"), state.get("bias")
    if not isinstance(weight, torch.Tensor) or not isinstance(bias, torch.Tensor):
        raise ModelConfigError(f"{path}: needs 'weight' and 'bias' tensors; it has {sorted(state)}")
    if tuple(weight.shape) != (out_features, in_features) or tuple(bias.shape) != (out_features,):
        raise ModelConfigError(
            f"{path}: weight {tuple(weight.shape)} / bias {tuple(bias.shape)}; embedcli reads BGE-M3's head as "
            f"Linear({in_features} -> {out_features}) on the model's hidden size"
        )
    return TokenProjection(weight, bias)


def m3_skip_ids(tokenizer: Any) -> tuple[int, ...]:
    """The ids FlagEmbedding leaves out of the lexical weights: the tokenizer's cls, eos, pad and unk tokens."""
    ids = (getattr(tokenizer, f"{name}_token_id", None) for name in ("cls", "eos", "pad", "unk"))
    return tuple(sorted({int(i) for i in ids if isinstance(i, int)}))


def m3_pooler(spec: ModelSpec, dense: Pooler, tokenizer: Any, outputs: tuple[str, ...] | None) -> DispatchPooler:
    """The poolers of a BGE-M3 model: `embed` (the dense pooler given), `sparse_embed`, `token_embed` (colbert)
    and `hybrid_embed` (`outputs`, default all three, from one forward)."""
    folder = Path(spec.path)
    colbert_file, sparse_file = spec.m3_heads
    hidden = spec.hidden_size
    sparse = M3SparsePooler(load_m3_linear(folder / sparse_file, hidden, 1), m3_skip_ids(tokenizer))
    colbert = M3ColbertPooler(load_m3_linear(folder / colbert_file, hidden, hidden))
    hybrid = M3HybridPooler(dense, sparse, colbert, outputs or ("dense", "sparse", "colbert"))
    return DispatchPooler({"embed": dense, "sparse_embed": sparse, "token_embed": colbert, "hybrid_embed": hybrid})
