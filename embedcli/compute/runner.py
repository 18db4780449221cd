"""Tokenize → pack → forward → pool, streamed: batches of texts in, results out in input order."""

from __future__ import annotations

import dataclasses
import queue
import sys
import threading
import time
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embedcli.compute.options import RunnerOptions as RunnerOptions
from embedcli.compute.options import RunStats as RunStats
from embedcli.compute.options import TokenRows as TokenRows
from embedcli.compute.options import resolved_side, run_dimensions
from embedcli.compute.prefill import run_long
from embedcli.errors import LongInputError, PoolingConfigError
from embedcli.models.checkpoint.st_config import prompt_token_count
from embedcli.models.loader import LoadedModel
from embedcli.models.tokenization.char_clip import ClipBound, clip_texts, unsafe_cuts
from embedcli.models.tokenization.roles import RoleSequence, RoleTokenizer
from embedcli.pooling import EmbeddingShape, PoolingMetadata, PoolingParams
from embedcli.pooling.poolers import pool_empty
from embedcli.scoring import role_of

TextInput = str | tuple[str, str]

# Token budget of one packed forward by device: on CPU a few thousand tokens keep the working set
# in cache (16k is 15-20% slower); a GPU wants larger forwards to fill its cores (on an H200,
# all-MiniLM-L6-v2 in bf16 ran 2.5x faster at 64k tokens than at 16k).


@dataclass
class Encoded:
    """A tokenized batch: one entry per packed sequence, and which input row each belongs to."""

    ids: list[np.ndarray]
    type_ids: list[np.ndarray] | None
    owner: np.ndarray  # input row of each sequence (chunking maps several sequences to one row)
    num_rows: int
    chunked: np.ndarray | None = None  # per sequence: True when it is one chunk of an over-long row
    # Late interaction: per sequence, which tokens are attention keys and whose vectors are kept.
    keys: list[np.ndarray] | None = None
    keep: list[np.ndarray] | None = None
    # Token tasks: per sequence, the tokens the tokenizer's template added (its special_tokens_mask).
    template: list[np.ndarray] | None = None

    @property
    def lengths(self) -> np.ndarray:
        """Token count of each sequence."""
        return np.fromiter((len(x) for x in self.ids), dtype=np.int64, count=len(self.ids))


SequenceResult = np.ndarray  # [n, d] for sequence tasks
TokenResult = list[np.ndarray]  # per-row matrices for token tasks
SparseResult = list[tuple[np.ndarray, np.ndarray]]  # sparse_embed: (indices int32, values float32) per row
HybridResult = list[dict[str, Any]]  # BGE-M3 hybrid_embed: {output: value} per row


