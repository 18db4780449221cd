"""Issue 22, poor errors: `--pair-template` takes plain `{name}` fields only; a format spec (`{query:>100000000}`
hangs rendering, `{query:{document}}` was a traceback) or a conversion is a one-line usage error (exit 2)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("template", ["{query:>100000000} {document}", "{query:{document}} {document}",
                                      "{query!r} {document}", "Q: {query}\\nD: {document:.3}"])
def test_format_specs_are_refused(template: str) -> None:
    from embedcli.cli.families import reranker_flags
    from embedcli.errors import UsageError

    with pytest.raises(UsageError, match="format spec or conversion"):
        reranker_flags(None, template, None, None)


def test_plain_fields_and_literal_braces_pass() -> None:
    from embedcli.cli.families import reranker_flags

    flags = reranker_flags("no,yes", "{{json}} Q: {query} D: {document} I: {instruction}", "x", None)
    assert flags is not None and flags.pair_template is not None


def test_the_cli_says_it_in_one_line_before_loading(cli, st_model, tmp_path):  # type: ignore[no-untyped-def]
    docs = tmp_path / "d.jsonl"
    docs.write_text('{"id": "a", "left": "q", "right": "d"}\n')
    result = cli("score", docs, "-m", st_model, "--pair-template", "{query:{document}}{document}",
                 "-o", tmp_path / "s.parquet", code=2)
    assert "Traceback" not in result.stderr and "format spec" in result.stderr
