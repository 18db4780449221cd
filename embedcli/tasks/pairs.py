"""`embedcli score` and `embedcli rerank`: pairs scored by a cross-encoder, by cosine, by maxsim or by the
sparse dot product."""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from embedcli.compute.build import RunnerRecipe, build_runner
from embedcli.compute.choice import can_do
from embedcli.compute.options import RunnerOptions
from embedcli.errors import EXIT_OK, EXIT_SKIPPED, InputError, TooManyErrors, UsageError
from embedcli.io.manifest import KEY_ERRORS, KEY_SKIPPED
from embedcli.io.reader_base import id_array
from embedcli.io.readers import read_inputs
from embedcli.models.llm_reranker import pair_formatter
from embedcli.models.spec import ModelSpec
from embedcli.run.checks import NULL_FIX, in_input_order, valid_rows
from embedcli.run.flags import RunFlags
from embedcli.run.job import Reporting, Target
from embedcli.run.progress import Progress
from embedcli.run.report import RunReport, peak_rss_mb, write_stats
from embedcli.run.source import (
    BatchSource,
    InputOptions,
    check_head,
    empty_batch,
    id_column,
    id_type_of,
    null_text_error,
    refuse_shadowing,
    subset,
    with_kept,
)
from embedcli.run.target import check_target
from embedcli.run.whole import WholeJob, WholeOutput, check_whole
from embedcli.scoring import M3_WEIGHTS, METHODS, PairScorer, TopN, pair_prompts
from embedcli.tasks.common import (
    Computation,
    ModelChoice,
    OutputOptions,
    RowInputs,
    calibration,
    load_spec,
    planned_engine,
    run_computation,
    runner_recipe,
)

if TYPE_CHECKING:  # torch: loaded with the model, only once a run has work to do
    from embedcli.compute.runner import Runner

PAIR_TASK = {"cross-encoder": "classify", "cosine": "embed", "maxsim": "token_embed", "sparse": "sparse_embed",
             "m3": "hybrid_embed"}


@dataclass(frozen=True)
class PairOptions:
    """Choices shared by `score` and `rerank`."""

    method: str = "auto"
    raw_scores: bool = False
    max_batch_tokens: int | None = None
    long_inputs: str = "truncate"
    truncation_side: str | None = None
    weights: tuple[float, ...] | None = None  # --method m3: [dense, sparse, colbert] (default FlagEmbedding's 1,1,1)


@dataclass(frozen=True)
class ScoreOptions(PairOptions):
    """`score` choices: 1:1 pairs from two columns, or one left text against every right text."""

    left_col: str = "left"
    right_col: str = "right"
    left: str | None = None


@dataclass(frozen=True)
class RerankOptions(PairOptions):
    """`rerank` choices."""

    query: str | None = None
    queries: str | None = None
    query_col: str = "text"
    query_id_col: str | None = None
    top_n: int = 0
    return_documents: bool = False
    group_col: str | None = None  # each row is a candidate of the query whose id is in this column


class QueryChoice(Protocol):
    """Where a command's queries come from: `--query TEXT` or `--queries FILE` (and its columns)."""

    @property
    def query(self) -> str | None: ...
    @property
    def queries(self) -> str | None: ...
    @property
    def query_col(self) -> str: ...
    @property
    def query_id_col(self) -> str | None: ...


