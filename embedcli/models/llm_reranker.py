"""Causal LMs as rerankers: which tokens score a pair, and how a (query, document) pair becomes one prompt.

Read from the checkpoint when it says (sentence-transformers 6's CrossEncoder on a causal LM saves a
`LogitScore` module with `true_token_id` / `false_token_id`), else from flags that mirror vLLM's conversion:
`--classifier-from-tokens no,yes` (false token first, as vLLM's `classifier_from_token`) and
`--pair-template` with `{query}`, `{document}` and an optional `{instruction}`; `--reranker-preset
qwen3-reranker` sets both to Qwen3-Reranker's published prompt.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from embedcli.errors import ConfigRefusedError, UsageError

# Qwen3-Reranker's prompt, as in its model card and vLLM's `qwen3_reranker` example.
QWEN3_RERANKER_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
QWEN3_RERANKER_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


@dataclass(frozen=True)
class RerankerPreset:
    """A named reranker recipe: score tokens (false, true), pair template, default instruction."""

    tokens: tuple[str, ...]
    template: str
    instruction: str


PRESETS: dict[str, RerankerPreset] = {
    "qwen3-reranker": RerankerPreset(("no", "yes"), QWEN3_RERANKER_TEMPLATE, QWEN3_RERANKER_INSTRUCTION),
}


@dataclass(frozen=True)
class RerankerFlags:
    """What the user said about scoring a causal LM as a reranker (all optional; the checkpoint fills gaps)."""

    classifier_from_tokens: tuple[str, ...] | None = None
    pair_template: str | None = None
    instruction: str | None = None
    preset: str | None = None

    @property
    def given(self) -> bool:
        """Whether any flag was set."""
        return any(v is not None for v in (self.classifier_from_tokens, self.pair_template, self.preset))


def parse_tokens(value: str | None) -> tuple[str, ...] | None:
    """`no,yes` → ("no", "yes"); empty → None. Tokens are vocabulary entries, not re-tokenized text."""
    if not value:
        return None
    return tuple(t for t in value.split(",") if t != "")


def check_template(template: str, where: str) -> None:
    """A ValueError unless `template` has `{query}` and `{document}` and no other fields than `{instruction}`."""
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as e:
        raise ValueError(f"{where}: not a valid template ({e}); write literal braces as {{{{ and }}}}") from e
    missing = {"query", "document"} - fields
    extra = fields - {"query", "document", "instruction"}
    if missing:
        raise ValueError(f"{where}: the template lacks {', '.join('{' + m + '}' for m in sorted(missing))}")
    if extra:
        raise ValueError(f"{where}: unknown template fields {', '.join('{' + e + '}' for e in sorted(extra))}; "
                         "use {query}, {document} and {instruction}")


def refuse_format_specs(template: str, flag: str) -> None:
    """UsageError unless every field of `template` is a plain `{name}`: a format spec or conversion
    (`{query:>100000000}` pads for ever, `{query:{document}}` nests, `{query!r}`) is refused before use."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise UsageError(f"{flag}: not a valid template ({e}); write literal braces as {{{{ and }}}}") from None
    for _, name, spec, conversion in parsed:
        if name is not None and (spec or conversion):
            field = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise UsageError(f"{flag}: {field} has a format spec or conversion; use plain fields only: "
                             "{query}, {document}, {instruction}")


def reranker_flags(
    tokens: str | None, template: str | None, instruction: str | None, preset: str | None
) -> RerankerFlags | None:
    """The `RerankerFlags` of the command line or `embedcli.Embedder` (None when no reranker flag was given)."""
    if preset is not None and preset not in PRESETS:
        raise UsageError(f"--reranker-preset {preset!r}: choose one of {', '.join(PRESETS)}")
    parsed = parse_tokens(tokens)
    if tokens is not None and (not parsed or len(parsed) > 2):
        raise UsageError(f"--classifier-from-tokens {tokens!r}: give one token or two, FALSE,TRUE (e.g. no,yes)")
    if template is not None:
        refuse_format_specs(template, "--pair-template")
        try:
            check_template(template, "--pair-template")
        except ValueError as e:
            raise UsageError(str(e)) from None
    flags = RerankerFlags(parsed, template, instruction, preset)
    if not flags.given:
        if instruction is not None:
            raise UsageError("--instruction fills a pair template: give --pair-template or --reranker-preset too")
        return None
    return flags


def score_formula(tokens: Sequence[str]) -> str:
    """The score as a formula over the named tokens' logits at the last position."""
    if len(tokens) == 2:
        return f"sigmoid(logit({tokens[1]!r}) - logit({tokens[0]!r})) at the last token"
    return f"sigmoid(logit({tokens[0]!r})) at the last token"


