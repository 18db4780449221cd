"""PackInfo index maps and the packed attention, against plain per-sequence SDPA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from embedcli.models.backbones.layers import varlen_attention
from embedcli.models.kernels import packing
from embedcli.models.kernels.packing import (
    GROUP_LENGTH_RATIO,
    PackInfo,
    attend,
    length_groups,
    packed_attention,
    padded_bias,
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
def test_packed_attention_matches_per_sequence(causal: bool, kv_heads: int, lengths: list[int], attention_kernel: str) -> None:
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


# -- length groups: attention pads each group of similar lengths only ------------------------------------


@given(lengths=st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=40))
@settings(max_examples=80, deadline=None)
def test_length_groups_cover_each_sequence_once_and_bound_padding(lengths: list[int]) -> None:
    groups = length_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    longest = [lengths[g[0]] for g in groups]
    assert longest == sorted(longest, reverse=True)
    for g in groups:
        assert all(lengths[i] <= lengths[g[0]] for i in g)
        assert min(lengths[i] for i in g) >= GROUP_LENGTH_RATIO * lengths[g[0]]


@given(lengths=st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=12))
@settings(max_examples=60, deadline=None)
def test_group_index_maps_round_trip(lengths: list[int]) -> None:
    pack = PackInfo.build(lengths)
    flat = torch.arange(pack.total) + 100
    seen = torch.zeros(pack.total, dtype=torch.long)
    for group in pack.groups:
        padded = flat.index_select(0, group.gather_index).view(group.batch, group.max_len)
        back = padded.reshape(-1).index_select(0, group.scatter_index)
        assert torch.equal(back, flat.index_select(0, group.rows))
        seen.index_add_(0, group.rows, torch.ones_like(group.rows))
        real = 0 if group.key_mask is None else int(group.key_mask.sum())
        assert group.key_mask is None or real == len(group.rows)
    assert bool((seen == 1).all())
    whole = [g for g in pack.groups if g.whole]
    assert len(whole) <= 1 and (not whole or len(pack.groups) == 1)


def _reference64(q, k, v, lengths, causal, bias=None, scale=None):  # type: ignore[no-untyped-def]
    """Softmax attention of each sequence alone, written out in float64."""
    q, k, v = q.double(), k.double(), v.double()
    reps = q.shape[1] // k.shape[1]
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    outs, start = [], 0
    for n in lengths:
        qs, ks, vs = (t[start : start + n].transpose(0, 1) for t in (q, k, v))  # [heads, n, dim]
        ks, vs = ks.repeat_interleave(reps, 0), vs.repeat_interleave(reps, 0)
        scores = qs @ ks.transpose(1, 2) * scale
        if bias is not None:
            scores = scores + bias[0, :, :n, :n].double()
        if causal:
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        outs.append((scores.softmax(-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(outs)


MIXED = [[40, 3, 37, 2, 9, 31, 1], [2, 50], [7, 7, 7], [1], [33, 12, 30, 11, 4, 32]]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("lengths", MIXED)
def test_grouped_attention_matches_float64_per_sequence(
    causal: bool, kv_heads: int, lengths: list[int], attention_kernel: str
) -> None:
    gen = torch.Generator().manual_seed(3)
    total = sum(lengths)
    q = torch.randn(total, 4, 8, generator=gen)
    k, v = (torch.randn(total, kv_heads, 8, generator=gen) for _ in range(2))
    pack = PackInfo.build(lengths)
    got = packed_attention(q, k, v, pack, causal=causal, scale=0.3)
    torch.testing.assert_close(got.double(), _reference64(q, k, v, lengths, causal, scale=0.3), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("lengths", MIXED)
def test_varlen_attention_fused_qkv_with_relative_bias(lengths: list[int], attention_kernel: str) -> None:
    """The own encoders' path: one fused projection, MPNet's relative bias cut to each group."""
    gen = torch.Generator().manual_seed(4)
    total, heads, dim = sum(lengths), 4, 8
    qkv = torch.randn(total, 3 * heads * dim, generator=gen)
    pack = PackInfo.build(lengths)
    bias = torch.randn(1, heads, pack.max_len, pack.max_len, generator=gen)
    got = varlen_attention(qkv, pack, heads, dim, bias=bias)
    q, k, v = (t.reshape(total, heads, dim) for t in qkv.split(heads * dim, dim=-1))
    want = _reference64(q, k, v, lengths, False, bias=bias).reshape(total, heads * dim)
    torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=1e-5)


# -- bf16 on the CPU: matmul attention in chunks ------------------------------------------------------------


def _bf16_case(batch: int, kv_heads: int, seed: int = 5):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 4, 24, 8, generator=gen)
    k, v = (torch.randn(batch, kv_heads, 24, 8, generator=gen) for _ in range(2))
    return q, k, v


def _sdpa64(q, k, v, mask, causal, scale):  # type: ignore[no-untyped-def]
    q, k, v = q.double(), k.double(), v.double()
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.double()
    if causal:
        scores = scores.masked_fill(torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("mask_kind", ["none", "keys", "additive"])
def test_bf16_attention_matches_float64_within_bf16_rounding(causal: bool, kv_heads: int, mask_kind: str) -> None:
    q, k, v = _bf16_case(3, kv_heads)
    mask = None
    if mask_kind == "keys":
        mask = torch.ones(3, 1, 1, 24, dtype=torch.bool)
        mask[1, ..., 17:] = False
    elif mask_kind == "additive":
        mask = torch.randn(1, 4, 24, 24, generator=torch.Generator().manual_seed(6))
    got = attend(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, causal=causal, scale=0.3, gqa=kv_heads != 4)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    want = _sdpa64(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, causal, 0.3)
    # bf16 scores and probabilities: a few units of bf16's 2^-8 on outputs of size ~1
    torch.testing.assert_close(got.double(), want, atol=3e-2, rtol=0)


def test_bf16_attention_ignores_masked_keys_exactly() -> None:
    q, k, v = (t.bfloat16() for t in _bf16_case(2, 4))
    mask = torch.ones(2, 1, 1, 24, dtype=torch.bool)
    mask[0, ..., 10:] = False
    base = attend(q, k, v, mask, causal=False)
    k2, v2 = k.clone(), v.clone()
    k2[0, :, 10:], v2[0, :, 10:] = 300.0, 1e4
    assert torch.equal(attend(q, k2, v2, mask, causal=False), base)


def test_bf16_attention_chunks_give_the_unchunked_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v = (t.bfloat16() for t in _bf16_case(5, 4))
    whole = attend(q, k, v, None, causal=False)
    monkeypatch.setattr(packing, "BF16_ATTENTION_CHUNK_SCORES", 4 * 24 * 24 * 2)  # two sequences per step
    assert torch.equal(attend(q, k, v, None, causal=False), whole)


def test_float32_additive_biases_and_long_sequences_keep_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v = _bf16_case(2, 4)
    torch.testing.assert_close(attend(q, k, v, None, causal=True), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    # a float bias (MPNet) stays float32 inside SDPA rather than being rounded with bf16 scores
    bias = torch.randn(1, 4, 24, 24, generator=torch.Generator().manual_seed(7))
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    assert torch.equal(attend(qb, kb, vb, bias, causal=False), F.scaled_dot_product_attention(qb, kb, vb, attn_mask=bias))
    monkeypatch.setattr(packing, "BF16_ATTENTION_MAX_SCORES", 10)
    assert torch.equal(attend(qb, kb, vb, None, causal=False), F.scaled_dot_product_attention(qb, kb, vb))