def resolve_method(spec: ModelSpec, method: str, command: str) -> str:
    """How `spec` scores pairs: cross-encoder, cosine, maxsim or sparse (`auto`: by the model, as vLLM's score type)."""
    if method not in METHODS:
        raise UsageError(f"--method {method!r}: choose one of {', '.join(METHODS)}")
    late = spec.late_interaction is not None
    if method == "m3":
        if spec.m3_heads:
            return method
        raise UsageError(f"{command}: --method m3 combines BGE-M3's dense, sparse and colbert scores; model "
                         f"{spec.name!r} has no colbert_linear.pt / sparse_linear.pt; {can_do(spec)}")
    if method == "sparse" and spec.m3_heads:
        return method  # BGE-M3's lexical weights
    if method == "auto":
        if late:
            return "maxsim"
        if spec.score_type == "cross-encoder":
            return "cross-encoder"
        if spec.score_type == "bi-encoder":
            return "cosine"
        if spec.score_type == "sparse":
            return "sparse"
    elif method == "sparse" and spec.score_type == "sparse":
        return method
    elif method == "cross-encoder" and spec.score_type == "cross-encoder":
        return method
    elif method == "maxsim" and spec.head == "base":
        return method
    elif method == "cosine" and spec.head == "base" and not late:
        return method
    why = "a late-interaction (ColBERT) model scores pairs by MaxSim over its query and document vectors" if late else {
        "sequence_classification": f"a classifier with {spec.num_labels} labels scores pairs only as a "
        "cross-encoder, which needs exactly one label",
        "token_classification": "a token classifier cannot score pairs",
        "base": "an embedding model scores pairs by cosine or maxsim, not as a cross-encoder",
        "lm_score": "an LLM reranker scores pairs as a cross-encoder",
        "sparse": "a sparse (SPLADE) model scores pairs by the sparse dot product",
        "static": "a static embedding model serves embed only (search its vectors with `embedcli search`)",
    }[spec.head]
    raise UsageError(f"{command}: model {spec.name!r} cannot score pairs with method {method!r}: {why}; {can_do(spec)}")


def pair_recipe(spec: ModelSpec, choice: ModelChoice, opts: PairOptions, method: str) -> RunnerRecipe:
    """The recipe of the runner that scores `score` / `rerank` pairs with `method` (`resolve_method`)."""
    extra: dict[str, Any] = {}
    if method == "cross-encoder":
        mean, sigma = calibration(spec)
        extra = {"logit_mean": mean, "logit_sigma": sigma, "activation": "none" if opts.raw_scores else None}
    if spec.m3_heads:  # `--dtype auto` is probed on the dense vector, as for `embed`
        extra["task"] = "embed"
    options = RunnerOptions(
        task=PAIR_TASK[method], max_batch_tokens=opts.max_batch_tokens,
        long_inputs=opts.long_inputs, truncation_side=opts.truncation_side,  # type: ignore[arg-type]  # typer's Literal choices; RunnerOptions takes the same values
        strip=False, normalize=False if (method == "maxsim" and opts.raw_scores) else None,
    )
    return runner_recipe(spec, choice, options, **extra)


def similarity_of(spec: ModelSpec, opts: PairOptions) -> str:
    """The bi-encoder similarity: `--method auto` scores as the model's own `model.similarity`, an explicit
    `--method cosine` is cosine."""
    return spec.similarity_fn_name if opts.method == "auto" else "cosine"


def make_scorer(runner: Runner, method: str, opts: PairOptions) -> PairScorer:
    """The scorer of `method` on a built runner."""
    spec = runner.model.spec
    # An LLM reranker's pair is one prompt (template or chat template), its document cut to keep the suffix.
    pair_format = pair_formatter(runner.model, runner.max_length, truncate=opts.long_inputs == "truncate")
    return PairScorer(runner, method, dict(spec.prompts), similarity_of(spec, opts), pair_format,
                      opts.weights or M3_WEIGHTS)


def check_weights(opts: PairOptions, method: str) -> dict[str, Any]:
    """`--weights` checked against the method (m3 only, three numbers, a non-zero sum); the provenance it adds."""
    if opts.weights is None:
        return {"weights": list(M3_WEIGHTS)} if method == "m3" else {}
    if method != "m3":
        raise UsageError(f"--weights combine BGE-M3's dense, sparse and colbert scores: pass --method m3 (not {method})")
    if len(opts.weights) != 3 or sum(opts.weights) == 0:
        raise UsageError(f"--weights {','.join(map(str, opts.weights))}: three numbers DENSE,SPARSE,COLBERT with a "
                         "non-zero sum, e.g. 0.4,0.2,0.4")
    return {"weights": list(opts.weights)}


def pair_scorer(choice: ModelChoice, opts: PairOptions, command: str) -> tuple[Runner, PairScorer]:
    """The runner (its model loaded now) and scorer of `score` / `rerank` for the model's pair method."""
    spec = load_spec(choice)
    method = resolve_method(spec, opts.method, command)
    runner = build_runner(pair_recipe(spec, choice, opts, method))
    return runner, make_scorer(runner, method, opts)