class PairTemplate:
    """Renders (query, document) into one prompt, cutting the document so the template's suffix stays.

    The length is measured with the model's own tokenizer (a private copy, no truncation), special tokens
    included. When the rendered pair is over `max_length`, the document is cut at a token boundary (its
    text sliced at the token's character offset, so no decode/re-encode drift, as vLLM's per-side caps) and
    the pair re-rendered until it fits; a query so long that not even an empty document fits is cut the
    same way.
    """

    def __init__(self, template: str, instruction: str | None, tokenizer: Any, max_length: int) -> None:
        check_template(template, "--pair-template")
        self.template = template
        self.instruction = instruction or ""
        self.max_length = max_length
        from tokenizers import Tokenizer  # here, not at import: the CLI imports this module for its flags

        self._tok = Tokenizer.from_str(tokenizer.to_str())
        self._tok.no_truncation()
        self._tok.no_padding()
        bare = self._length(self.fill("", ""))
        if bare > max_length:
            raise ValueError(
                f"the pair template alone is {bare} tokens, over the max length {max_length}: no document "
                "would fit; shorten the template or the instruction, or raise --max-length"
            )

    def fill(self, query: str, document: str) -> str:
        """The template with the fields filled in (no truncation)."""
        return self.template.format(query=query, document=document, instruction=self.instruction)

    def _length(self, text: str) -> int:
        return len(self._tok.encode(text).ids)

    def _cut(self, text: str, keep_tokens: int) -> str:
        if keep_tokens <= 0:
            return ""
        offsets = self._tok.encode(text, add_special_tokens=False).offsets
        if keep_tokens >= len(offsets):
            return text
        return text[: offsets[keep_tokens - 1][1]]

    def _fit(self, render: Any, text: str) -> str | None:
        """The longest prefix of `text` (at a token boundary) for which `render(prefix)` fits, or None."""
        full = render(text)
        over = self._length(full) - self.max_length
        if over <= 0:
            return full
        keep = len(self._tok.encode(text, add_special_tokens=False).ids) - over
        while keep > 0:
            candidate = render(self._cut(text, keep))
            over = self._length(candidate) - self.max_length
            if over <= 0:
                return candidate
            keep -= over
        empty = render("")
        return empty if self._length(empty) <= self.max_length else None

    def render(self, query: str, document: str, truncate: bool = True) -> str:
        """The prompt for one pair; with `truncate`, cut (document first) to fit `max_length` tokens."""
        if not truncate:
            return self.fill(query, document)
        fitted = self._fit(lambda d: self.fill(query, d), document)
        if fitted is not None:
            return fitted
        # Not even an empty document fits: cut the query as well, keeping the template's own text.
        fitted = self._fit(lambda q: self.fill(q, ""), query)
        return fitted if fitted is not None else self.fill(query, "")


_QUERY_MARK, _DOCUMENT_MARK = "EMBEDCLIQUERYMARK", "EMBEDCLIDOCUMENTMARK"


def chat_pair_template(hf_tokenizer: Any, kwargs: dict[str, Any]) -> str:
    """The tokenizer's chat template over messages [query, document] (sentence-transformers 6's pair
    rendering, "flat" content) as a `{query}` / `{document}` template: rendered once with marker texts."""
    messages = [{"role": "query", "content": _QUERY_MARK}, {"role": "document", "content": _DOCUMENT_MARK}]
    try:
        text = hf_tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    except Exception as e:  # jinja errors of a template that cannot take the query/document roles
        raise ValueError(f"the chat template cannot render a query/document pair ({e})") from e
    if text.count(_QUERY_MARK) != 1 or text.count(_DOCUMENT_MARK) != 1:
        raise ValueError("the chat template does not place the query and the document once each, verbatim")
    text = text.replace("{", "{{").replace("}", "}}")
    return text.replace(_QUERY_MARK, "{query}").replace(_DOCUMENT_MARK, "{document}")


def pair_formatter(model: Any, max_length: int, truncate: bool = True) -> Any:
    """`render(query, document) -> prompt` for a loaded LLM reranker with a pair template, else None."""
    spec = model.spec
    if spec.head != "lm_score" or (spec.pair_template is None and spec.pair_chat_template is None):
        return None
    try:
        source = spec.pair_template
        if source is None:
            source = chat_pair_template(model.hf_tokenizer, dict(spec.pair_chat_template))
            # apply_chat_template tokenizes without the tokenizer's own special tokens; the runner adds them.
            tok = model.tokenizer
            if len(tok.encode("a").ids) != len(tok.encode("a", add_special_tokens=False).ids):
                raise ValueError("the tokenizer adds special tokens (e.g. BOS) that a chat-template render "
                                 "leaves out; pass --pair-template instead")
        template = PairTemplate(source, spec.instruction, model.tokenizer, max_length)
    except ValueError as e:
        raise ConfigRefusedError(f"{spec.path}: {e}") from None
    return lambda query, document: template.render(query, document, truncate=truncate)
