"""Compute kernels of the packed buffer: varlen attention, oneDNN linears, the chunked-prefill KV cache."""
