"""Late-interaction (ColBERT) checkpoints in their two layouts, read without torch into one `LateInteraction`.

- **Stanford** (colbert-ir/colbertv2.0, `architectures: ["HF_ColBERT"]`): BERT tensors under `bert.` and a root
  `linear.weight` `[dim, hidden]` (no bias) in model.safetensors; `artifact.metadata` names the markers
  (`query_token_id` "[unused0]", `doc_token_id` "[unused1]"), `query_maxlen`, `doc_maxlen`,
  `attend_to_mask_tokens` and `mask_punctuation` (the skiplist: `string.punctuation`). Queries are always
  padded with `[MASK]` to `query_maxlen` (colbert-ai's query augmentation).
- **PyLate** (answerdotai/answerai-colbert-small-v1, lightonai/*): modules.json [Transformer, Dense] and
  `config_sentence_transformers.json` with `similarity_fn_name: "MaxSim"`, `query_prefix` / `document_prefix`,
  `query_length`, `document_length`, `do_query_expansion`, `attend_to_expansion_tokens`, `skiplist_words`.

- **MultiVectorEncoder** (sentence-transformers 6's own save): modules [Transformer, Dense, MultiVectorMask,
  Normalize]; the markers are the `query` / `document` prompts, `query_expansion` / `document_length` sit in
  sentence_bert_config.json, the skiplist in the MultiVectorMask module's config.

Defaults are sentence-transformers 6's `MultiVectorEncoder` (which reads both): markers `[unused0]`/`[unused1]`,
query length 32, expansion on, not attended, and the punctuation skiplist when a PyLate save names none.
"""

from __future__ import annotations

import json
import string
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedcli.errors import ConfigRefusedError, ModelConfigError
from embedcli.models.checkpoint.st_config import read_json

STANFORD_ARCHITECTURE = "HF_ColBERT"
STANFORD_METADATA = "artifact.metadata"
STANFORD_PROJECTION = "linear.weight"
# PyLate's keys in config_sentence_transformers.json (any of them marks a PyLate save, as for sentence-transformers).
PYLATE_KEYS = (
    "query_prefix", "document_prefix", "query_length", "document_length", "do_query_expansion",
    "attend_to_expansion_tokens", "skiplist_words",
)
MAXSIM_NAMES = ("maxsim", "MaxSim")
ROLES = ("query", "document")


@dataclass(frozen=True)
class LateInteraction:
    """How a ColBERT model turns a query or a document into token vectors (the head itself is the projector).

    A query: the first token, `query_marker`, the text, cut to `query_length` tokens; with expansion, padded
    to exactly `query_length` with the mask token, attended or not (`attend_expansion`), every vector kept.
    A document: the first token, `document_marker`, the text, cut to `document_length`; the vectors of tokens
    in `skiplist` are dropped.
    """

    layout: str  # "stanford" | "pylate"
    query_marker: str
    document_marker: str
    query_length: int
    document_length: int
    query_expansion: bool
    attend_expansion: bool
    skiplist: tuple[str, ...]
    dim: int
    source: str

    def length(self, role: str) -> int:
        """The token count a text of `role` is cut to."""
        return self.query_length if role == "query" else self.document_length

    def describe(self) -> str:
        """One line for `embedcli info`."""
        expansion = (
            f"padded with the mask token to {self.query_length} ({'attended' if self.attend_expansion else 'not attended'})"
            if self.query_expansion else "no expansion"
        )
        return (
            f"ColBERT ({self.layout}, {self.source}): query = {self.query_marker!r} + text, {self.query_length} "
            f"tokens, {expansion}; document = {self.document_marker!r} + text, up to {self.document_length} "
            f"tokens, the tokens of its {len(self.skiplist)} skiplist words dropped; {self.dim}-dim vectors, L2-normalized; MaxSim"
        )


def is_stanford(config: dict[str, Any]) -> bool:
    """Whether config.json is a Stanford-NLP ColBERT checkpoint's."""
    return STANFORD_ARCHITECTURE in (config.get("architectures") or [])


def is_pylate(st_cfg: dict[str, Any]) -> bool:
    """Whether config_sentence_transformers.json is a PyLate (or PyLate v3 `ColBERT`) save's."""
    return (
        st_cfg.get("similarity_fn_name") in MAXSIM_NAMES
        or st_cfg.get("model_type") == "ColBERT"
        or any(k in st_cfg for k in PYLATE_KEYS)
    )


def safetensors_shape(path: Path, name: str) -> tuple[int, ...] | None:
    """The shape of tensor `name` in a safetensors file's header, or None when it holds no such tensor."""
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    entry = header.get(name)
    return tuple(int(d) for d in entry["shape"]) if isinstance(entry, dict) else None


