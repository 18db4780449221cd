"""LAST pooling on the converted SmolLM2 (a real Llama decoder) against transformers' last hidden state.

Each text is run alone through transformers (no padding, plain token ids, no chat template) and its
last hidden state at the last token is compared with embedcli's packed LAST-pooled vector (unnormalized).
Convert the model first: `python benchmarks/bench_long_doc.py --convert-only` (or any run of it).

    python benchmarks/check_smollm2_last.py
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from embedcli.bench import bbc_texts
from embedcli.compute.runner import Runner, RunnerOptions
from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.spec import load_model_spec


def main() -> None:
    path = Path(os.environ.get("EMBEDCLI_SMOLLM2", Path.home() / ".cache" / "embedcli" / "smollm2"))
    texts = [t[: 200 + 97 * i] for i, t in enumerate(bbc_texts(40))]
    loaded = LoadedModel(load_model_spec(str(path)), ModelOptions(device="cpu", dtype="float32"))
    ours = Runner(loaded, RunnerOptions(normalize=False, max_batch_tokens=2048)).embed(texts)

    from transformers import AutoModel

    ref_model = AutoModel.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager").eval()
    tok = loaded.tokenizer
    tok.no_truncation()
    worst = 0.0
    with torch.inference_mode():
        for text, vec in zip(texts, ours, strict=True):
            ids = tok.encode(text.strip()).ids
            hidden = ref_model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1].numpy()
            worst = max(worst, float(np.abs(hidden - vec).max()))
    print(f"SmolLM2 LAST vs transformers, {len(texts)} texts: max abs {worst:.3g}")


if __name__ == "__main__":
    main()