class Runner:
    """Runs one task of a loaded model over streamed batches, packing sequences under a token budget."""

    def __init__(self, model: LoadedModel, options: RunnerOptions | None = None) -> None:
        self.model = model
        self.options = options or RunnerOptions()
        spec = model.spec
        task = self.options.task
        if task not in spec.tasks:
            raise PoolingConfigError(
                f"Model {spec.name!r} cannot do {task!r}; it supports {', '.join(spec.tasks)}"
            )
        if self.options.long_inputs == "chunk" and task != "embed":
            raise PoolingConfigError(f"--long-inputs chunk applies to embed only, not {task!r}")
        if self.options.long_inputs == "chunk" and not spec.chunkable:
            raise PoolingConfigError(
                f"--long-inputs chunk is not defined for pooling {spec.seq_pooling_type} ({spec.pooling_source}): "
                "a token-weighted mean of chunk vectors equals no whole-row value; use truncate or error"
            )
        # The flag, else the model's side; in the options too, which the output's provenance records.
        self._side_source = "--truncation-side" if self.options.truncation_side else spec.truncation_side_source
        self.truncation_side = resolved_side(self.options, spec)
        self.options = dataclasses.replace(self.options, truncation_side=self.truncation_side)
        self.max_length = self.options.max_length or spec.max_length
        self.max_batch_tokens = self.options.token_budget(model.device.type)
        self.params = PoolingParams(
            use_activation=self.options.normalize if task in ("embed", "token_embed") else None,
            dimensions=run_dimensions(self.options.dimensions, spec.truncate_dim, task),
        ).verify(
            task,
            model.pooler_config,
            EmbeddingShape(spec.embedding_size, spec.is_matryoshka, spec.matryoshka_dimensions),
        )
        # Chunks of an over-long row are pooled without the activation; the row is normalized once, after
        # the token-weighted mean (see `_aggregate_chunks`).
        self._chunk_params = dataclasses.replace(self.params, use_activation=False)
        self.pooler = model.pooler.pooler_for(task)  # type: ignore[operator]  # loader types `pooler` as the Module .eval() returns
        self.needs_token_ids = self.pooler.requires_token_ids()
        # Causal own backbones run a sequence over the token budget in slices (the fallback runs it whole); the
        # pooler must declare it carries them, so wrong wiring fails here, not at the first long document.
        self.sliceable = model.can_slice and self.options.chunked_prefill
        if self.sliceable and not self.pooler.carries_slices():
            raise PoolingConfigError(
                f"{type(self.pooler).__name__} ({task}) cannot pool a sequence split over chunked-prefill slices"
            )
        self.stats = RunStats()
        self._tokenizer = model.tokenizer
        self._special_ids = model.hf_tokenizer.all_special_ids
        # The tokenizer leaves a text (or pair) uncut when the limit is below the special tokens it adds, so
        # the whole input would be pooled: such a limit is refused when texts are tokenized (token ids are cut
        # as they are).
        processor = self._tokenizer.post_processor
        self._specials = tuple(int(processor.num_special_tokens_to_add(pair)) if processor is not None else 0
                               for pair in (False, True))
        self._clip_bound = ClipBound(self._tokenizer, self.max_length)
        self._prompt_tokens = self._excluded_prompt_tokens()
        self._roles: RoleTokenizer | None = None
        if spec.late_interaction is not None:
            mask_id = getattr(model.hf_tokenizer, "mask_token_id", None)
            if mask_id is None:
                mask_id = getattr(model.hf_tokenizer, "eos_token_id", None)
            self._roles = RoleTokenizer(self._tokenizer, spec.late_interaction, mask_id, spec.path)
        if self.options.dimensions is not None and not (spec.is_matryoshka or spec.matryoshka_dimensions):
            print(
                f"embedcli: note: {spec.name} declares no Matryoshka dimensions (not trained for truncation); "
                f"keeping its first {self.options.dimensions} of {spec.embedding_size} dims anyway",
                file=sys.stderr,
            )

    def _excluded_prompt_tokens(self) -> int:
        """Prompt tokens pooling leaves out (sentence-transformers include_prompt=false), 0 when none."""
        spec = self.model.spec
        if spec.include_prompt or self.options.task != "embed":
            return 0
        count = prompt_token_count(self._tokenizer, self._special_ids, self.options.prompt)
        if count and self.truncation_side == "left":
            # Cutting from the left would eat the prompt, and the first `count` tokens left would be text.
            raise PoolingConfigError(
                f"truncation side left ({self._side_source}) with include_prompt=false ({spec.pooling_source}) and a "
                "prompt is not supported; pass --truncation-side right"
            )
        return count

    def prompt_token_lens(self, num_seqs: int) -> torch.Tensor | None:
        """Leading prompt tokens to exclude from pooling for each of `num_seqs` sequences (None: none)."""
        return torch.full((num_seqs,), self._prompt_tokens, dtype=torch.long) if self._prompt_tokens else None

    # -- tokenize ----------------------------------------------------------------------------------
    def _clean(self, text: str) -> str:
        # do_lower_case lowercases inside the tokenizer (`lowercase_inside`), which spares special tokens.
        return text.strip() if self.options.strip else text

    def _prepare(self, text: str) -> str:
        text = self._clean(text)
        return self.options.prompt + text if self.options.prompt else text

    def _check_limit(self, specials: int, what: str) -> None:
        if self.max_length < specials:
            raise PoolingConfigError(f"--max-length {self.max_length} is below the {specials} special tokens the "
                                     f"tokenizer adds to every {what}: no input could be cut to it")

    def tokenize(self, texts: Sequence[TextInput], first_row: int = 0) -> Encoded:
        """Token ids of each text (or text pair) under the long-input rule; `first_row` numbers errors."""
        if self._roles is not None:
            return self._tokenize_roles(texts, first_row)
        mode = self.options.long_inputs
        if mode == "truncate" and texts:
            pairs = isinstance(texts[0], tuple)
            self._check_limit(self._specials[int(pairs)], "text pair" if pairs else "text")
        tok = self._tokenizer
        if mode == "truncate":
            tok.enable_truncation(self.max_length, strategy="longest_first", direction=self.truncation_side)
        else:
            tok.no_truncation()
        prepared: list[Any] = [
            # A pair's second text is stripped like its first; the prompt goes before the first only.
            (self._prepare(t[0]), self._clean(t[1])) if isinstance(t, tuple) else self._prepare(t) for t in texts
        ]
        if mode == "truncate" and self._clip_bound.needed(prepared):
            # cut huge texts by characters first; same tokens (embedcli.models.tokenization.char_clip)
            clipped, cut = clip_texts(prepared, self._clip_bound.value, self.truncation_side)
            encodings = tok.encode_batch(clipped)
            for i in unsafe_cuts(clipped, encodings, cut, self.truncation_side):
                encodings[i] = tok.encode(prepared[i])
        else:
            encodings = tok.encode_batch(prepared)
        ids: list[np.ndarray] = []
        types: list[np.ndarray] = []
        owner: list[int] = []
        chunked: list[bool] = []
        template: list[np.ndarray] | None = [] if self.options.with_token_ids else None
        limit = self.max_length
        for row, enc in enumerate(encodings):
            seq = np.asarray(enc.ids, dtype=np.int64)
            tt = np.asarray(enc.type_ids, dtype=np.int64)
            if mode == "truncate":
                if enc.overflowing:
                    self.stats.truncated_rows += 1
            elif len(seq) > limit:
                if mode == "error":
                    locate = getattr(texts, "locate", None)
                    raise LongInputError(first_row + row, len(seq), limit, locate(row) if locate else None)
                self.stats.chunked_rows += 1
                for start in range(0, len(seq), limit):
                    ids.append(seq[start : start + limit])
                    types.append(tt[start : start + limit])
                    owner.append(row)
                    chunked.append(True)
                    if template is not None:
                        template.append(np.asarray(enc.special_tokens_mask[start : start + limit], dtype=bool))
                continue
            ids.append(seq)
            types.append(tt)
            owner.append(row)
            chunked.append(False)
            if template is not None:
                template.append(np.asarray(enc.special_tokens_mask, dtype=bool))
        return Encoded(
            ids=ids, type_ids=types, owner=np.asarray(owner, dtype=np.int64), num_rows=len(texts),
            chunked=np.asarray(chunked, dtype=bool) if any(chunked) else None, template=template,
        )

    def _tokenize_roles(self, texts: Sequence[TextInput], first_row: int) -> Encoded:
        """A late-interaction model's queries and documents (each text's `RoleText` role, else the runner's)."""
        assert self._roles is not None
        if self.options.long_inputs == "chunk":
            raise PoolingConfigError("--long-inputs chunk applies to embed only, not to a late-interaction model")
        roles: list[str] = []
        for t in texts:
            role = role_of(t, self.options.role)
            if isinstance(t, tuple) or role is None:
                raise PoolingConfigError(
                    f"{self.model.spec.name}: a late-interaction model encodes texts as queries or documents (--role)"
                )
            roles.append(role)
        seqs: list[RoleSequence | None] = [None] * len(texts)
        locate = getattr(texts, "locate", None)
        for role in dict.fromkeys(roles):
            rows = [i for i, r in enumerate(roles) if r == role]
            encoded = self._roles.encode(
                [self._prepare(str(texts[i])) for i in rows], role,
                truncate=self.options.long_inputs == "truncate", side=self.truncation_side,
                first_row=first_row, locate=(lambda j, rows=rows: locate(rows[j])) if locate else None,
            )
            for i, seq in zip(rows, encoded, strict=True):
                seqs[i] = seq
        done = [s for s in seqs if s is not None]
        self.stats.truncated_rows += sum(s.truncated for s in done)
        return Encoded(
            ids=[s.ids for s in done], type_ids=[s.type_ids for s in done],
            owner=np.arange(len(done), dtype=np.int64), num_rows=len(texts),
            keys=[s.keys for s in done], keep=[s.keep for s in done],
        )

    # -- compute -----------------------------------------------------------------------------------
    def _packs(self, lengths: np.ndarray) -> list[np.ndarray]:
        """Sequence indices of each forward: longest first, greedily filled up to the token budget."""
        order = np.argsort(-lengths, kind="stable")
        packs: list[np.ndarray] = []
        current: list[int] = []
        used = 0
        for i in order.tolist():
            n = int(lengths[i])
            if n == 0:
                continue  # pooled without a forward (run_encoded)
            if current and used + n > self.max_batch_tokens:
                packs.append(np.asarray(current))
                current, used = [], 0
            current.append(i)
            used += n
        if current:
            packs.append(np.asarray(current))
        return packs

    def params_for(self, enc: Encoded, seq: int) -> PoolingParams:
        """The pooling request of sequence `seq`: a chunk of an over-long row is pooled without the activation."""
        return self._chunk_params if enc.chunked is not None and enc.chunked[seq] else self.params

    def _forward(self, enc: Encoded, members: np.ndarray) -> list[torch.Tensor]:
        seqs = [enc.ids[i] for i in members]
        lengths = [len(s) for s in seqs]
        flat = torch.from_numpy(np.concatenate(seqs))
        types = None
        if enc.type_ids is not None:
            types = torch.from_numpy(np.concatenate([enc.type_ids[i] for i in members]))
        keys = None
        if enc.keys is not None:
            keys = torch.from_numpy(np.concatenate([enc.keys[i] for i in members]))
        hidden = self.model.forward_packed(flat, lengths, types, keys)
        params = [self.params_for(enc, i) for i in members.tolist()]
        cu = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=cu[1:])
        metadata = PoolingMetadata.from_cu_seqlens(
            torch.from_numpy(cu), params, token_ids=flat if self.needs_token_ids else None,
            prompt_token_lens=self.prompt_token_lens(len(seqs)),
        )
        with torch.inference_mode():
            out = self.pooler(hidden, metadata)
        self.stats.forwards += 1
        self.stats.tokens += int(cu[-1])
        return list(out)

    def run_encoded(self, enc: Encoded) -> SequenceResult | TokenResult | TokenRows | SparseResult | HybridResult:
        """Results for every row of a tokenized batch, in row order."""
        start = time.perf_counter()
        results: list[torch.Tensor | None] = [None] * len(enc.ids)
        over_budget = bool(enc.ids) and int(enc.lengths.max()) > self.max_batch_tokens
        if over_budget:
            # Decoders: chunked prefill in slices; encoders: each long sequence in a forward of its own.
            run_long(
                enc, results, model=self.model, pooler=self.pooler, budget=self.max_batch_tokens,
                forward=lambda members: self._forward(enc, members), params_of=lambda i: self.params_for(enc, i),
                stats=self.stats, with_token_ids=self.needs_token_ids,
                sliceable=self.sliceable,
                prompt_tokens=self._prompt_tokens,
            )
        for members in [] if over_budget else self._packs(enc.lengths):
            for i, out in zip(members.tolist(), self._forward(enc, members), strict=True):
                results[i] = out
        for i in np.flatnonzero(enc.lengths == 0).tolist():
            # No tokens (empty text on a tokenizer without special tokens): the zero vector through the head.
            results[i] = pool_empty(self.pooler, self.params_for(enc, i), self.model.spec.pooled_size, self.model.device)
        self.stats.rows += enc.num_rows
        self.stats.batches += 1
        combined = self._combine(enc, results)
        self.stats.seconds["compute"] += time.perf_counter() - start
        return combined

    def _combine(self, enc: Encoded, results: list[torch.Tensor | None]) -> SequenceResult | TokenResult | TokenRows | SparseResult | HybridResult:
        if self.params.task in ("token_embed", "token_classify"):
            values = [r.float().cpu().numpy() for r in results]  # type: ignore[union-attr]  # no None is left once every pack has run
            # A pooler that leaves out each sequence's first token (BGE-M3's colbert vectors) keeps ids aligned.
            ids = [i[1:] for i in enc.ids] if self.pooler.drops_first_token() else list(enc.ids)
            template = enc.template
            if template is not None and self.pooler.drops_first_token():
                template = [t[1:] for t in template]
            if enc.keep is not None:  # late interaction: the model's own rows (its expansion in, its skiplist out)
                values = [v[k] for v, k in zip(values, enc.keep, strict=True)]
                ids = [i[k] for i, k in zip(ids, enc.keep, strict=True)]
            return TokenRows(ids, values, template) if self.options.with_token_ids else values
        if self.params.task == "hybrid_embed":  # BGE-M3: {output: value} per row, from one forward per pack
            return [hybrid_numpy(r, ids) for r, ids in zip(results, enc.ids, strict=True)]  # type: ignore[arg-type]  # no None is left once every pack has run
        if self.params.task == "sparse_embed":  # per row (indices int32, values float32), sorted by index
            return [(i.cpu().numpy().astype(np.int32), v.float().cpu().numpy()) for i, v in results]  # type: ignore[misc]  # no None is left once every pack has run
        if enc.num_rows == len(results):
            if not results:
                width = self.params.dimensions or self.model.spec.embedding_size
                return np.zeros((0, width), dtype=np.float32)
            return torch.stack(results).float().cpu().numpy()  # type: ignore[arg-type]  # no None is left once every pack has run
        return self._aggregate_chunks(enc, results)

    def _aggregate_chunks(self, enc: Encoded, results: list[torch.Tensor | None]) -> np.ndarray:
        """Long-input aggregation: the token-weighted mean of a row's chunk vectors, then normalized once.

        Chunks are pooled *without* the activation (projector and Matryoshka slice applied), so for MEAN
        pooling the mean is exactly the mean over all of the row's tokens (attention does not span chunks);
        the row is L2-normalized afterwards when normalization is on. vLLM instead averages the already
        normalized chunk vectors and leaves the mean un-normalized; without normalization both agree.
        """
        weights = np.maximum(enc.lengths, 1).astype(np.float64)
        first = results[0]
        assert first is not None
        out = np.zeros((enc.num_rows, first.shape[-1]), dtype=np.float64)
        total = np.zeros(enc.num_rows, dtype=np.float64)
        for row, w, r in zip(enc.owner.tolist(), weights.tolist(), results, strict=True):
            out[row] += w * r.double().cpu().numpy()  # type: ignore[union-attr]  # no None is left once every pack has run
            total[row] += w
        mean = out / total[:, None]
        if self.params.use_activation and enc.chunked is not None:
            rows = np.unique(enc.owner[enc.chunked])
            norms = np.linalg.norm(mean[rows], axis=1, keepdims=True)
            mean[rows] = mean[rows] / np.maximum(norms, 1e-12)
        return mean.astype(np.float32)

    # -- streaming ---------------------------------------------------------------------------------
    def map(self, batches: Iterable[Sequence[TextInput]]) -> Iterator[SequenceResult | TokenResult | TokenRows | SparseResult | HybridResult]:
        """One result per input batch, in order; the next batch is tokenized while this one computes."""
        source = iter(batches)
        first_row = 0

        def tokenized() -> Iterator[Encoded]:
            nonlocal first_row
            for texts in source:
                start = time.perf_counter()
                enc = self.tokenize(texts, first_row)
                self.stats.seconds["tokenize"] += time.perf_counter() - start
                first_row += len(texts)
                yield enc

        encoded = prefetch(tokenized(), depth=2)
        try:
            for enc in encoded:
                yield self.run_encoded(enc)
        finally:
            encoded.close()  # a stop mid-batch: the tokenize thread is joined before the process exits

    def embed(self, texts: Sequence[TextInput], batch_rows: int = 4096) -> np.ndarray:
        """All results of `texts` at once (sequence tasks)."""
        chunks = [texts[i : i + batch_rows] for i in range(0, len(texts), batch_rows)]
        parts = [np.asarray(r) for r in self.map(chunks)]
        if not parts:
            width = self.params.dimensions or self.model.spec.embedding_size
            return np.zeros((0, width), dtype=np.float32)
        return np.concatenate(parts)


