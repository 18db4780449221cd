"""Fetch a model from the Hugging Face Hub into the standard cache (`huggingface_hub`), safetensors only.

Only what embedcli runs is fetched: configs, tokenizer files and safetensors weights. Pickle weights
(`*.bin`, `*.pt`, ...) are skipped (but BGE-M3's two head files, read tensors-only); with `allow_pickle` they are fetched only in folders that have no
safetensors (a repo usually ships both). ONNX, OpenVINO, TF, Flax and other runtimes' files are never fetched.
The cache lookup (`cached_snapshot`) asks for the same files, so a snapshot fetched here is found offline.
Progress goes to stderr (huggingface_hub's bars; `HF_HUB_DISABLE_PROGRESS_BARS=1` silences them).
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
import sys
from pathlib import Path

from embedcli.errors import ModelConfigError, ModelNotFoundError
from embedcli.models.checkpoint.m3 import M3_HEAD_FILES

UNUSED_PATTERNS: tuple[str, ...] = (
    "*.onnx", "*.onnx_data", "onnx/*", "openvino/*", "*.msgpack", "*.h5", "*.ot", "*.tflite", "*.gguf",
    "coreml/*", "tf_model*", "flax_model*", "rust_model*", "*.mlmodel",
)
PICKLE_PATTERNS: tuple[str, ...] = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")
_TRUE = {"1", "ON", "YES", "TRUE"}


def hub_disabled() -> bool:
    """Whether the user turned the Hub off: `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`), as huggingface_hub reads it."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in _TRUE


def split_revision(name: str) -> tuple[str, str | None]:
    """`org/model@rev` → (`org/model`, `rev`); no `@`: (name, None)."""
    repo, sep, revision = name.partition("@")
    return (repo, revision or None) if sep else (name, None)


def looks_like_repo_id(name: str) -> bool:
    """`org/model` (one slash, not a path): a Hub model id."""
    repo, _ = split_revision(name)
    parts = repo.split("/")
    return len(parts) == 2 and all(parts) and not repo.startswith((".", "~")) and not os.path.isabs(repo)


def _matches(path: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(path, p) for p in patterns)


def select_files(paths: list[str], allow_pickle: bool = False) -> list[str]:
    """The files of a repo listing that embedcli needs (see the module docstring)."""
    useful = [p for p in paths if not _matches(p, UNUSED_PATTERNS)]
    with_safetensors = {posixpath.dirname(p) for p in useful if p.endswith(".safetensors")}
    chosen = []
    for p in useful:
        if p in M3_HEAD_FILES:  # BGE-M3's heads: read with torch.load(weights_only=True), never the full unpickler
            chosen.append(p)
            continue
        if _matches(p, PICKLE_PATTERNS) and (not allow_pickle or posixpath.dirname(p) in with_safetensors):
            continue
        chosen.append(p)
    return chosen


def exact_pattern(name: str) -> str:
    """An `allow_patterns` entry (an fnmatch glob) that matches the file `name` and nothing else."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def check_names(repo_id: str, paths: list[str]) -> None:
    """ModelConfigError when a listed file name would land outside the snapshot folder (`..`, absolute, `\\`):
    refused before anything is fetched, so no partial snapshot is left."""
    for p in paths:
        parts = p.split("/")
        if not p or p.startswith("/") or "\\" in p or any(part in ("", ".", "..") for part in parts):
            raise ModelConfigError(
                f"{repo_id}: the Hub lists a file named {p!r}, which would be written outside the model folder; "
                "refused (nothing was downloaded): check the repository"
            )


def cached_snapshot(repo_id: str, revision: str | None = None) -> Path | None:
    """The complete cached snapshot of `repo_id` at `revision` (default `main`), or None; never the network."""
    try:
        from huggingface_hub import constants

        # No cache folder for the repo, no snapshot: answer without importing the Hub client (~0.1 s of
        # every start when the model is a packaged or local one).
        if not (Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}").is_dir():
            return None
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True,
                                      ignore_patterns=[*UNUSED_PATTERNS, *PICKLE_PATTERNS]))
    except Exception:
        return None


def download_model(repo_id: str, revision: str | None = None, *, allow_pickle: bool = False, quiet: bool = False) -> Path:
    """Download `repo_id` at `revision` (a branch, tag or commit; default `main`) into the standard cache.

    Returns the snapshot folder. ModelNotFoundError when the Hub is disabled, unreachable, or has no such
    model or revision; a ModelConfigError when the repo has only pickle weights and `allow_pickle` is off.
    """
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
    from huggingface_hub.hf_api import RepoFile

    if hub_disabled():
        raise ModelNotFoundError(f"{repo_id}: not in the local cache and HF_HUB_OFFLINE is set; unset it to download, "
                                 "or run `embedcli download` where the Hub is reachable")
    where = constants.ENDPOINT
    api = HfApi()
    try:
        info = api.model_info(repo_id, revision=revision)
        files = [f.path for f in api.list_repo_tree(repo_id, revision=info.sha, recursive=True) if isinstance(f, RepoFile)]
    except RevisionNotFoundError as e:
        raise ModelNotFoundError(f"{repo_id}: no revision {revision!r} on {where}") from e
    except RepositoryNotFoundError as e:
        raise ModelNotFoundError(f"{repo_id}: no such model on {where} (or it is private or gated)") from e
    except Exception as e:  # HTTP errors, httpx connect/timeout errors: no usable Hub
        raise ModelNotFoundError(f"{repo_id}: the Hub at {where} could not be reached ({type(e).__name__}: {e})") from e
    check_names(repo_id, files)
    chosen = select_files(files, allow_pickle)
    if not any(p.endswith(".safetensors") for p in chosen) and not (allow_pickle and any(_matches(p, PICKLE_PATTERNS) for p in chosen)):
        pickled = [p for p in files if _matches(p, PICKLE_PATTERNS)]
        if pickled:
            raise ModelConfigError(
                f"{repo_id}: only pickle weights ({', '.join(pickled[:3])}) on the Hub; loading pickle can run "
                "arbitrary code. Pass --allow-pickle if you trust the source."
            )
        raise ModelConfigError(f"{repo_id}: no safetensors weights on the Hub (files: {', '.join(files[:8])})")
    if quiet:
        from huggingface_hub.utils.tqdm import disable_progress_bars

        disable_progress_bars()
    else:
        print(f"embedcli: downloading {repo_id}@{info.sha} ({len(chosen)} files) from {where}", file=sys.stderr)
    try:
        # Exact names, not globs: a listed file named `*` must not fetch every file (pickle weights included).
        path = Path(snapshot_download(repo_id, revision=revision, allow_patterns=[exact_pattern(p) for p in chosen]))
    except (HfHubHTTPError, OSError) as e:
        raise ModelNotFoundError(f"{repo_id}: the download from {where} failed ({type(e).__name__}: {e})") from e
    if not quiet:
        print(f"embedcli: {repo_id}@{info.sha} -> {path}", file=sys.stderr)
    return path
