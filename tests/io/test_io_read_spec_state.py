"""`ReadSpec.state` (the readers' types in every read point) is serialized once per state, not at every file's
end, and still follows each change of the types."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest


@pytest.mark.parametrize("steps", [
    [],
    [("id", pa.string())],
    [("id", pa.string()), ("kept", ("a", pa.int64()))],
    [("id", pa.string()), ("kept", ("a", pa.int64())), ("null", "b"), ("id", pa.int64())],
])
def test_a_read_spec_s_state_follows_its_types(steps: list[tuple[str, Any]]) -> None:
    """`ReadSpec.state` is serialized once per state: each change of the types shows in the next one."""
    from embedcli.io.positions import type_state
    from embedcli.io.reader_base import ReadSpec

    spec = ReadSpec("text", "id", False, ("a", "b"), (), 8, None)
    assert spec.state() == type_state(None, {}, set())
    for kind, value in steps:
        if kind == "id":
            spec.id_type = value
        elif kind == "kept":
            spec.kept_types[value[0]] = value[1]
        else:
            spec.kept_types[value] = pa.string()
            spec.null_kept.add(value)
        assert spec.state() == type_state(spec.id_type, spec.kept_types, spec.null_kept)
    first = spec.state()
    first["null_kept"].append("mutated")
    assert spec.state() == type_state(spec.id_type, spec.kept_types, spec.null_kept)
