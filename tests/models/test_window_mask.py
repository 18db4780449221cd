"""Sliding-window (banded) attention on the packed buffer, against a float64 per-sequence reference."""

from __future__ import annotations

import pytest
import torch

from embedcli.models.backbones.layers import varlen_attention
from embedcli.models.kernels import packing
from embedcli.models.kernels.packing import (
    PackInfo,
    banded,
    packed_attention,
    padded_bias,
    window_band,
)

# The last two hold groups long enough for the query-block path (`local_attention`), the others the dense band.
LENGTHS = [[11], [1, 13, 4], [6, 6], [20, 2, 17, 9], [70, 3, 66, 45], [101]]
WINDOWS = [(0, 0), (2, 3), (4, 0), (1, 6), (5, 5)]


def _reference(q, k, v, lengths, *, causal, window, scale, bias=None):  # type: ignore[no-untyped-def]
    """Each sequence alone in float64, query i attending keys j with i - left <= j <= i + right (j <= i if causal)."""
    left, right = window
    outs, start = [], 0
    groups = q.shape[1] // k.shape[1]
    for n in lengths:
        qs, ks, vs = (t[start : start + n].double().transpose(0, 1) for t in (q, k, v))
        ks, vs = ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0)
        scores = qs @ ks.transpose(1, 2) * scale
        if bias is not None:
            scores = scores + bias[0, :, :n, :n].double()
        allowed = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            for j in range(n):
                allowed[i, j] = (i - left <= j <= i + right) and (j <= i or not causal)
        scores = scores.masked_fill(~allowed, float("-inf"))
        outs.append((scores.softmax(-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(outs)


def _qkv(total: int, kv_heads: int, seed: int = 0):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(total, h, 8, generator=gen) for h in (4, kv_heads, kv_heads))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("lengths", LENGTHS)
def test_packed_attention_window_matches_float64(
    causal: bool, window: tuple[int, int], lengths: list[int], attention_kernel: str
) -> None:
    q, k, v = _qkv(sum(lengths), 2)
    got = packed_attention(q, k, v, PackInfo.build(lengths), causal=causal, scale=0.3, window=window)
    want = _reference(q, k, v, lengths, causal=causal, window=window, scale=0.3)
    assert got.isfinite().all()
    assert (got.double() - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize("window", [(3, 3), (0, 2)])
@pytest.mark.parametrize("lengths", LENGTHS)
def test_varlen_attention_fused_qkv_window(window: tuple[int, int], lengths: list[int], attention_kernel: str) -> None:
    heads, dim, total = 4, 8, sum(lengths)
    qkv = torch.randn(total, 3 * heads * dim, generator=torch.Generator().manual_seed(1))
    got = varlen_attention(qkv, PackInfo.build(lengths), heads, dim, window=window)
    q, k, v = (t.reshape(total, heads, dim) for t in qkv.split(heads * dim, dim=-1))
    want = _reference(q, k, v, lengths, causal=False, window=window, scale=dim**-0.5)
    assert (got.double() - want.reshape(total, heads * dim)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("lengths", [[1, 13, 4], [20, 2, 17, 9]])
def test_window_with_additive_bias(lengths: list[int]) -> None:
    """A relative-position bias (MPNet style) and a window together: both apply."""
    q, k, v = _qkv(sum(lengths), 4, seed=2)
    pack = PackInfo.build(lengths)
    bias = torch.randn(1, 4, pack.max_len, pack.max_len, generator=torch.Generator().manual_seed(3))
    got = packed_attention(q, k, v, pack, causal=False, scale=0.3, attn_bias=padded_bias(bias, pack), window=(2, 4))
    want = _reference(q, k, v, lengths, causal=False, window=(2, 4), scale=0.3, bias=bias)
    assert (got.double() - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths", LENGTHS)
def test_window_wider_than_every_sequence_is_the_unbanded_path(causal: bool, lengths: list[int], attention_kernel: str) -> None:
    q, k, v = _qkv(sum(lengths), 2, seed=4)
    pack = PackInfo.build(lengths)
    wide = max(lengths) - 1
    assert window_band((wide, wide), max(lengths), causal=causal, device=q.device) is None
    plain = packed_attention(q, k, v, pack, causal=causal, scale=0.3)
    assert torch.equal(packed_attention(q, k, v, pack, causal=causal, scale=0.3, window=(wide, wide)), plain)
    if causal:  # the right reach means nothing under a causal mask
        assert torch.equal(packed_attention(q, k, v, pack, causal=True, scale=0.3, window=(wide, 0)), plain)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths", [[20, 2, 17, 9], [70, 3, 66]])
def test_bf16_window_matches_float64(causal: bool, lengths: list[int], attention_kernel: str) -> None:
    """CPU bf16: the dense band goes to the batched matmuls as their boolean mask, query blocks to SDPA."""
    q, k, v = _qkv(sum(lengths), 2, seed=5)
    got = packed_attention(
        *(t.bfloat16() for t in (q, k, v)), PackInfo.build(lengths), causal=causal, scale=0.3, window=(3, 2)
    )
    want = _reference(q, k, v, lengths, causal=causal, window=(3, 2), scale=0.3)
    assert got.dtype == torch.bfloat16 and got.isfinite().all()
    assert (got.double() - want).abs().max().item() <= 3e-2


def test_negative_window_is_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        window_band((-1, 2), 5, causal=False, device=torch.device("cpu"))


def test_mistral_sliding_window_on_the_transformers_path(tiny_model, tmp_path) -> None:
    """A windowed Mistral falls back to transformers' modules; the packed attention keeps their window."""
    from transformers import AutoModel

    from embedcli.models.loader import LoadedModel, ModelOptions
    from embedcli.models.spec import load_model_spec
    from tests.fixtures.tiny_models import LONG_TEXT, SAMPLE_TEXTS, copy_model, edit_json

    folder = copy_model(tiny_model("mistral"), tmp_path / "mistral-window")
    edit_json(folder / "config.json", lambda c: c.update(sliding_window=6))
    loaded = LoadedModel(load_model_spec(str(folder)), ModelOptions(device="cpu", dtype="float32", backbone="auto"))
    assert not loaded.own_backbone
    reference = AutoModel.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32).eval()
    ids = [loaded.tokenizer.encode(t).ids for t in (*SAMPLE_TEXTS, LONG_TEXT[:120])]
    assert max(len(x) for x in ids) > 30
    hidden = loaded.forward_packed(torch.tensor([t for x in ids for t in x]), [len(x) for x in ids])
    worst = 0.0
    for seq, got in zip(ids, torch.split(hidden, [len(x) for x in ids]), strict=True):
        with torch.inference_mode():
            want = reference(input_ids=torch.tensor([seq])).last_hidden_state[0]
        worst = max(worst, (got - want).abs().max().item())
    assert worst <= 1e-4


def test_padded_query_rows_keep_a_key() -> None:
    """Far from its sequence's real tokens a pad row's band holds none: it keeps the real keys (no NaN row)."""
    pack = PackInfo.build([12, 2])
    band = window_band((1, 1), pack.max_len, causal=False, device=torch.device("cpu"))
    assert band is not None and pack.key_mask is not None

    mask = banded(pack.key_mask, band, pack.key_mask)
    assert mask.shape == (2, 1, 12, 12) and bool(mask.any(-1).all())
    assert torch.equal(mask[1, 0, 5], pack.key_mask[1, 0, 0])  # a pad row of the short sequence
    assert mask[1, 0, 1].tolist() == [True, True] + [False] * 10  # a real row: its band and real keys only


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(2, 3), (4, 0), (0, 0), (9, 9)])
def test_long_groups_run_in_query_blocks(causal: bool, window: tuple[int, int], monkeypatch, torch_attention) -> None:
    """Groups many windows long take the blockwise path, and it equals the dense band to float32 rounding."""
    lengths = [90, 4, 83, 60, 1]
    q, k, v = _qkv(sum(lengths), 2, seed=7)
    pack = PackInfo.build(lengths)
    calls: list[int] = []
    blocked = packing.local_attention
    monkeypatch.setattr(packing, "local_attention", lambda *a, **kw: calls.append(a[0].shape[2]) or blocked(*a, **kw))
    got = packed_attention(q, k, v, pack, causal=causal, scale=0.3, window=window)
    assert calls and max(calls) == 90
    monkeypatch.setattr(packing, "LOCAL_BLOCKS_MIN_RATIO", 10**6)  # the dense band everywhere
    before = len(calls)
    dense = packed_attention(q, k, v, pack, causal=causal, scale=0.3, window=window)
    assert len(calls) == before
    want = _reference(q, k, v, lengths, causal=causal, window=window, scale=0.3)
    assert (got.double() - want).abs().max().item() <= 1e-5
    assert (got - dense).abs().max().item() <= 2e-6


def test_query_blocks_with_key_padding_and_gqa() -> None:
    """`local_attention` on a padded view directly: pad keys never seen, kv heads shared."""
    gen = torch.Generator().manual_seed(8)
    lens = [57, 40]
    q = torch.randn(2, 4, 57, 8, generator=gen)
    k, v = torch.randn(2, 2, 57, 8, generator=gen), torch.randn(2, 2, 57, 8, generator=gen)
    key_mask = (torch.arange(57)[None, :] < torch.tensor(lens)[:, None])[:, None, None, :]
    got = packing.local_attention(q, k, v, key_mask, (3, 5), scale=0.3)
    assert got.shape == q.shape
    for b, n in enumerate(lens):
        flat = [t[b, :, :n].transpose(0, 1) for t in (q, k, v)]
        want = _reference(*flat, [n], causal=False, window=(3, 5), scale=0.3)
        assert (got[b, :, :n].transpose(0, 1).double() - want).abs().max().item() <= 1e-5
