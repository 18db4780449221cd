"""RoBERTa, XLM-RoBERTa and CamemBERT on the packed buffer: BERT's layers under the `roberta.` prefix.

What differs from BERT is the position ids: fairseq style, starting at `pad_token_id + 1`, a token equal to
the padding id taking the padding position (the loader's `LoadedModel.position_ids` numbers them from the ids).
"""

from __future__ import annotations

from typing import ClassVar

from embedcli.models.backbones.bert import BertModel


class RobertaModel(BertModel):
    """The RoBERTa encoder stack (no pooler)."""

    prefixes: ClassVar[tuple[str, ...]] = ("", "roberta.")