def hybrid_numpy(row: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
    """One BGE-M3 hybrid result as numpy: dense `[d]`, sparse (indices int32, values float32), colbert `[n - 1, d]`
    with `colbert_ids`, the token ids of its rows (all but the first)."""
    out: dict[str, Any] = {"colbert_ids": ids[1:]} if "colbert" in row else {}
    for name, value in row.items():
        if name == "sparse":
            out[name] = (value[0].cpu().numpy().astype(np.int32), value[1].float().cpu().numpy())
        else:
            out[name] = value.float().cpu().numpy()
    return out


_DONE = object()
_JOIN_SECONDS = 2.0


def prefetch(items: Iterator[Any], depth: int = 2) -> Generator[Any, None, None]:
    """Yield from `items`, produced `depth` ahead in a background thread (tokenizers and torch release the GIL)."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(_DONE)
        except BaseException as e:  # handed to the consumer, raised there
            q.put(_Failure(e))

    thread = threading.Thread(target=produce, name="embedcli-tokenize", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop.set()
        # A daemon thread still inside a tokenizer or Arrow call when the interpreter exits (a stop, an error)
        # is torn down mid-call and aborts the process (exit -6, not 130): let it finish the item in hand.
        # Bounded: a thread waiting on a quiet pipe is in a plain read, which exit ends safely.
        thread.join(timeout=_JOIN_SECONDS)


@dataclass
class _Failure:
    error: BaseException
