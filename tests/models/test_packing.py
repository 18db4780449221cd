"""PackInfo index maps and the packed attention, against plain per-sequence SDPA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from embedcli.models.packing import (
    ATTN_IMPLEMENTATION,
    PackInfo,
    packed_attention,
    packed_attention_forward,
    padded_bias,
    register_packed_attention,
)

lengths_strategy = st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=8)


@given(lengths=lengths_strategy)
@settings(max_examples=60, deadline=None)
def test_pack_info_index_maps(lengths: list[int]) -> None:
    pack = PackInfo.build(lengths)
    total = sum(lengths)
    assert pack.batch == len(lengths) and pack.total == total and pack.max_len == max(lengths)
    assert pack.cu_seqlens.dtype == torch.int32
    assert pack.cu_seqlens.tolist() == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    flat = torch.arange(total) + 100
    padded = flat.index_select(0, pack.gather_index).view(pack.batch, pack.max_len)
    for row, (start, n) in enumerate(zip(pack.cu_seqlens[:-1].tolist(), lengths, strict=True)):
        assert padded[row, :n].tolist() == list(range(100 + start, 100 + start + n))
    # Scatter picks every real slot once, in buffer order: padded -> flat is the identity.
    assert torch.equal(padded.reshape(-1).index_select(0, pack.scatter_index), flat)
    if len(set(lengths)) == 1:
        assert pack.key_mask is None
    else:
        assert pack.key_mask is not None and pack.key_mask.shape == (pack.batch, 1, 1, pack.max_len)
        assert pack.key_mask.sum().item() == total


@pytest.mark.parametrize("lengths", [[], [3, 0]])
def test_pack_info_rejects_empty(lengths: list[int]) -> None:
    with pytest.raises(ValueError, match="at least one"):
        PackInfo.build(lengths)


def _reference(q, k, v, lengths, causal, bias=None, scale=None):  # type: ignore[no-untyped-def]
    """Attention of each sequence alone (SDPA on `[1, heads, n, dim]`), laid back end to end."""
    outs, start = [], 0
    groups = q.shape[1] // k.shape[1]
    for n in lengths:
        qs, ks, vs = (t[start : start + n].transpose(0, 1)[None] for t in (q, k, v))
        ks, vs = ks.repeat_interleave(groups, 1), vs.repeat_interleave(groups, 1)
        mask = None if bias is None else bias[:, :, :n, :n]
        out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, is_causal=causal, scale=scale)
        outs.append(out[0].transpose(0, 1))
        start += n
    return torch.cat(outs)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("lengths", [[5], [1, 7, 3], [4, 4], [9, 1, 1, 6]])
def test_packed_attention_matches_per_sequence(causal: bool, kv_heads: int, lengths: list[int]) -> None:
    gen = torch.Generator().manual_seed(0)
    total = sum(lengths)
    q = torch.randn(total, 4, 8, generator=gen)
    k = torch.randn(total, kv_heads, 8, generator=gen)
    v = torch.randn(total, kv_heads, 8, generator=gen)
    pack = PackInfo.build(lengths)
    got = packed_attention(q, k, v, pack, causal=causal, scale=0.3)
    assert got.shape == (total, 4, 8)
    torch.testing.assert_close(got, _reference(q, k, v, lengths, causal, scale=0.3), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("lengths", [[6], [2, 6, 3], [5, 5]])
def test_packed_attention_with_additive_bias(lengths: list[int]) -> None:
    """MPNet's path: one `[1, heads, L, L]` relative bias shared by all sequences, key padding folded in."""
    gen = torch.Generator().manual_seed(1)
    total = sum(lengths)
    q, k, v = (torch.randn(total, 4, 8, generator=gen) for _ in range(3))
    pack = PackInfo.build(lengths)
    bias = torch.randn(1, 4, pack.max_len, pack.max_len, generator=gen)
    got = packed_attention(q, k, v, pack, causal=False, attn_bias=padded_bias(bias, pack))
    torch.testing.assert_close(got, _reference(q, k, v, lengths, False, bias=bias), atol=1e-6, rtol=1e-5)


def test_padded_bias_masks_only_padding() -> None:
    pack = PackInfo.build([3, 1])
    bias = torch.zeros(1, 2, 3, 3)
    folded = padded_bias(bias, pack)
    assert folded.shape == (2, 2, 3, 3)
    assert torch.isinf(folded[1, :, :, 1:]).all() and (folded[1, :, :, 0] == 0).all()
    assert (folded[0] == 0).all()
    assert padded_bias(bias, PackInfo.build([3, 3])) is bias


def test_attention_interface_needs_pack() -> None:
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(RuntimeError, match="embedcli_pack"):
        packed_attention_forward(torch.nn.Module(), q, q, q, None)
    with pytest.raises(RuntimeError, match="flattened into one row"):
        packed_attention_forward(torch.nn.Module(), q.expand(2, -1, -1, -1), q, q, None, embedcli_pack=PackInfo.build([3]))


def test_attention_interface_layout() -> None:
    """`[1, heads, total, dim]` in, `[1, total, heads, dim]` out; causality read from the module."""
    gen = torch.Generator().manual_seed(2)
    lengths = [3, 5]
    q, k, v = (torch.randn(1, 2, 8, 4, generator=gen) for _ in range(3))
    module = torch.nn.Module()
    module.is_causal = True
    out, weights = packed_attention_forward(module, q, k, v, None, scaling=0.5, embedcli_pack=PackInfo.build(lengths))
    assert weights is None and out.shape == (1, 8, 2, 4)
    flat = [t[0].transpose(0, 1) for t in (q, k, v)]
    torch.testing.assert_close(out[0], _reference(*flat, lengths, True, scale=0.5), atol=1e-6, rtol=1e-5)


def test_registration_is_idempotent() -> None:
    from transformers import AttentionInterface

    assert register_packed_attention() == ATTN_IMPLEMENTATION == register_packed_attention()
    assert ATTN_IMPLEMENTATION in AttentionInterface._global_mapping