# -- score ---------------------------------------------------------------------------------------------
@dataclass
class ScoreCodec:
    """Rows of `score`: id, score, kept columns; one left text against every row, or a left and right column.

    Its scorer (and the encoded `--left`) need the model: `load` sets them once it loads, when there is work.
    """

    opts: ScoreOptions
    keep_cols: tuple[str, ...] = ()
    scorer: PairScorer | None = None
    left_encoded: Any = None

    def load(self, runner: Runner, method: str) -> None:
        """Make the scorer of the built runner (and encode `--left` once)."""
        self.scorer = make_scorer(runner, method, self.opts)
        if self.opts.left is not None:
            self.left_encoded = self.scorer.encode_queries([self.opts.left])

    def _scorer(self) -> PairScorer:
        if self.scorer is None:
            raise RuntimeError("score: rows asked of the codec before its model loaded")
        return self.scorer

    def inputs(self, batch: Any) -> RowInputs:
        """The batch's pairs (or right texts) as the runner's inputs."""
        n = len(batch.ids)
        scorer = self._scorer()
        if self.opts.left is not None:
            return RowInputs(scorer.doc_inputs([self.opts.left], batch.texts), batch)
        rights = batch.extra_texts[self.opts.right_col]  # nulls were set aside by the run's row checks
        return RowInputs(scorer.pair_inputs(batch.texts, rights), batch, row_of=lambda i: i % max(n, 1))

    def table(self, batch: Any, result: Any) -> Any:
        """The output rows of a batch."""
        n = len(batch.ids)
        if not n:
            scores = np.zeros(0, np.float32)
        elif self.opts.left is not None:
            scores = self._scorer().score_matrix(self.left_encoded, result, 1, n)[0]
        else:
            scores = self._scorer().pair_scores(result, n)
        columns = {"id": id_column(batch), "score": pa.array(scores, pa.float32())}
        return pa.table(with_kept(columns, batch, self.keep_cols))

    def empty(self) -> Any:
        """The output of no rows."""
        return self.table(empty_batch(self.keep_cols), None)


def score_computation(
    spec: ModelSpec, choice: ModelChoice, opts: ScoreOptions, keep_cols: tuple[str, ...] = ()
) -> Computation:
    """The runner recipe, codec and provenance of `score` on `spec` (usage errors before anything loads)."""
    method = resolve_method(spec, opts.method, "score")
    weights = check_weights(opts, method)
    recipe = pair_recipe(spec, choice, opts, method)
    codec = ScoreCodec(opts, keep_cols)
    query_prompt, doc_prompt = pair_prompts(method, dict(spec.prompts))
    model_options = recipe.model_options
    extra = {"method": method, "raw_scores": opts.raw_scores, "left": opts.left, "query_prompt": query_prompt,
             "document_prompt": doc_prompt, "logit_mean": model_options.logit_mean,
             "logit_sigma": model_options.logit_sigma, **weights}
    return Computation(recipe, codec, extra, lambda runner: codec.load(runner, method))


def run_score(
    inputs: InputOptions, choice: ModelChoice, opts: ScoreOptions, output: OutputOptions, flags: RunFlags | None = None
) -> int:
    """`embedcli score`: one score per row, for (left, right) columns or one left text against every right."""
    flags = flags or RunFlags()
    if opts.left is not None and opts.left_col != ScoreOptions.left_col:
        raise UsageError(f"--left and --left-col {opts.left_col}: give one; --left scores one text against every "
                         "row's --right-col, --left-col pairs each row's two columns")
    check_target(output.path, flags, inputs.paths, output.stats_file)
    work = score_computation(load_spec(choice), choice, opts, tuple(inputs.keep_cols))
    if opts.left is not None:
        source = BatchSource(replace(inputs, text_col=opts.right_col))
    else:
        source = BatchSource(replace(inputs, text_col=opts.left_col), (opts.right_col,))
    check_head(source, flags)  # said before the model loads
    return run_computation(source, work, output, flags)