def _positive(value: Any, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ConfigRefusedError(f"{where}: {key} {value!r} must be an integer of at least 2 (marker + one token)")
    return value


def read_stanford(folder: Path, hidden: int, max_length: int) -> tuple[LateInteraction, tuple[int, int]]:
    """The `LateInteraction` of a Stanford checkpoint and its projection's `[dim, hidden]` shape."""
    weights = folder / "model.safetensors"
    shape = safetensors_shape(weights, STANFORD_PROJECTION) if weights.is_file() else None
    if shape is None or len(shape) != 2:
        raise ModelConfigError(
            f"{weights}: no root {STANFORD_PROJECTION!r} [dim, hidden] tensor; a Stanford ColBERT (HF_ColBERT) "
            "checkpoint keeps its projection there (convert pickle weights to model.safetensors first)"
        )
    if shape[1] != hidden:
        raise ModelConfigError(f"{weights}: {STANFORD_PROJECTION} has shape {list(shape)}, not [dim, {hidden}]")
    meta_path = folder / STANFORD_METADATA
    meta = read_json(meta_path) if meta_path.is_file() else {}
    where = str(meta_path)
    doc = meta.get("doc_maxlen")
    spec = LateInteraction(
        layout="stanford",
        query_marker=str(meta.get("query_token_id") or "[unused0]"),
        document_marker=str(meta.get("doc_token_id") or "[unused1]"),
        query_length=_positive(meta.get("query_maxlen") or 32, where, "query_maxlen"),
        document_length=min(_positive(doc, where, "doc_maxlen"), max_length) if doc is not None else max_length,
        query_expansion=True,
        attend_expansion=bool(meta.get("attend_to_mask_tokens")),
        skiplist=tuple(string.punctuation) if meta.get("mask_punctuation", True) else (),
        dim=int(shape[0]),
        source=STANFORD_METADATA if meta else f"defaults ({STANFORD_METADATA} missing)",
    )
    return spec, (int(shape[0]), int(shape[1]))


def read_pylate(folder: Path, st_cfg: dict[str, Any], dim: int, max_length: int, st_max: int) -> LateInteraction:
    """The `LateInteraction` of a PyLate save (its config_sentence_transformers.json), projecting to `dim`;
    a role without a length is cut at `st_max` (the Transformer's max_seq_length)."""
    where = str(folder / "config_sentence_transformers.json")
    if isinstance(st_cfg.get("query_expansion"), dict):
        raise ConfigRefusedError(f"{where}: a query_expansion dict (sentence-transformers 6 layout) is not supported")
    prompts = st_cfg.get("prompts") or {}
    if any(prompts.get(role) for role in ROLES):
        raise ConfigRefusedError(f"{where}: query/document prompts besides PyLate's prefixes are not supported")
    expansion = st_cfg.get("do_query_expansion") is not False
    attend = st_cfg.get("attend_to_expansion_tokens", st_cfg.get("attend_to_mask_tokens"))
    doc = st_cfg.get("document_length")
    skiplist = st_cfg.get("skiplist_words")
    if skiplist is not None and not (isinstance(skiplist, list) and all(isinstance(w, str) for w in skiplist)):
        raise ConfigRefusedError(f"{where}: skiplist_words must be a list of strings")
    return LateInteraction(
        layout="pylate",
        query_marker=str(st_cfg.get("query_prefix") or ""),
        document_marker=str(st_cfg.get("document_prefix") or ""),
        query_length=_positive(st_cfg.get("query_length") or 32, where, "query_length"),
        document_length=min(_positive(doc, where, "document_length"), max_length) if doc is not None else st_max,
        query_expansion=expansion,
        attend_expansion=bool(attend),
        # PyLate's default skiplist is the punctuation (sentence-transformers keeps it for PyLate saves).
        skiplist=tuple(skiplist) if skiplist is not None else tuple(string.punctuation),
        dim=dim,
        source="config_sentence_transformers.json",
    )


def read_native(
    folder: Path, st_cfg: dict[str, Any], sbert: dict[str, Any], mask: dict[str, Any], dim: int, max_length: int,
    st_max: int,
) -> LateInteraction:
    """The `LateInteraction` of a sentence-transformers 6 MultiVectorEncoder save: the prompts are the markers,
    the Transformer's sentence_bert_config.json holds the lengths and query expansion, the MultiVectorMask
    module the skiplist."""
    where = str(folder / "sentence_bert_config.json")
    similarity = st_cfg.get("similarity_fn_name")
    if similarity not in (None, "maxsim"):
        raise ConfigRefusedError(f"{folder / 'config_sentence_transformers.json'}: similarity_fn_name {similarity!r} "
                                 "is not supported; embedcli scores MultiVectorEncoder models by MaxSim")
    mask_where = "MultiVectorMask config.json"
    if (mask.get("skiplist_tasks") or ["document"]) != ["document"] or mask.get("keep_only_token_ids"):
        raise ConfigRefusedError(f"{folder}: {mask_where}: a skiplist on queries or keep_only_token_ids is not supported")
    expansion = sbert.get("query_expansion")
    if expansion is not None and (
        not isinstance(expansion, dict) or expansion.get("strategy") != "fixed" or expansion.get("token") is not None
    ):
        raise ConfigRefusedError(
            f"{where}: query_expansion {expansion!r} is not supported; embedcli pads queries with the mask token "
            "to a fixed length (strategy fixed)"
        )
    prompts = st_cfg.get("prompts") or {}
    if st_cfg.get("default_prompt_name"):
        raise ConfigRefusedError(f"{folder / 'config_sentence_transformers.json'}: default_prompt_name is not supported")
    doc, query = sbert.get("document_length"), sbert.get("query_length")
    return LateInteraction(
        layout="multi-vector-encoder",
        query_marker=str(prompts.get("query") or ""),
        document_marker=str(prompts.get("document") or ""),
        query_length=_positive(expansion["length"], where, "query_expansion.length") if expansion
        else (min(_positive(query, where, "query_length"), max_length) if query is not None else st_max),
        document_length=min(_positive(doc, where, "document_length"), max_length) if doc is not None else st_max,
        query_expansion=expansion is not None,
        attend_expansion=bool(expansion and expansion.get("attend")),
        skiplist=tuple(str(w) for w in mask.get("skiplist_words") or ()),
        dim=dim,
        source="sentence_bert_config.json + MultiVectorMask",
    )
