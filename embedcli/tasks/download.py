"""`embedcli download`: a Hub model into the standard cache, checked loadable (`embedcli.models.checkpoint.download` fetches)."""

from __future__ import annotations

import sys
from pathlib import Path

from embedcli.errors import ModelNotFoundError
from embedcli.models.checkpoint.download import (
    cached_snapshot,
    download_model,
    looks_like_repo_id,
    split_revision,
)
from embedcli.models.spec import load_model_spec


def fetch(model: str, revision: str | None = None, *, allow_pickle: bool = False, quiet: bool = False) -> Path:
    """`embedcli download`: the cached snapshot of a Hub model, downloading it first when missing; checked loadable."""
    repo, pinned = split_revision(model)
    if not looks_like_repo_id(repo):
        raise ModelNotFoundError(f"{model!r} is not a Hub model id (org/model[@revision])")
    revision = revision or pinned
    path = cached_snapshot(repo, revision)
    if path is not None:
        if not quiet:
            print(f"embedcli: {repo} is already in the cache: {path}", file=sys.stderr)
    else:
        path = download_model(repo, revision, allow_pickle=allow_pickle, quiet=quiet)
    load_model_spec(str(path), allow_pickle=allow_pickle)  # a folder embedcli can run, or a one-line error now
    return path
