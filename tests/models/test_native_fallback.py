"""Without the compiled kernels (installed without a compiler, another architecture, a CPU without AVX2 or AVX-512) the own
backbones take their torch paths and compute the same numbers as with them, and as transformers."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from embedcli.models import kernels
from embedcli.models.kernels import fused_attention, fused_norm, native
from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.spec import load_model_spec
from tests.fixtures.tiny_models import LONG_TEXT, SAMPLE_TEXTS

TEXTS = (*SAMPLE_TEXTS, LONG_TEXT[:300], "fox")


@contextmanager
def _without_kernels(how: str) -> Iterator[None]:
    """`native` as a build without `_cpu` (its import fails, as after an install without a compiler), or as a CPU
    whose cpuid lacks the kernels' instructions (the extension imports but says it cannot run)."""
    with pytest.MonkeyPatch.context() as mp:
        if how == "not built":
            # `from embedcli.models.kernels import _cpu` reads the package's attribute first, then sys.modules,
            # where None makes the import raise ImportError.
            mp.delattr(kernels, "_cpu", raising=False)
            mp.setitem(sys.modules, "embedcli.models.kernels._cpu", None)
            importlib.reload(native)
        else:
            mp.setattr(native, "_SUPPORTED", (False, False))
        try:
            assert not native.available(torch.float32) and not native.available(torch.bfloat16)
            if how == "not built":
                assert native._cpu is None
            yield
        finally:
            mp.undo()
            if how == "not built":
                importlib.reload(native)


def _forward(
    folder: Path, texts: tuple[str, ...], dtype: str = "float32"
) -> tuple[list[list[int]], list[torch.Tensor], int]:
    """Each text's token ids and last hidden states from one packed forward of the own backbone, and how many calls
    reached the compiled kernels."""
    loaded = LoadedModel(load_model_spec(str(folder)), ModelOptions(device="cpu", dtype=dtype, backbone="own"))
    assert loaded.own_backbone
    calls = 0
    kernels = {"attention": fused_attention.attention, "add_layer_norm": fused_norm.add_layer_norm}

    def counted(fn: Callable[..., object]) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            nonlocal calls
            calls += 1
            return fn(*args, **kwargs)

        return call

    ids = [loaded.tokenizer.encode(t.strip()).ids for t in texts]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fused_attention, "attention", counted(kernels["attention"]))
        mp.setattr(fused_norm, "add_layer_norm", counted(kernels["add_layer_norm"]))
        with torch.inference_mode():
            hidden = loaded.forward_packed(torch.tensor([t for s in ids for t in s]), [len(s) for s in ids])
    return ids, [h.float() for h in torch.split(hidden, [len(s) for s in ids])], calls


@pytest.mark.parametrize("how", ["not built", "unsupported CPU"])
@pytest.mark.parametrize("name", ["bert", "mpnet", "qwen3"])
def test_torch_paths_match_the_kernels_and_transformers(name: str, how: str, tiny_model, tiny_reference) -> None:  # type: ignore[no-untyped-def]
    folder = tiny_model(name)
    with _without_kernels(how):
        ids, fallback, calls = _forward(folder, TEXTS)
    assert calls == 0, "a compiled kernel ran while the extension was off"
    reference = tiny_reference(name)
    for seq, got in zip(ids, fallback, strict=True):
        with torch.inference_mode():
            want = reference(input_ids=torch.tensor([seq])).last_hidden_state[0]
        assert (got - want).abs().max().item() <= 1e-5
    if native.available(torch.float32):  # and, where this build and CPU have them, the kernels agree
        _, fused, calls = _forward(folder, TEXTS)
        assert calls > 0
        assert max((f - g).abs().max().item() for f, g in zip(fused, fallback, strict=True)) <= 1e-5


@pytest.mark.parametrize("name", ["bert", "mpnet"])
def test_bf16_runs_without_the_kernels(name: str, tiny_model) -> None:  # type: ignore[no-untyped-def]
    """bf16 autocast on the torch paths: no kernel call, and close to float32 (the roundings differ from the
    kernels', so only within bf16's precision)."""
    folder = tiny_model(name)
    with _without_kernels("not built"):
        _, low, calls = _forward(folder, TEXTS, "bfloat16")
        _, full, _ = _forward(folder, TEXTS)
    assert calls == 0
    for a, b in zip(low, full, strict=True):
        cos = torch.nn.functional.cosine_similarity(a.mean(0), b.mean(0), dim=0).item()
        assert cos >= 0.999, cos


def _cpu_flags() -> set[str]:
    """This CPU's feature flags as Linux reports them (empty where there is no /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@pytest.mark.skipif(native._cpu is None or not _cpu_flags(), reason="the kernels are not built, or no /proc/cpuinfo")
def test_float32_kernels_run_wherever_the_cpu_has_avx2_and_fma() -> None:
    flags = _cpu_flags()
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        want = "avx512"
    else:
        want = "avx2" if {"avx2", "fma"} <= flags else "none"
    assert native.float32_isa() == want
    assert native.available(torch.float32) == (want != "none")
    assert native.available(torch.bfloat16) == ("avx512_bf16" in flags and want == "avx512")
    if want == "avx512":  # the AVX2 code on request (the kernel tests run it there too)
        try:
            assert native.use_avx2(True) == "avx2"
        finally:
            native.use_avx2(False)
