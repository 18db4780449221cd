"""`embedcli search`: embed queries the way a vectors file was made, then exact top-k over it, streamed.

Everything that decides the query vectors comes from the vectors file's own provenance (`embedcli.model`,
`embedcli.model_hash`, `embedcli.config`, `embedcli.quantization`): the model (refused when `-m` names a
different one), its normalization, Matryoshka dimensions, max length, truncation, strip, dtype, and the
stored precision with its int8/uint8 ranges. The query prompt is the model's `query` prompt where it has
one (sentence-transformers' `encode_query`), else the prompt the corpus was embedded with.

A `WholeJob` (`embedcli.run.whole`), not a `Job`: the output is known only once the whole vectors file has
been scanned, so it is checked as every output is (inputs, config, `--overwrite`) and written once, atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.compute.build import RunnerRecipe, build_engine
from embedcli.compute.options import RunnerOptions
from embedcli.errors import EXIT_OK, ModelNotFoundError, UsageError
from embedcli.io.location import is_object_file, is_url, local_path
from embedcli.io.manifest import output_metadata
from embedcli.io.parquet_source import read_schema, schema_metadata
from embedcli.io.stores.url import LANCE_SCHEME, POSTGRES_SCHEMES, redact
from embedcli.io.writers import output_format
from embedcli.models.spec import ModelSpec, load_model_spec
from embedcli.quantize import output_width
from embedcli.retrieval import (
    SearchSpace,
    parquet_vector_blocks,
    search_blocks,
    take_rows,
    usable_rows,
    vector_block,
)
from embedcli.run.flags import RunFlags
from embedcli.run.job import Reporting, Target
from embedcli.run.source import refuse_shadowing
from embedcli.run.whole import WholeJob, WholeOutput, check_whole
from embedcli.tasks.common import ModelChoice, OutputOptions, runner_recipe
from embedcli.tasks.pairs import read_queries

KEY_SEARCH = "embedcli.search"
DEFAULT_RESCORE = 4  # top-k x 4 quantized candidates rescored with the float query (the recipe's multiplier)


@dataclass(frozen=True)
class SearchOptions:
    """`search` choices."""

    vectors: str
    query: str | None = None
    queries: str | None = None
    query_col: str = "text"
    query_id_col: str | None = None
    top_k: int = 10
    keep_cols: list[str] = field(default_factory=list)
    rescore_multiplier: int = DEFAULT_RESCORE
    block_rows: int = 8192


@dataclass(frozen=True)
class VectorsProvenance:
    """What a vectors file says about how it was made."""

    path: str
    model: str
    model_hash: str
    config: dict[str, Any]
    precision: str
    ranges: np.ndarray | None
    width: int
    id_field: Any
    names: tuple[str, ...] = ()
    table: Any = None  # a LanceDB table (`embedcli.io.stores.lance.LanceVectors`), pinned at its version

    @classmethod
    def read(cls, path: str) -> VectorsProvenance:
        """The provenance of an `embedcli embed` Parquet output or LanceDB table; UsageError when it is not one."""
        table = None
        if path.startswith(LANCE_SCHEME):
            from embedcli.io.stores.lance import LanceVectors

            table = LanceVectors(path)
            schema, meta = table.schema, table.metadata
            return cls._of(path, schema, meta, table)
        path = local_path(path)  # file:///abs/v.parquet is the local file
        if is_url(path):
            if not is_object_file(path):
                raise UsageError(f"{path}: no such vectors object; search reads one Parquet object")
        elif os.path.isdir(path):
            raise UsageError(f"{path}: search reads one Parquet file; join a shard directory first (embedcli merge)")
        elif not os.path.isfile(path):
            raise UsageError(f"{path}: no such vectors file")
        try:
            schema = read_schema(path)
        except (pa.ArrowException, OSError) as e:
            raise UsageError(f"{path}: not a Parquet file ({e}); search reads the Parquet output of embedcli embed") from e
        meta = (output_metadata(path, "parquet") if not is_url(path) else schema_metadata(schema)) or {}
        return cls._of(path, schema, meta, table)

    @classmethod
    def _of(cls, path: str, schema: pa.Schema, meta: dict[str, str], table: Any) -> VectorsProvenance:
        if "embedcli.config" not in meta or "embedcli.model" not in meta:
            raise UsageError(f"{path}: no embedcli provenance (embedcli.model, embedcli.config); "
                             "search reads vectors written by embedcli embed")
        config = json.loads(meta["embedcli.config"])
        if config.get("task") != "embed":
            raise UsageError(f"{path}: made by the {config.get('task')!r} task, not embed; search needs embed vectors")
        for col in ("id", "embedding"):
            if col not in schema.names:
                raise UsageError(f"{path}: no {col!r} column")
        vec = schema.field("embedding").type
        if not pa.types.is_fixed_size_list(vec):
            raise UsageError(f"{path}: the embedding column is {vec}, not a fixed-size vector")
        quant = json.loads(meta.get("embedcli.quantization") or "{}")
        precision = str(quant.get("precision") or config.get("precision") or "float32")
        ranges = np.asarray(quant["ranges"], dtype=np.float32) if "ranges" in quant else None
        if precision in ("int8", "uint8") and ranges is None:
            raise UsageError(f"{path}: {precision} vectors without stored ranges (embedcli.quantization) cannot be searched")
        return cls(path, meta["embedcli.model"], meta.get("embedcli.model_hash", ""), config, precision, ranges,
                   vec.list_size, schema.field("id"), tuple(schema.names), table)

    def vector_blocks(self, block_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """`([b, width], valid)` blocks of the stored vectors, rows numbered from 0 in this order."""
        if self.table is None:
            yield from parquet_vector_blocks(self.path, block_rows)
            return
        for batch in self.table.blocks(["embedding"], block_rows):
            yield vector_block(batch.column(0))

    def take(self, rows: np.ndarray, columns: list[str], block_rows: int) -> pa.Table:
        """`columns` of the rows numbered as `vector_blocks` numbers them, in that order."""
        if self.table is None:
            return take_rows(self.path, rows, columns, block_rows)
        return self.table.take(rows, columns)

    def fingerprint(self) -> list[dict[str, Any]]:
        """A table's fingerprint as an input of the search (its URL and version); none for a file (an input)."""
        if self.table is None:
            return []
        return [{"path": self.path, "version": int(self.table.table.version), "rows": self.table.rows}]


