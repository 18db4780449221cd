"""Issue 22 build: `merge` follows every command's -o rule: a file embedcli never wrote, or an output of another
config, is not replaced (exit 2) unless --force; the same merge again replaces its own output."""

from __future__ import annotations

import json


def test_merge_leaves_an_output_made_otherwise_alone(cli, st_model, tmp_path):  # type: ignore[no-untyped-def]
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": i, "text": f"text {i}"}) + "\n" for i in range(6)))
    parts = tmp_path / "parts"
    parts.mkdir()
    for k in range(2):
        cli("embed", docs, "-m", st_model, "-o", parts / f"v-{k}.parquet", "--shard", f"{k}/2", "-q")
    foreign = tmp_path / "merged.parquet"
    foreign.write_bytes(b"someone else's file\n")
    result = cli("merge", parts, "-o", foreign, "-q", code=2)
    assert "not written by embedcli" in result.stderr and foreign.read_bytes() == b"someone else's file\n"
    other = tmp_path / "other.parquet"
    cli("embed", docs, "-m", st_model, "-o", other, "--no-normalize", "-q")
    before = other.read_bytes()
    result = cli("merge", parts, "-o", other, "-q", code=2)
    assert "different config" in result.stderr and other.read_bytes() == before
    cli("merge", parts, "-o", foreign, "-q", "--force")
    cli("merge", parts, "-o", foreign, "-q")  # its own output: replaced without --force
