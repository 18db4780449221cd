"""BGE-M3's rules on the command line, decided from the spec alone: which outputs `embed --outputs` names, and
the flags `embed`, `sparse-embed` and `token-embed` refuse on FlagEmbedding's outputs."""

from __future__ import annotations

from typing import Any

from embedcli.errors import UsageError
from embedcli.models.spec import ModelSpec

M3_OUTPUTS: tuple[str, ...] = ("dense", "sparse", "colbert")


def parse_outputs(text: str) -> tuple[str, ...]:
    """`--outputs dense,sparse,colbert` as a tuple in the order given (each once); UsageError for others."""
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    bad = [n for n in names if n not in M3_OUTPUTS]
    if bad or not names:
        raise UsageError(f"--outputs {text!r}: a comma-separated subset of {', '.join(M3_OUTPUTS)}")
    return names


def require_m3(spec: ModelSpec, what: str) -> None:
    """UsageError unless `spec` is a BGE-M3 folder (FlagEmbedding's colbert and sparse heads beside it)."""
    if not spec.m3_heads:
        raise UsageError(
            f"{what}: model {spec.name!r} has no BGE-M3 heads (colbert_linear.pt and sparse_linear.pt beside "
            "its weights); only the dense vector (--outputs dense) is defined for it"
        )


def m3_extra(spec: ModelSpec) -> dict[str, Any]:
    """Provenance of a BGE-M3 output's heads (empty for every other model, whose provenance stays as it was)."""
    return {"m3_heads": list(spec.m3_heads)} if spec.m3_heads else {}


def check_m3_token_embed(spec: ModelSpec, dimensions: int | None, normalize: bool | None, step_tag_id: int | None) -> None:
    """`token-embed` on BGE-M3 gives FlagEmbedding's colbert vectors: the flags that would change them are refused."""
    if not spec.m3_heads:
        return
    given = [flag for flag, value in (("--dimensions", dimensions), ("--normalize/--no-normalize", normalize),
                                      ("--step-tag-id", step_tag_id)) if value is not None]
    if given:
        raise UsageError(
            f"token-embed: {', '.join(given)} do not apply to BGE-M3's colbert vectors "
            "(normalize(colbert_linear(h)) of every token after <s>, as FlagEmbedding); drop them"
        )


def check_m3_sparse(spec: ModelSpec, top_k: int | None) -> None:
    """`sparse-embed` on BGE-M3 gives FlagEmbedding's lexical weights whole: `--sparse-top-k` is refused."""
    if spec.m3_heads and top_k is not None:
        raise UsageError("sparse-embed: --sparse-top-k cuts SPLADE vectors; BGE-M3's lexical weights are kept whole "
                         "(every token id of the text with a weight above 0, as FlagEmbedding)")