# -- rerank --------------------------------------------------------------------------------------------
def read_queries(opts: QueryChoice, command: str = "rerank") -> list[tuple[str, str]]:
    """(id, text) of `--query` or of every row of `--queries FILE`."""
    if (opts.query is None) == (opts.queries is None):
        raise UsageError(f"{command} needs exactly one of --query TEXT or --queries FILE")
    if opts.query is not None:
        return [("query", opts.query)]
    out: list[tuple[str, str]] = []
    first: dict[str, str] = {}
    queries_file: str = opts.queries  # type: ignore[assignment]  # not None: exactly one of the two was given
    for batch in read_inputs([queries_file], text_col=opts.query_col, id_col=opts.query_id_col):
        for loc, rid, text in zip(batch.locations, batch.ids, batch.texts, strict=True):
            if text is None:
                raise InputError(batch.source, "query text is null", location=loc, record_id=rid)
            if rid in first:  # `--group-col query_id` would score one query's candidates against another
                raise InputError(batch.source, f"duplicate query id {rid!r} (first at {first[rid]})", location=loc,
                                 record_id=rid, fix="give every query a unique id (or pass --query-id-col)")
            first[rid] = loc
            out.append((rid, text))
    return out


class Documents:
    """The documents read so far (ids, texts with `--return-documents`, kept columns), by position."""

    def __init__(self, keep_cols: list[str], with_text: bool) -> None:
        self.ids: list[str] = []
        self.id_type: pa.DataType | None = None  # the input's, from the first batch
        self.texts: list[str] = []
        self.cols: dict[str, list[Any]] = {c: [] for c in keep_cols}
        self.with_text = with_text

    def add(self, batch: Any) -> int:
        """Keep a batch's documents; returns the position of its first one."""
        base = len(self.ids)
        self.ids.extend(batch.ids)
        self.id_type = self.id_type or id_type_of(batch)
        if self.with_text:
            self.texts.extend(batch.texts)
        for c in self.cols:
            self.cols[c].extend(batch.columns[c])
        return base

    def table(self, query_id: str, scores: np.ndarray, index: np.ndarray) -> Any:
        """The ranked rows of one query."""
        idx = index.tolist()
        columns: dict[str, Any] = {
            "query_id": pa.array([query_id] * len(idx), pa.string()),
            "id": id_array([self.ids[i] for i in idx], self.id_type),
            "score": pa.array(scores, pa.float32()),
            "rank": pa.array(np.arange(1, len(idx) + 1, dtype=np.int32), pa.int32()),
        }
        if self.with_text:
            columns["text"] = pa.array([self.texts[i] for i in idx], pa.string())
        refuse_shadowing(list(columns), list(self.cols))
        for c, values in self.cols.items():
            arr = pa.array([values[i] for i in idx])
            columns[c] = arr.cast(pa.string()) if pa.types.is_null(arr.type) else arr
        return pa.table(columns)

    def empty(self) -> Any:
        """The output of no queries."""
        return self.table("", np.zeros(0, np.float32), np.zeros(0, np.int64))


class BadRows:
    """`--on-error` over the documents of `rerank` (an output written whole): `fail` raises the first bad row
    (a malformed record, a null text); `skip` sets each aside, up to `--max-errors`, and the rest are ranked."""

    def __init__(self, flags: RunFlags, text_col: str) -> None:
        self.skip = flags.on_error == "skip"
        self.limit = flags.max_errors
        self.text_col = text_col
        self.errors: list[InputError] = []

    def add(self, error: InputError) -> None:
        """A bad row: raised (fail), else kept (TooManyErrors past `--max-errors`)."""
        if not self.skip:
            raise error
        self.errors.append(error)
        if self.limit is not None and len(self.errors) > self.limit:
            raise TooManyErrors(error.path, f"more than {self.limit} bad rows (--max-errors {self.limit}); the last: "
                                f"{error.reason}", location=error.location, record_id=error.record_id,
                                fix="fix the input, or raise --max-errors")

    def checked(self, source: BatchSource) -> Iterator[Any]:
        """The source's batches without their bad rows (each one raised or set aside, in input order)."""
        # the reader's (lines that do not parse) are held, under fail too, so that none is said before an
        # earlier null text, as the run loop of every other command orders them
        pending: list[InputError] = []
        for batch in source.open(on_bad_row=pending.append):
            own = getattr(batch, "errors", None)  # a batch's own bad rows (the reader may be a batch ahead)
            found = list(pending) if own is None else list(own)
            handed = {id(e) for e in found}
            pending[:] = [e for e in pending if id(e) not in handed]
            keep = valid_rows(batch)
            if len(keep) < len(batch):
                found += [null_text_error(batch, i, NULL_FIX, self.text_col)
                          for i in sorted(set(range(len(batch))) - set(keep))]
                batch = subset(batch, np.asarray(keep, np.int64))
            in_input_order(found)
            for e in found:
                self.add(e)
            if len(batch):  # a batch of bad rows only leaves nothing to score
                yield batch
        for e in pending:  # after the last batch
            self.add(e)

    def records(self) -> list[dict[str, Any]]:
        """The `--errors-file` lines of the rows set aside."""
        return [e.to_record() for e in self.errors]


