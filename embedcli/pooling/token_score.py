"""The LLM-as-reranker head: a causal LM's logits for a few named tokens at the last position, as one score.

vLLM's `classifier_from_token` conversion (and sentence-transformers 6's `LogitScore`): only the LM head's
rows for the named tokens are kept, so the last hidden state is multiplied by `[k, hidden]`, never by the
whole `[vocab, hidden]` head. Two tokens `(false, true)` (vLLM's order: `--classifier-from-tokens no,yes`)
give `logit_true - logit_false`, whose sigmoid is the two-way softmax probability of the true token; one token
gives its logit, whose sigmoid is the score.
"""

from __future__ import annotations

import torch
from torch import nn

from embedcli.errors import PoolingConfigError


class TokenLogitScore(nn.Module):
    """`[n, hidden]` last hidden states → `[n, 1]`: `logit[true] - logit[false]`, or `logit[token]` for one token."""

    rows: torch.Tensor  # buffers, registered in __init__
    bias: torch.Tensor | None

    def __init__(self, rows: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if rows.ndim != 2 or rows.shape[0] not in (1, 2):
            raise PoolingConfigError(
                f"a token score head takes one or two LM-head rows, got shape {tuple(rows.shape)}"
            )
        # Float32 rows: the difference of two nearly equal logits must not lose the bf16 mantissa.
        self.register_buffer("rows", rows.detach().to(torch.float32).clone())
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.float32).clone())

    @classmethod
    def from_lm_head(cls, lm_head: nn.Module, token_ids: tuple[int, ...]) -> TokenLogitScore:
        """The head for `token_ids` ((false, true) or (token,)) sliced out of a causal LM's `lm_head` Linear."""
        weight = getattr(lm_head, "weight", None)
        if weight is None:
            raise PoolingConfigError(f"{type(lm_head).__name__} has no weight to take token rows from")
        vocab = weight.shape[0]
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise PoolingConfigError(f"token ids {bad} are outside the LM head's vocabulary of {vocab}")
        index = torch.tensor(token_ids, dtype=torch.long, device=weight.device)
        bias = getattr(lm_head, "bias", None)
        return cls(weight.index_select(0, index), None if bias is None else bias.index_select(0, index))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = hidden.to(torch.float32) @ self.rows.T
        if self.bias is not None:
            logits = logits + self.bias
        if logits.shape[-1] == 2:
            return logits[..., 1:2] - logits[..., 0:1]
        return logits
