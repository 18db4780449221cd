"""Flag values passed through without typer's pydantic coercion are exactly what that coercion returns; any other
value still goes through it (its result and its refusal)."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from typer import _coercion
from typer.models import OptionInfo

from embedcli.cli.coercion import _COERCE, as_is

CASES: list[tuple[Any, dict[str, Any], Any]] = [
    (str, {}, "text"), (str, {}, ""), (str, {}, " spaced "), (int, {}, 8), (int, {}, 0), (float, {}, 2.5),
    (float, {}, -0.0), (list[str], {}, ("a.jsonl", "b.jsonl")), (list[str], {}, ["x"]), (list[str], {}, ()),
    (Literal["right", "left"], {}, "left"), (Literal["truncate", "error", "chunk"], {}, "chunk"),
]
COERCED: list[tuple[Any, dict[str, Any], Any]] = [
    (int, {}, "8"), (int, {}, True), (float, {}, 2), (float, {}, "2.5"), (int, {"min": 1}, 3), (int, {"max": 9}, 3),
    (list[str], {}, ("a", 1)), (list[int], {}, ("1",)), (Literal["right", "left"], {}, "LEFT"),
    (Literal["right", "left"], {"case_sensitive": False}, "left"), (Literal["right", "left"], {}, "up"),
    (bool, {}, "true"), (str, {"parser": str.upper}, "x"),
]


def coerced(annotation: Any, options: dict[str, Any], value: Any) -> Any:
    """typer's own coercion of `value` (the reference), or the exception it raises."""
    info = OptionInfo(**options)
    descriptor = _coercion.resolve_type_descriptor(annotation, info)
    try:
        return _coercion.build_runtime_param(descriptor)._coerce_value(value, param=None, ctx=None)
    except Exception as e:
        return type(e)


@pytest.mark.parametrize(("annotation", "options", "value"), CASES)
def test_passed_through_values_are_what_typer_returns(annotation: Any, options: dict[str, Any], value: Any) -> None:
    got = as_is(annotation, OptionInfo(**options), value, None)
    want = coerced(annotation, options, value)
    assert got is not _COERCE
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize(("annotation", "options", "value"), COERCED)
def test_other_values_go_to_typer(annotation: Any, options: dict[str, Any], value: Any) -> None:
    assert as_is(annotation, OptionInfo(**options), value, None) is _COERCE
