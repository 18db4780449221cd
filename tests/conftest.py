"""Session-wide fixtures: tiny random models on disk (see `tests/fixtures/tiny_models.py`)."""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

# `tests.fixtures.tiny_models` is imported by package path: put the repository root on sys.path so it
# resolves under a plain `pytest` too (pytest's default rootdir-less "prepend" mode only adds tests/).
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `auto` dtype decisions and ONNX exports go to a throwaway user cache, never the developer's own.
os.environ.setdefault("EMBEDCLI_CACHE_DIR", tempfile.mkdtemp(prefix="embedcli-test-cache-"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`tiny_model(name) -> Path`: a tiny seeded random model folder, built once per session on first use.

    Names: the architectures bert, roberta, xlm-roberta, distilbert, mpnet (encoders) and llama,
    mistral, qwen2, qwen3 (decoders, saved as *ForCausalLM); sentence-transformers layouts bert-st,
    mpnet-st (classic layout: mean pooling, Normalize, max_seq_length 64), bert-st-dense (+ Dense
    32->16 Tanh), bert-st-cls (CLS, no Normalize), and bert-st6 / mpnet-st6 / bert-st6-dense (saved
    by sentence-transformers 6 itself: new module names, max length in tokenizer_config.json). Treat the folders as read-only; copy to break one.
    """
    from transformers.utils import logging as hf_logging

    from tests.fixtures.tiny_models import build_named

    hf_logging.set_verbosity_error()
    root = tmp_path_factory.mktemp("tiny_models")
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = build_named(name, root, get)
        return built[name]

    return get


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model: Callable[[str], Path]):  # type: ignore[no-untyped-def]
    """`tiny_loaded(name) -> LoadedModel` on CPU in float32, loaded once per session."""
    from embedcli.models.loader import LoadedModel, ModelOptions
    from embedcli.models.spec import load_model_spec

    loaded: dict[str, LoadedModel] = {}

    def get(name: str) -> LoadedModel:
        if name not in loaded:
            spec = load_model_spec(str(tiny_model(name)))
            loaded[name] = LoadedModel(spec, ModelOptions(device="cpu", dtype="float32"))
        return loaded[name]

    return get


@pytest.fixture(scope="session")
def tiny_reference(tiny_model: Callable[[str], Path]):  # type: ignore[no-untyped-def]
    """`tiny_reference(name) -> transformers model` (AutoModel, eager attention, float32, eval)."""
    import torch
    from transformers import AutoModel

    models: dict[str, torch.nn.Module] = {}

    def get(name: str) -> torch.nn.Module:
        if name not in models:
            model = AutoModel.from_pretrained(str(tiny_model(name)), attn_implementation="eager", dtype=torch.float32)
            models[name] = model.eval()
        return models[name]

    return get


@pytest.fixture
def torch_single_thread():  # type: ignore[no-untyped-def]
    """One intra-op torch thread for the test, restored afterwards (other suites pick their own count).

    Tiny forwards gain nothing from threads, and on a small, busy CI box OpenMP barriers stall for
    ~100 ms per op when a worker thread is descheduled (a 100x slowdown measured on 2 cores).
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def st_model(tiny_model: Callable[[str], Path]) -> Path:
    """The tiny sentence-transformers model (BERT 2x32, mean pooling, Normalize, max 64 tokens)."""
    return tiny_model("bert-st")


@pytest.fixture
def cli(torch_single_thread):  # type: ignore[no-untyped-def]
    """`cli(*args, code=0) -> Result`: `embedcli ARGS` in-process, float32; checks the exit code."""
    from typer.testing import CliRunner

    from embedcli.cli import app

    runner = CliRunner()

    def invoke(*args: object, code: int | None = 0, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
        result = runner.invoke(app, [str(a) for a in args], env={"EMBEDCLI_DTYPE": "float32", **(env or {})})
        if code is not None and result.exit_code != code:
            tb = ""
            if result.exc_info and not isinstance(result.exception, SystemExit):
                tb = "".join(traceback.format_exception(*result.exc_info))
            raise AssertionError(f"exit {result.exit_code} != {code}\nstdout: {result.stdout}\nstderr: {result.stderr}\n{tb}")
        return result

    return invoke
