"""vLLM's pooling endpoints as OpenAI Batch files: request lines in, response lines out (no torch here).

Modules: `served` (what the loaded model serves), `requests` (parse and validate one line per route as
vLLM's protocol names fields), `units` (flatten requests into the texts, token ids and (left, right) pairs
the existing commands compute, and back), `responses` (the route's body as vLLM returns it, in the batch
output object), `encoding` (base64), `chunk` (a block of lines through all of it). Each module names the
vLLM file and commit whose shapes it mirrors.

How `embedcli run-batch` should be wired onto the shared run loop (the frozen `Job` of issue 11):
- **One RowCodec whose batch rows are request lines.** The source reads the input file as plain lines
  (row id = line number, text = the raw line; blank lines are not rows). Before the first batch, a cheap
  pre-pass `scan_custom_ids(file)` fixes which line first holds each custom_id, so a duplicate is judged
  by the whole file in every shard and after every resume, never by what one process happened to read.
- **Units flattened across requests.** For each batch of rows, `read_chunk` parses the lines and
  `chunk.flat.units` lists every unit of every valid request in order. The engine groups units by
  `Unit.group` (task and pooling params: use_activation, dimensions, truncation) and packs each group under
  `--max-batch-tokens` as `embed` / `classify` / `token-*` pack texts and `score` packs pairs (via
  `scoring.PairScorer` for the model's score method), so 10,000 one-text requests cost what `embed` over
  the same 10,000 texts costs. Each unit returns a `UnitResult(value, tokens)`.
  Units carry exactly the text to tokenize: /v1/embeddings, /classify and /pooling apply no prompt (as
  vLLM); /v2/embed has its `input_type` prompt already prepended; score/rerank pairs are raw and the
  PairScorer adds the query/document prompts as `score` and `rerank` do. Compare against `embed --prompt ""`
  on models with a default prompt. `truncate_prompt_tokens` None means "no truncation" in vLLM; the wiring
  decides whether an over-long unit is a bad line (vLLM: 400) or is cut as embedcli's default.
- **The served model.** Build one `ServedModel` from the loaded model's spec: `names` = the `-m` value,
  its basename and the spec's model id (what `body.model` may say; responses carry the first); `tasks` =
  the spec's supported pooling tasks; Matryoshka sizes, max length, prompts, id2label; `score_method` =
  what `score`/`rerank` would use (None when the model cannot score: a classifier with more than one label).
- **Usage.** `usage.prompt_tokens` is the sum of the units' `tokens`: each text's prompt tokens after
  truncation; for a pair, the tokens of both sides as scored (vLLM's bi-encoder count adds one pad token
  per pair; the wiring may report that count for cosine pairs if exact parity with vLLM's usage matters).
- **Results reassembled per line.** `write_chunk(chunk, results, ctx)` gives one output line per input
  line, in input order: 200 lines with the route's body, 400 lines for bad requests (bad lines never stop
  the run; `--on-error fail` stops at the first, exit 1; otherwise exit 3 when any line was bad).
- **Committed through the shared loop.** The output lines of a batch are the batch's committed rows (one
  string column), staged and renamed like any other command's rows; the final JSONL is the concatenation
  in row order. So resume after kill -9, `--shard K/N`, `--engine ray`, progress and `--stats` come for
  free. For byte-identical resumes, `ResponseContext.created` and `.seed` must be run constants stored in
  the manifest (created at the first start; seed = the config hash), never the clock at each start.
- `ResponseContext.ranges` carries `--calibration` ranges for /v2/embed int8/uint8; without them each
  request is quantized over its own vectors (sentence-transformers' one-`encode` semantics).
"""

from embedcli.batchapi.chunk import Chunk, read_chunk, write_chunk
from embedcli.batchapi.encoding import decode_base64, encode_base64
from embedcli.batchapi.requests import (
    COHERE_PRECISIONS,
    ROUTES,
    BadLine,
    BadRequest,
    BatchRequest,
    ResponseOptions,
    SeenIds,
    Unit,
    UnitParams,
    parse_line,
    parse_lines,
    scan_custom_ids,
)
from embedcli.batchapi.responses import ResponseContext, dumps, error_line, response_line
from embedcli.batchapi.served import ServedModel
from embedcli.batchapi.units import FlatUnits, UnitResult, flatten, reassemble

__all__ = [
    "COHERE_PRECISIONS",
    "ROUTES",
    "BadLine",
    "BadRequest",
    "BatchRequest",
    "Chunk",
    "FlatUnits",
    "ResponseContext",
    "ResponseOptions",
    "SeenIds",
    "ServedModel",
    "Unit",
    "UnitParams",
    "UnitResult",
    "decode_base64",
    "dumps",
    "encode_base64",
    "error_line",
    "flatten",
    "parse_line",
    "parse_lines",
    "read_chunk",
    "reassemble",
    "response_line",
    "scan_custom_ids",
    "write_chunk",
]
