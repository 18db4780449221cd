"""One `embed` run resolves its model once: every weight file is hashed exactly once (minutes on a 7B model)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest


@pytest.mark.parametrize("extra", [(), ("--precision", "int8")])
def test_embed_hashes_each_weight_file_once(cli, st_model: Path, tmp_path: Path, monkeypatch, extra) -> None:  # type: ignore[no-untyped-def]
    import embedcli.models.spec as spec_module

    hashed: Counter[str] = Counter()
    real = spec_module._hash_files

    def counting(folder: Path, names: list[str]) -> str:
        hashed.update(names)
        return real(folder, names)

    monkeypatch.setattr(spec_module, "_hash_files", counting)
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "one"}\n{"id": "b", "text": "two words"}\n', encoding="utf-8")
    cli("embed", src, "-m", st_model, "-o", tmp_path / "out.parquet", "-q", *extra)
    assert hashed and set(hashed.values()) == {1}, hashed