def _model_spec(prov: VectorsProvenance, choice: ModelChoice) -> ModelSpec:
    """The spec of the model that made the vectors; UsageError when `-m` (or the stored name) is another."""
    name = choice.model or prov.model
    try:
        spec = load_model_spec(name, allow_pickle=choice.allow_pickle, trust_remote_code=choice.trust_remote_code)
    except ModelNotFoundError as e:
        if choice.model:
            raise
        raise UsageError(f"{prov.path} was made with {prov.model!r}, which does not resolve here ({e}); "
                         "pass -m with that model's folder") from e
    stored = prov.config.get("max_length")
    if isinstance(stored, int) and stored > 0 and stored != spec.max_length:  # the vectors were made with --max-length
        spec = load_model_spec(name, allow_pickle=choice.allow_pickle, trust_remote_code=choice.trust_remote_code,
                               max_length=stored)
    check_vectors_model(prov, spec, f"-m {choice.model}" if choice.model else f"the model {prov.model!r} found here")
    return spec


def check_vectors_model(prov: VectorsProvenance, spec: ModelSpec, what: str) -> None:
    """UsageError unless `spec` (called `what` in the message) is the model that made the vectors."""
    if prov.model_hash and spec.content_hash != prov.model_hash:
        raise UsageError(f"{what} is not the model that made {prov.path} ({prov.model!r}, content hash "
                         f"{prov.model_hash}; this one is {spec.content_hash}): queries must be embedded by "
                         "the same model as their corpus")
    stored_config = prov.config.get("model_config_hash")
    if stored_config and spec.config_hash() != stored_config:
        # same weights, other pooling / projector / normalization: the vectors would not be comparable
        raise UsageError(f"{what} is not the model that made {prov.path}: same weights but its pooling config "
                         f"differs (config hash {spec.config_hash()}, the vectors' {stored_config})")


def query_prompt(spec: ModelSpec, corpus_prompt: str) -> str:
    """The model's `query` prompt where it has one (as `encode_query`), else the corpus's prompt."""
    return dict(spec.prompts).get("query", corpus_prompt or "")


