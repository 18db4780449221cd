"""Compute: texts in, pooled results out, under a token budget.

`runner` tokenizes, packs sequences into forwards (`models.packing`) and pools them (`pooling`);
`prefill` runs decoder sequences over the budget in slices with a KV cache; `build` is the one place a
runner is built from a picklable `RunnerRecipe` (the CLI, `embedcli.Embedder` and Ray workers).
"""
