"""A per-layer KV cache for one long sequence prefilled in slices, and the attention that reads it.

A decoder sequence longer than the token budget is fed in slices over successive packed forwards
(chunked prefill, see `embedcli.compute.prefill`). Each forward carries at most one such slice, laid out as
the *last* rows of the flat buffer, after the whole short sequences packed around it. In every
layer the own backbone's attention (which hands over to `PrefixSlice.attention` when the forward carries
a prefix) then:

- runs the ordinary packed causal attention over the rows of the short sequences;
- writes the slice's keys and values — post-RoPE, exactly what the attention function receives —
  into the sequence's cache for that layer (`module.layer_idx`), right after the cached ones;
- attends the slice's queries to the cached keys plus the slice's own: query `i` of a slice that
  starts at absolute position `P` sees keys `0 .. P + i` (a bottom-right aligned causal mask).

The cache is allocated once per layer for the tokens before the final slice
(`[kv_heads, capacity, head_dim]`), so keys are read as a view without copies and memory is the cache
itself: 2 x layers x kv_heads x head_dim x capacity values in the model dtype. The final slice's own
k/v are never stored (nothing reads them later). Position ids of a slice continue from the cached length (the caller's job).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from embedcli.models.kernels.packing import PackInfo, packed_attention

QUERY_BLOCK = 512


@dataclass
class SequenceKVCache:
    """Keys and values of one sequence, per layer, `[kv_heads, capacity, head_dim]`; `length` rows are final."""

    capacity: int
    length: int = 0
    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)

    def allocate(
        self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        """All layers' buffers in one block, before the first forward (less heap fragmentation than per layer)."""
        if self.keys or self.capacity == 0:
            return
        block = torch.empty(layers, 2, kv_heads, self.capacity, head_dim, dtype=dtype, device=device)
        for layer in range(layers):
            self.keys[layer], self.values[layer] = block[layer, 0], block[layer, 1]

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store `[n, kv_heads, dim]` k/v after the cached rows; return views of keys/values `0 .. length + n`."""
        n = key.shape[0]
        end = self.length + n
        if self.length == self.capacity and layer in self.keys:
            # The final slice: nothing after it reads its k/v, so they are not stored (the cache is sized
            # to the tokens before the final slice); one layer's keys are joined transiently instead.
            k_all = torch.cat([self.keys[layer][:, : self.length], key.transpose(0, 1)], dim=1)
            v_all = torch.cat([self.values[layer][:, : self.length], value.transpose(0, 1)], dim=1)
            return k_all, v_all
        if end > self.capacity:
            raise RuntimeError(f"KV cache overflow: {end} tokens for a capacity of {self.capacity}")
        buf = self.keys.get(layer)
        if buf is None or buf.shape[0] != key.shape[1] or buf.shape[2] != key.shape[2] or buf.dtype != key.dtype:
            heads, dim = key.shape[1], key.shape[2]
            self.keys[layer] = key.new_empty(heads, self.capacity, dim)
            self.values[layer] = value.new_empty(value.shape[1], self.capacity, value.shape[2])
        k_buf, v_buf = self.keys[layer], self.values[layer]
        k_buf[:, self.length : end].copy_(key.transpose(0, 1))
        v_buf[:, self.length : end].copy_(value.transpose(0, 1))
        return k_buf[:, :end], v_buf[:, :end]

    def advance(self, n: int) -> None:
        """Mark `n` more tokens final (after every layer of a forward has written them)."""
        self.length += n

    def nbytes(self) -> int:
        """Bytes held by the cache buffers."""
        seen: dict[int, int] = {}
        for t in (*self.keys.values(), *self.values.values()):
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())

    def clear(self) -> None:
        """Free the buffers (the sequence is finished)."""
        self.keys.clear()
        self.values.clear()


def prefix_causal_mask(num_queries: int, cached: int, device: torch.device) -> torch.Tensor:
    """`[num_queries, cached + num_queries]` bool: query `i` (absolute position `cached + i`) sees keys `0..cached+i`."""
    keys = torch.arange(cached + num_queries, device=device)
    queries = torch.arange(num_queries, device=device) + cached
    return keys[None, :] <= queries[:, None]


@dataclass
class PrefixSlice:
    """The slice of a long sequence in this forward: the last `length` rows of the packed buffer."""

    cache: SequenceKVCache
    length: int

    def attention(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        pack: PackInfo | None,
        scaling: float | None,
    ) -> tuple[torch.Tensor, None]:
        """transformers attention-interface entry: `[1, heads, total, dim]` in, `[1, total, heads, dim]` out."""
        if query.shape[0] != 1:
            raise RuntimeError("packed attention expects the whole batch flattened into one row")
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise RuntimeError(f"{type(module).__name__} has no layer_idx; chunked prefill cannot key its KV cache")
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [total, heads, dim]
        total, n = q.shape[0], self.length
        split = total - n
        if split < 0 or (split > 0) != (pack is not None) or (pack is not None and pack.total != split):
            raise RuntimeError("the packed-batch info does not match the rows before the prefill slice")
        parts = []
        if pack is not None:
            parts.append(packed_attention(q[:split], k[:split], v[:split], pack, causal=True, scale=scaling))
        cached = self.cache.length
        keys, values = self.cache.write(int(layer), k[split:], v[split:])  # [kv_heads, cached + n, dim]
        qs = q[split:].transpose(0, 1)[None]  # [1, heads, n, dim]
        ks, vs = keys[None], values[None]
        gqa = qs.shape[1] != ks.shape[1]
        if cached == 0:
            out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scaling, enable_gqa=gqa)
        else:
            # Queries in blocks: the mask (and any score matrix a masked kernel builds) stays
            # `QUERY_BLOCK x keys` instead of `slice x keys`; a block sees keys up to its last query.
            blocks = []
            for lo in range(0, n, QUERY_BLOCK):
                hi = min(lo + QUERY_BLOCK, n)
                mask = prefix_causal_mask(hi - lo, cached + lo, q.device)
                seen = cached + hi
                blocks.append(
                    F.scaled_dot_product_attention(
                        qs[:, :, lo:hi], ks[:, :, :seen], vs[:, :, :seen], attn_mask=mask, scale=scaling, enable_gqa=gqa
                    )
                )
            out = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2)
        parts.append(out[0].transpose(0, 1))
        result = parts[0] if len(parts) == 1 else torch.cat(parts)
        return result.unsqueeze(0), None