def query_recipe(prov: VectorsProvenance, spec: ModelSpec, choice: ModelChoice) -> RunnerRecipe:
    """The recipe of the runner that embeds queries as the vectors were made (their stored config)."""
    cfg = prov.config
    dtype = choice.dtype if choice.dtype != "auto" else str(cfg.get("dtype") or "auto")
    return runner_recipe(
        spec,
        replace(choice, dtype=dtype, quantize=bool(cfg.get("quantize"))),
        RunnerOptions(
            task="embed",
            max_length=cfg.get("max_length"),
            long_inputs=cfg.get("long_inputs") or "truncate",
            truncation_side=cfg.get("truncation_side") or "right",
            strip=bool(cfg.get("strip", True)),
            prompt=query_prompt(spec, str(cfg.get("prompt") or "")),
            normalize=cfg.get("normalize"),
            dimensions=cfg.get("dimensions"),
        ),
    )


def embed_queries(
    prov: VectorsProvenance, spec: ModelSpec, choice: ModelChoice, texts: list[str]
) -> tuple[np.ndarray, str]:
    """Float32 query vectors made with the corpus's settings, and the prompt used."""
    recipe = query_recipe(prov, spec, choice)
    runner = build_engine(recipe)  # a static model's numpy runner, else the torch Runner
    return runner.embed(texts).astype(np.float32, copy=False), recipe.runner_options.prompt


def rescore_of(precision: str, multiplier: int) -> int:
    """`--rescore` as it applies to vectors of `precision`: float vectors have nothing to rescore (0)."""
    return multiplier if precision not in ("float32", "float16") else 0


def search_file(prov: VectorsProvenance, vectors: np.ndarray, query_ids: list[str], opts: SearchOptions) -> tuple[pa.Table, int]:
    """Exact top-k of the float query `vectors` over the vectors file: the hit rows (`HIT_COLUMNS`, then the
    kept columns), and how many stored rows could never be hits (a null, NaN or infinite vector)."""
    dim = vectors.shape[1]
    if output_width(prov.precision, dim) != prov.width:
        raise UsageError(f"{prov.path}: stored vectors are {prov.width} wide, the model's {prov.precision} "
                         f"queries are {output_width(prov.precision, dim)}")
    space = SearchSpace(prov.precision, dim, prov.ranges)
    unusable = [0]

    def blocks() -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        for block, valid in prov.vector_blocks(opts.block_rows):
            unusable[0] += len(block) - int(usable_rows(block, valid).sum())
            yield block, valid

    rescore = rescore_of(prov.precision, opts.rescore_multiplier)
    scores, rows = search_blocks(vectors, blocks(), opts.top_k, space, rescore_multiplier=rescore)
    hits = prov.take(rows.reshape(-1), ["id", *opts.keep_cols], opts.block_rows)
    columns = hit_columns(query_ids, scores, hits.column("id"))
    for c in opts.keep_cols:
        columns[c] = hits.column(c)
    return pa.table(columns), unusable[0]


def hit_columns(query_ids: list[str], scores: np.ndarray, ids: Any) -> dict[str, Any]:
    """`query_id, rank, id, score` of `[queries, found]` scores whose hits' ids are `ids` (query-major)."""
    found = scores.shape[1]
    return {
        "query_id": pa.array(np.repeat(np.asarray(query_ids, dtype=object), found), pa.string()),
        "rank": pa.array(np.tile(np.arange(1, found + 1, dtype=np.int32), len(query_ids)), pa.int32()),
        "id": ids,
        "score": pa.array(scores.reshape(-1).astype(np.float32), pa.float32()),
    }


HIT_COLUMNS = ("query_id", "rank", "id", "score")


def check_search_options(opts: SearchOptions) -> None:
    """Usage errors of `--top-k`, `--rescore` and `--block-rows`, before anything is read."""
    if opts.top_k < 1:
        raise UsageError(f"--top-k {opts.top_k}: must be 1 or more")
    if opts.rescore_multiplier < 0:
        raise UsageError(f"--rescore {opts.rescore_multiplier}: must be 0 (off) or more")
    if opts.block_rows < 1:
        raise UsageError(f"--block-rows {opts.block_rows}: must be 1 or more")


