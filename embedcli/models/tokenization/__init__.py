"""Tokenizers: encoder tokenizer.json, the decoder mirror of transformers' rebuilds, char clipping."""
