"""JSONL and .npy outputs commit data and metadata as one (issue 13, item 5): the data first, then a sidecar
naming its sha256; a cut between the two never leaves metadata vouching for other bytes, and
`inspect --check` catches data its sidecar does not name. Also the commit protocol of every writer,
with a kill injected at each rename/fsync step."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from embedcli.io.writers import embedding_array, open_writer


def _corpus(path: Path, prefix: str, n: int = 6) -> Path:
    path.write_text("".join(json.dumps({"id": f"{prefix}{i}", "text": f"{prefix} text {i}"}) + "\n" for i in range(n)))
    return path


def _ids(out: Path) -> list[str]:
    if out.suffix == ".npy":
        return [json.loads(line) for line in Path(f"{out}.ids.jsonl").read_text().splitlines()]
    return [json.loads(line)["id"] for line in out.read_text().splitlines()]


@pytest.mark.parametrize("ext", [".jsonl", ".npy"])
def test_cut_between_data_and_sidecar_renames_reruns_to_todays_rows(
    cli, st_model: Path, tmp_path: Path, ext: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    out = tmp_path / f"out{ext}"
    cli("embed", _corpus(corpus, "old"), "-m", st_model, "-o", out, "-q")
    assert _ids(out)[0] == "old0"
    _corpus(corpus, "new")  # today's corpus, same size and row count

    finals = {str(out), f"{out}.meta.json"}
    real_replace = os.replace
    seen: list[str] = []

    def replace(src, dst, *a, **k):  # type: ignore[no-untyped-def]
        if str(dst) in finals:
            if seen:  # killed between the output's two renames, whichever comes first
                raise KeyboardInterrupt
            seen.append(str(dst))
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)
    cli("embed", corpus, "-m", st_model, "-o", out, "-q", code=130)
    monkeypatch.setattr(os, "replace", real_replace)
    assert cli("inspect", out, "--check", code=None).exit_code == 1  # neither old nor new is complete here

    r = cli("embed", corpus, "-m", st_model, "-o", out)
    assert "already complete" not in r.stderr
    assert _ids(out) == [f"new{i}" for i in range(6)]
    cli("inspect", out, "--check")


@pytest.mark.parametrize("ext", [".jsonl", ".npy"])
def test_inspect_check_catches_data_its_sidecar_does_not_name(
    cli, st_model: Path, tmp_path: Path, ext: str
) -> None:
    out = tmp_path / f"out{ext}"
    cli("embed", _corpus(tmp_path / "c.jsonl", "d"), "-m", st_model, "-o", out, "-q")
    cli("inspect", out, "--check")
    data = bytearray(out.read_bytes())
    at = len(data) - 20  # inside the last vector: same size, same row count, other bytes
    data[at] = ord("1") if data[at] != ord("1") else ord("2")
    out.write_bytes(bytes(data))
    r = cli("inspect", out, "--check", code=1)
    assert "sha256" in r.stdout + r.stderr


# --------------------------------------------------------------------------------------------------
# The commit protocol of each writer, cut at every rename/fsync


class _Killed(BaseException):
    """The process died here: nothing after it touches the filesystem."""


def _table(tag: int, n: int = 4) -> pa.Table:
    vectors = np.full((n, 3), float(tag), dtype=np.float32)
    return pa.table({"id": [f"r{tag}-{i}" for i in range(n)], "embedding": embedding_array(vectors)})


def _write(out: Path, tag: int) -> None:
    t = _table(tag)
    w = open_writer(str(out), t.schema, {"embedcli.run": str(tag), "embedcli.complete": "true"})
    w.write(t)
    w.commit()


def _state(out: Path) -> tuple[bytes | None, str | None, list[str]]:
    from embedcli.io.manifest import output_metadata
    from embedcli.io.sidecar import check_sidecar

    if not out.exists():
        return None, None, []
    meta = output_metadata(str(out)) or {}
    problems = check_sidecar(str(out), deep=True) if out.suffix != ".parquet" else []
    run = meta.get("embedcli.run") if meta.get("embedcli.complete") == "true" else None
    return out.read_bytes(), run, problems


def _steps(monkeypatch: pytest.MonkeyPatch, kill_at: int | None) -> Callable[[], int]:
    """Count os.replace/os.fsync calls; raise _Killed at call `kill_at`, then let nothing else happen."""
    calls = [0]
    dead = [False]
    real = {name: getattr(os, name) for name in ("replace", "fsync", "unlink", "rename")}

    def wrap(name: str):  # type: ignore[no-untyped-def]
        def step(*a, **k):  # type: ignore[no-untyped-def]
            if dead[0]:
                raise _Killed
            if name in ("replace", "fsync"):
                calls[0] += 1
                if calls[0] == kill_at:
                    dead[0] = True
                    raise _Killed
            return real[name](*a, **k)

        return step

    for name in real:
        monkeypatch.setattr(os, name, wrap(name))
    return lambda: calls[0]


@pytest.mark.parametrize("ext", [".parquet", ".jsonl", ".npy"])
def test_writer_commit_cut_at_every_step_leaves_old_or_new_never_mixed(
    tmp_path: Path, ext: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    _write(probe / f"o{ext}", 1)
    with monkeypatch.context() as m:
        count = _steps(m, None)
        _write(probe / f"o{ext}", 2)
        total = count()
    new_bytes = (probe / f"o{ext}").read_bytes()
    assert total >= 2
    for kill_at in range(1, total + 1):
        work = tmp_path / f"k{kill_at}"
        work.mkdir()
        out = work / f"o{ext}"
        _write(out, 1)
        old = _state(out)
        with monkeypatch.context() as m:
            _steps(m, kill_at)
            with pytest.raises(_Killed):
                _write(out, 2)
        data, run, problems = _state(out)
        if run is not None and not problems:  # what claims to be complete is exactly one run's output
            assert (data, run) in {(old[0], "1"), (new_bytes, "2")}, f"mixed output after a cut at step {kill_at}"
        _write(out, 2)  # a rerun commits the new output cleanly over whatever the cut left
        assert _state(out) == (new_bytes, "2", [])