def check_kept(prov: VectorsProvenance, keep_cols: list[str]) -> None:
    """UsageError naming the `--keep-cols` columns the vectors file does not have."""
    names = list(prov.names)
    missing = [c for c in keep_cols if c not in names]
    if missing:
        raise UsageError(f"--keep-cols {','.join(missing)}: not in {prov.path} (columns: {', '.join(names)})")


def run_search(opts: SearchOptions, choice: ModelChoice, output: OutputOptions, flags: RunFlags | None = None) -> int:
    """`embedcli search`: rows `query_id, rank, id, score` (+ kept columns), best first per query."""
    started = time.perf_counter()
    check_search_options(opts)
    if opts.vectors.startswith(POSTGRES_SCHEMES):
        raise UsageError(f"{redact(opts.vectors)}: search reads Parquet files and LanceDB tables; search a Postgres "
                         "table with pgvector's own operators (ORDER BY embedding <=> query)")
    if output_format(output.path, output.fmt) == "npy":
        raise UsageError(f"-o {output.path}: search writes rows (query_id, rank, id, score): use .parquet or .jsonl")
    refuse_shadowing(HIT_COLUMNS, opts.keep_cols)
    store = opts.vectors.startswith(LANCE_SCHEME)  # a LanceDB table: fingerprinted by its version, not as a file
    inputs = [*([] if store else [opts.vectors]), *([opts.queries] if opts.queries else [])]
    whole = WholeJob(Target(output.path, output.fmt), inputs,
                     flags or RunFlags(), Reporting(output.quiet, output.stats_file), "search")
    check_whole(whole)  # -o against the vectors and the queries, before anything is read
    prov = VectorsProvenance.read(opts.vectors)
    check_kept(prov, opts.keep_cols)
    queries = read_queries(opts, "search")
    spec = _model_spec(prov, choice)
    prompt = query_prompt(spec, str(prov.config.get("prompt") or ""))
    # float vectors have nothing to rescore: the multiplier is recorded as 0, so it does not tell outputs apart
    rescore = rescore_of(prov.precision, opts.rescore_multiplier)
    config = {
        "task": "search", "top_k": opts.top_k, "precision": prov.precision, "query": opts.query,
        "rescore_multiplier": rescore, "query_prompt": prompt,
        "score": _score_name(prov.precision, rescore), "dtype": choice.dtype,
    }
    config_json = json.dumps(config, sort_keys=True)
    meta = {
        "embedcli.model": prov.model,
        "embedcli.model_hash": prov.model_hash,
        "embedcli.config": config_json,
        "embedcli.config_hash": hashlib.sha256(config_json.encode()).hexdigest()[:16],
        KEY_SEARCH: json.dumps({
            "vectors": prov.path if is_url(prov.path) else os.path.abspath(prov.path), "top_k": opts.top_k, "precision": prov.precision,
            "rescore_multiplier": rescore, "query_prompt": prompt,
            "score": _score_name(prov.precision, rescore),
        }),
    }
    options = {"keep_cols": list(opts.keep_cols), "query_col": opts.query_col, "query_id_col": opts.query_id_col}
    out = WholeOutput(whole, meta, options, tables=prov.fingerprint())
    done = out.settle()  # an output made otherwise is refused (exit 2) before the model loads
    if done is not None:
        return done
    vectors, prompt = embed_queries(prov, spec, choice, [t for _, t in queries])
    table, unusable = search_file(prov, vectors, [q for q, _ in queries], opts)
    if unusable and not output.quiet:
        print(f"embedcli: {unusable:,} rows of {prov.path} have a null, NaN or infinite vector: "
              "they are never hits (re-embed them)", file=sys.stderr)
    out.publish([table])
    if not output.quiet:
        found = table.num_rows // max(len(queries), 1)
        print(f"embedcli: done: {len(queries)} queries x {prov.path}: top {found} each, "
              f"{time.perf_counter() - started:.1f} s -> {output.path}", file=sys.stderr)
    return EXIT_OK


def _score_name(precision: str, rescore: int) -> str:
    if precision in ("float32", "float16"):
        return "cosine"
    if rescore:
        return "float query . dequantized vector" if precision in ("int8", "uint8") else "float query . bits"
    return "dot product of codes" if precision in ("int8", "uint8") else "agreeing bits (dim - hamming)"