def _modulo(i: int, n: int) -> int:
    """The input row of pair `i` when a batch's `n` rows repeat (one block per query)."""
    return i % n


def _query_of_rows(batch: Any, col: str, q_index: dict[str, int]) -> np.ndarray:
    """Per row of a grouped-candidates batch, the position of its query in --queries (InputError if unknown)."""
    out = np.empty(len(batch.ids), dtype=np.int64)
    for j, (loc, rid, qid) in enumerate(zip(batch.locations, batch.ids, batch.extra_texts[col], strict=True)):
        if qid is None:
            raise null_text_error(batch, j)
        if qid not in q_index:
            raise InputError(batch.source, f"{col} {qid!r} is not the id of a query in --query/--queries",
                             location=loc, record_id=rid, fix="pass the --queries file the candidates were searched with")
        out[j] = q_index[qid]
    return out


def _rank_grouped(runner: Runner, scorer: PairScorer, batches: Iterable[Any], group_col: str,
                  queries: list[tuple[str, str]], keepers: list[TopN], docs: Documents, progress: Progress) -> None:
    """Score each candidate row of `batches` (read with `group_col`) against its own query only (the one
    named in `group_col`)."""
    q_index = {q: i for i, (q, _) in enumerate(queries)}
    held: deque[tuple[int, np.ndarray]] = deque()

    def runner_inputs() -> Iterator[RowInputs]:
        for batch in batches:
            groups = _query_of_rows(batch, group_col, q_index)
            held.append((docs.add(batch), groups))
            pairs = scorer.pair_inputs([queries[g][1] for g in groups], batch.texts)
            yield RowInputs(pairs, batch, row_of=partial(_modulo, n=len(groups)))

    for result in runner.map(runner_inputs()):
        base, groups = held.popleft()
        n = len(groups)
        scores = scorer.pair_scores(result, n)
        index = np.arange(base, base + n)
        for qi in np.unique(groups):
            mine = groups == qi
            keepers[qi].add(scores[mine], index[mine])
        progress.update(n, runner.stats.tokens)


