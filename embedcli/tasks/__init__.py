"""Tasks: one module per command family turns a command's options into one `Job` and runs it.

`embed` (with `--precision` quantized output), `classify`, `tokens` (token-embed, token-classify),
`pairs` (score, rerank), `search` (exact top-k over a vectors file, written once, so no `Job`), `info`,
`inspect` and `merge` (sets of `--shard K/N` outputs); `common` holds the shared model choice, provenance
and `make_job`. Each `run_*` returns the exit code.
"""
