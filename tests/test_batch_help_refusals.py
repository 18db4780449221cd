"""Issue 22, poor errors: run-batch's refusal of `embed_dtype: bfloat16` is said where users look (`--help` and
the README), not only in a docstring."""

from __future__ import annotations

from pathlib import Path


def test_run_batch_help_and_readme_name_the_refused_fields(cli) -> None:  # type: ignore[no-untyped-def]
    text = " ".join(cli("run-batch", "--help", env={"COLUMNS": "200"}).stdout.split())
    assert "bfloat16" in text and "add_special_tokens: false" in text
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert "`embed_dtype` other than `float32` / `float16` (`bfloat16`, fp8)" in readme
