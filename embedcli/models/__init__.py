"""Models, offline: `resolve` finds the folder, `spec` reads it into a hashable `ModelSpec` (no weights),
`loader` loads weights and heads, `packing` and `kv_cache` run packed varlen forwards (a layer below
`compute`; imports `pooling`, `errors`)."""
