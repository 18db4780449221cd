"""Flag values that need no coercion pass through as they are, so that most runs never import pydantic.

typer (0.2x) coerces every parameter's value through a pydantic `TypeAdapter` built on first use: importing
pydantic and its plugin loader costs ~0.1-0.2 s and building embed's adapters ~40 ms, a quarter of a static model's
one-row run. For the values below pydantic returns the value itself (a list for a list), so they skip it: a `str`
for `str`, an `int` for `int` and a `float` for `float` without bounds, a `str` that is one of a case-sensitive
`Literal`'s choices, a list or tuple of `str` for `list[str]`; `None` never reaches coercion. Any other value (`"8"`
for `--threads`, a choice in another case, a parser, bounds, files) takes typer's own path, pydantic included,
with its messages. Where typer has no such hook (another version), nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

_COERCE = object()  # "this value needs typer's coercion"


def as_is(annotation: Any, info: Any, value: Any, ctx: Any) -> Any:
    """`value` when typer's pydantic coercion would return it unchanged (a list for a list), else `_COERCE`."""
    if getattr(info, "parser", None) is not None:
        return _COERCE
    if annotation is str and type(value) is str:
        return value
    if annotation in (int, float) and type(value) is annotation:
        return value if getattr(info, "min", None) is None and getattr(info, "max", None) is None else _COERCE
    origin = get_origin(annotation)
    if origin is list and get_args(annotation) == (str,) and isinstance(value, (list, tuple)):
        return list(value) if all(type(v) is str for v in value) else _COERCE
    if origin is Literal and type(value) is str and value in get_args(annotation):
        exact = getattr(info, "case_sensitive", False) and getattr(ctx, "token_normalize_func", None) is None
        return value if exact else _COERCE
    return _COERCE


def install() -> None:
    """Put the pass-through in front of typer's coercion, where this typer version has the hook."""
    try:
        from typer import _coercion, core
    except ImportError:
        return
    param_cls = getattr(core, "_TyperParameter", None)
    base = getattr(_coercion, "RuntimeParam", None)
    build = getattr(_coercion, "build_runtime_param", None)
    if param_cls is None or base is None or build is None or not hasattr(param_cls, "get_runtime_param"):
        return
    if getattr(param_cls, "_embedcli_as_is", False):
        return
    make: Any = build

    @dataclass(frozen=True)
    class AsIs(base):  # type: ignore[misc,valid-type]  # typer's RuntimeParam is untyped (a private module)
        """typer's runtime coercion of one parameter, with the pass-through in front."""

        descriptor: Any = None
        real: list[Any] = field(default_factory=list)

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            kept = as_is(self.annotation, self.parameter_info, value, ctx)
            if kept is not _COERCE:
                return kept
            if not self.real:
                self.real.append(make(self.descriptor))
            return self.real[0]._coerce_value(value, param, ctx)

    def get_runtime_param(self: Any) -> Any:
        descriptor = self.type_descriptor
        if self._runtime_param is None and descriptor.file_annotation is None:
            self._runtime_param = AsIs(descriptor.parameter_info, descriptor.annotation, descriptor)
        return original(self)

    original = param_cls.get_runtime_param
    param_cls.get_runtime_param = get_runtime_param
    param_cls._embedcli_as_is = True
