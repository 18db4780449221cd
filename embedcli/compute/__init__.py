"""Compute: texts in, pooled results out, under a token budget.

`runner` tokenizes, packs sequences into forwards (`models.packing`) and pools them (`pooling`);
`prefill` runs decoder sequences over the budget in slices with a KV cache; `build` is the one place a
runner is built from a picklable `RunnerRecipe` (the CLI, `embedcli.Embedder` and Ray workers). Without
torch: `options` (the runner's options and counters), `plan` (what a recipe's runner will resolve to, for the
output's provenance before loading) and `lazy` (an engine whose model loads only once the run has work).
"""