def rank_batch_rows(method: str, num_queries: int, batch_rows: int) -> int:
    """Documents per step of `rank_documents`: a cross-encoder scores every query with each, at most ~8k pairs."""
    if method == "cross-encoder":
        return max(1, min(batch_rows, 8192 // max(num_queries, 1)))
    return batch_rows


def rank_documents(runner: Runner, scorer: PairScorer, batches: Iterable[Any], q_texts: list[str], keepers: list[TopN],
                   docs: Documents, progress: Progress | None = None) -> None:
    """Score every document of `batches` against every query, keeping each query's best (`keepers`)."""
    nq = len(q_texts)
    q_encoded = scorer.encode_queries(q_texts)
    held: deque[tuple[int, int]] = deque()

    def runner_inputs() -> Iterator[RowInputs]:
        for batch in batches:
            n = len(batch.ids)
            held.append((docs.add(batch), n))
            yield RowInputs(scorer.doc_inputs(q_texts, batch.texts), batch, row_of=partial(_modulo, n=n))

    for result in runner.map(runner_inputs()):
        base, n = held.popleft()
        scores = scorer.score_matrix(q_encoded, result, nq, n)
        index = np.arange(base, base + n)
        for qi, keeper in enumerate(keepers):
            keeper.add(scores[qi], index)
        if progress is not None:
            progress.update(n, runner.stats.tokens)


def ranked_tables(docs: Documents, query_ids: list[str], keepers: list[TopN]) -> list[Any]:
    """The ranked rows of each query (its kept best, best first); one empty table for no queries."""
    tables = [docs.table(q_id, *keeper.result()) for q_id, keeper in zip(query_ids, keepers, strict=True)]
    return tables or [docs.empty()]


def run_rerank(
    inputs: InputOptions, choice: ModelChoice, opts: RerankOptions, output: OutputOptions, flags: RunFlags | None = None
) -> int:
    """`embedcli rerank`: every query against every document, sorted by score (stable), cut to `--top-n`.

    Documents are streamed; per query the best `--top-n` (or all) scores are kept with the documents' ids
    (and texts with `--return-documents`), and the output is written once every document is scored, through
    the output checks of every command (`embedcli.run.whole`).
    """
    flags = flags or RunFlags()
    if opts.top_n < 0:
        raise UsageError(f"--top-n {opts.top_n}: must be 0 (all) or more")
    whole = WholeJob(Target(output.path, output.fmt), [*inputs.paths, *([opts.queries] if opts.queries else [])],
                     flags, Reporting(output.quiet, output.stats_file), "rerank")
    check_whole(whole)
    report = RunReport(quiet=output.quiet)
    queries = read_queries(opts)
    docs = Documents(list(inputs.keep_cols), opts.return_documents)
    docs.empty()  # refuses a kept column that would shadow a result column, before any work
    spec = load_spec(choice)
    method = resolve_method(spec, opts.method, "rerank")
    weights = check_weights(opts, method)
    query_prompt, doc_prompt = pair_prompts(method, dict(spec.prompts))
    built: list[Runner] = []
    engine, meta, _ = planned_engine(
        pair_recipe(spec, choice, opts, method), flags,
        {"command": "rerank", "method": method, "raw_scores": opts.raw_scores, "top_n": opts.top_n,
         "query_prompt": query_prompt,
         "document_prompt": doc_prompt, "group_col": opts.group_col, **weights},
        loaded=built.append,
    )
    options = {**BatchSource(inputs).options(), "query": opts.query, "query_col": opts.query_col,
               "query_id_col": opts.query_id_col, "return_documents": opts.return_documents}
    out = WholeOutput(whole, meta, options)
    done = out.settle()  # an output made otherwise is refused (exit 2), where it can be, before the model loads
    if done is not None:
        return done
    start = getattr(engine, "start", None)
    if start is not None:
        start()
    runner = built[0]
    scorer = make_scorer(runner, method, opts)
    keepers = [TopN(opts.top_n) for _ in queries]
    progress = report.start_progress(0, flags.log_every)
    bad = BadRows(flags, inputs.text_col)
    try:
        if queries and opts.group_col is not None:  # candidates grouped by query (`embedcli search ... -o -`)
            grouped = bad.checked(BatchSource(inputs, (opts.group_col,)))
            _rank_grouped(runner, scorer, grouped, opts.group_col, queries, keepers, docs, progress)
        elif queries:
            rows = rank_batch_rows(method, len(queries), inputs.batch_rows)
            batches = bad.checked(BatchSource(replace(inputs, batch_rows=rows)))
            rank_documents(runner, scorer, batches, [t for _, t in queries], keepers, docs, progress)
    except InputError as e:  # the row that stopped the run is listed too, as every command lists it
        stopped = [e.to_record()] if e.location or e.record_id is not None else []
        report.write_errors_file(flags.errors_file, [*bad.records(), *stopped])
        raise
    finally:
        progress.close()
        report.progress = None
    report.bad_rows(bad.errors)
    t0 = time.perf_counter()
    skipped = {KEY_SKIPPED: str(len(bad.errors)),
               KEY_ERRORS: json.dumps(bad.records()[:20], ensure_ascii=False, sort_keys=True)} if bad.errors else None
    out.publish(ranked_tables(docs, [q for q, _ in queries], keepers), skipped)
    report.seconds["write"] = time.perf_counter() - t0
    report.write_errors_file(flags.errors_file, bad.records())
    _rerank_stats(output, runner, report)
    if bad.errors:
        where = f"see {flags.errors_file}" if flags.errors_file else "pass --errors-file FILE to list them"
        report.note(f"{len(bad.errors):,} bad input rows were skipped ({where}); exit code 3")
        return EXIT_SKIPPED
    return EXIT_OK


def _rerank_stats(output: OutputOptions, runner: Runner, report: RunReport) -> None:
    stats = runner.stats
    if stats.truncated_rows:
        report.note(f"{stats.truncated_rows} of {stats.rows} inputs were truncated to {runner.max_length} tokens")
    if output.stats_file:
        data = stats.to_dict()
        data["seconds"]["write"] = round(report.seconds["write"], 4)
        data["seconds"]["total"] = round(time.perf_counter() - report.started, 4)
        data["peak_rss_mb"] = peak_rss_mb()
        write_stats(output.stats_file, data)
