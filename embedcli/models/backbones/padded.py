"""The exact fallback: transformers' own modules run in ordinary padded batches, never on the packed buffer.

The runner still hands over a pack (sequences laid end to end under the token budget); here it is cut
into padded batches of similar length (longest first, `packing.length_groups`), each run by the transformers model with its own
attention mask and attention implementation, and the real tokens' rows are laid end to end again. So a
checkpoint whose attention transformers (or its remote code) builds its own way — sliding windows, softcaps,
custom kernels — computes exactly what sentence-transformers gets from the same modules.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from embedcli.models.kernels.packing import PackInfo, length_groups

HIDDEN, TOKEN_LOGITS, SEQUENCE_LOGITS = "hidden", "token_logits", "sequence_logits"


class PaddedBackbone(nn.Module):
    """A transformers model behind the own backbones' call `(ids, positions, pack, token_type_ids)`.

    `output`: `hidden` (last hidden states, `[total, hidden]`), `token_logits` (a token classifier's logits,
    `[total, labels]`), or `sequence_logits` (a sequence classifier's logits, placed on the row of each
    sequence the classify pooler picks: its first token, or its last for `pool_last`; zeros elsewhere).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        output: str = HIDDEN,
        pad_id: int = 0,
        token_types: bool = False,
        pool_last: bool = False,
    ) -> None:
        super().__init__()
        if output not in (HIDDEN, TOKEN_LOGITS, SEQUENCE_LOGITS):
            raise ValueError(f"output {output!r}")
        self.model = model
        self.config = model.config
        self.output = output
        self.pad_id = pad_id
        self.pool_last = pool_last
        accepted = inspect.signature(model.forward).parameters
        self.token_types = token_types and "token_type_ids" in accepted
        self.use_cache = "use_cache" in accepted

    def _run(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor | None) -> torch.Tensor:
        kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if types is not None:
            kwargs["token_type_ids"] = types
        if self.use_cache:
            kwargs["use_cache"] = False
        out = self.model(**kwargs)
        if self.output == HIDDEN:
            return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        return out.logits if hasattr(out, "logits") else out[0]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        pack: PackInfo,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Rows `[total, width]` of the packed sequences, computed in padded batches."""
        lengths = [int(n) for n in pack.lengths]
        starts = [0]
        for n in lengths:
            starts.append(starts[-1] + n)
        out: torch.Tensor | None = None
        for group in length_groups(lengths):
            width = lengths[group[0]]
            ids = input_ids.new_full((len(group), width), self.pad_id)
            mask = input_ids.new_zeros((len(group), width))
            types = input_ids.new_zeros((len(group), width)) if self.token_types else None
            for b, i in enumerate(group):
                n, s = lengths[i], starts[i]
                ids[b, :n] = input_ids[s : s + n]
                mask[b, :n] = 1 if pack.keys is None else pack.keys[s : s + n].to(mask.dtype)
                if types is not None and token_type_ids is not None:
                    types[b, :n] = token_type_ids[s : s + n]
            result = self._run(ids, mask, types)
            if out is None:
                out = result.new_zeros((starts[-1], result.shape[-1]))
            for b, i in enumerate(group):
                n, s = lengths[i], starts[i]
                if self.output == SEQUENCE_LOGITS:
                    out[s + (n - 1 if self.pool_last else 0)] = result[b]
                else:
                    out[s : s + n] = result[b, :n]
        if out is None:
            raise ValueError("an empty pack")
        return out
