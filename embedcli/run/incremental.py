"""`--incremental`: rows whose key (BLAKE2b of id and texts) is in the previous output are carried over."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.errors import UsageError
from embedcli.io.manifest import KEY_CONFIG, KEY_INPUT_OPTIONS, KEY_MODEL, output_metadata
from embedcli.io.previous import PreviousOutput
from embedcli.io.shards import row_keys
from embedcli.io.writers import output_format
from embedcli.run.checks import Work
from embedcli.run.flags import RunFlags
from embedcli.run.source import id_column, id_type_of, kept_columns, subset

# The flag behind each resolved config and input option, for naming what changed between two runs.
CONFIG_FLAGS = {
    "task": "command",
    "pooling": "pooling",
    "normalize": "--normalize/--no-normalize",
    "dimensions": "--dimensions",
    "max_length": "--max-length",
    "long_inputs": "--long-inputs",
    "truncation_side": "--truncation-side",
    "strip": "--strip/--no-strip",
    "prompt": "--prompt/--prompt-name",
    "dtype": "--dtype",
    "quantize": "--quantize",
    "model_config_hash": "model config",
    "precision": "--precision",
    "text_col": "--text-col",
    "id_col": "--id-col",
    "keep_cols": "--keep-cols",
    "extra_text_cols": "text columns",
    "pair_col": "--pair-col",
    "format": "--format",
}


def _json(value: str | None) -> dict[str, Any] | None:
    try:
        loaded = json.loads(value) if value else None
    except ValueError:
        return None
    return loaded if isinstance(loaded, dict) else None


def _shown(value: Any) -> str:
    if value is None:
        return "(default)"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "(none)"
    if isinstance(value, str):
        return repr(value) if value == "" or value != value.strip() or " " in value else value
    return json.dumps(value, default=str)


def config_changes(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """Each setting that differs between two outputs' metadata, as `--flag: old → new`."""
    changes = []
    if old.get("embedcli.model") != new.get("embedcli.model"):
        changes.append(f"-m/--model: {old.get('embedcli.model')} → {new.get('embedcli.model')}")
    elif old.get(KEY_MODEL) != new.get(KEY_MODEL):
        changes.append(f"the model's files changed (content hash {old.get(KEY_MODEL)} → {new.get(KEY_MODEL)})")
    made_by = [_json(m.get("embedcli.config")) or {} for m in (old, new)]
    for name in ("command", "task"):
        if made_by[0].get(name) != made_by[1].get(name):  # another command's output: its settings do not compare
            return [*changes, f"made by another command ({name}: {_shown(made_by[0].get(name))} → "
                              f"{_shown(made_by[1].get(name))})"]
    for key in ("embedcli.config", KEY_INPUT_OPTIONS):
        before, after = _json(old.get(key)), _json(new.get(key))
        if before is None or after is None:
            if old.get(key) != new.get(key) and key == KEY_INPUT_OPTIONS:
                changes.append(f"input options: {old.get(key)} → {new.get(key)}")
            continue
        for name in sorted(set(before) | set(after), key=lambda n: (n not in CONFIG_FLAGS, n)):
            if before.get(name) != after.get(name):
                flag = CONFIG_FLAGS.get(name, name)
                changes.append(f"{flag}: {_shown(before.get(name))} → {_shown(after.get(name))}")
    if not changes and old.get(KEY_CONFIG) != new.get(KEY_CONFIG):
        changes.append(f"config hash {old.get(KEY_CONFIG)} → {new.get(KEY_CONFIG)}")
    return changes


def describe_config_change(old: dict[str, str], new: dict[str, str]) -> str:
    """What differs between two outputs' metadata, by flag (`--dtype: bfloat16 → float32`)."""
    return "; ".join(config_changes(old, new)) or "--output-format or an output option differs"


def open_previous(
    flags: RunFlags,
    in_place: str | None,
    existing: dict[str, str] | None,
    meta: dict[str, str],
    base_meta: dict[str, str],
    note: Callable[[str], None],
) -> PreviousOutput | None:
    """The output to carry rows over from (`--previous`, else `in_place`), or None: compute every row."""
    if not flags.incremental:
        return None
    path = flags.previous or in_place
    if path is None:
        note("--incremental: no previous output yet, computing every row")
        return None
    if flags.previous is None and existing is None:
        note(f"--incremental: {path} has no embedcli metadata, computing every row")
        return None
    if not os.path.isdir(path) and os.path.exists(path) and output_format(path, None, reading=True) != "parquet":
        note(f"--incremental carries rows over from Parquet outputs only; {path} is not: computing every row")
        return None
    old = output_metadata(path) if os.path.exists(path) else None
    if old is not None and (old.get(KEY_CONFIG) != meta.get(KEY_CONFIG) or old.get(KEY_MODEL) != meta.get(KEY_MODEL)):
        if flags.overwrite:
            note(f"--incremental: {path} was made with a different config; --overwrite: computing every row")
            return None
        raise UsageError(
            f"--incremental: {path} was made with a different config ({describe_config_change(old, base_meta)}); "
            "its rows cannot be carried over. Pass --overwrite to compute every row"
        )
    previous = PreviousOutput.open(path)
    if not previous.keys_ok:
        name = os.path.basename(path)
        note(f"--incremental: {path} has no valid row index ({name}.embedcli-index.parquet): computing every row")
        previous.close()
        return None
    return previous


class Carry:
    """Splits work items' rows read into rows to compute and rows to carry over by row key, and builds the
    rows carried over with this run's id and kept columns; with `previous` None every row is computed."""

    def __init__(self, previous: PreviousOutput | None, keep_cols: list[str]) -> None:
        self.previous = previous
        self.keep_cols = keep_cols

    def split(self, work: Work) -> None:
        """Keys of the rows read; which to compute and which to carry over from the previous output."""
        b = work.batch
        if b is None:
            return
        work.keys = row_keys(b.ids, b.texts, b.extra_texts)
        n = len(b)
        if self.previous is None or n == 0:
            work.compute_idx = np.arange(n, dtype=np.int64)
            work.compute = b
            return
        prev_rows = self.previous.lookup(work.keys)
        hit = prev_rows >= 0
        work.compute_idx = np.nonzero(~hit)[0]
        work.carry_idx = np.nonzero(hit)[0]
        work.carry_rows = prev_rows[hit]
        work.compute = subset(b, work.compute_idx) if len(work.compute_idx) else None

    def by_reference(self, batch: Any) -> bool:
        """Whether rows carried over by row key equal the previous output's rows as they are (no kept columns
        of this run's to put in, the same id type), so a sink may keep them as references."""
        prev = self.previous
        if prev is None or self.keep_cols or prev.keep_cols or "id" not in prev.schema.names:
            return False
        return bool(prev.schema.field("id").type.equals(id_type_of(batch)))

    def carried(self, work: Work, rows: np.ndarray) -> Any:
        """Rows `rows` of `work.batch` (carried over by row key): the previous output's results with this run's
        id and kept columns."""
        prev = self.previous
        assert prev is not None
        drop = {"id", *prev.keep_cols, *self.keep_cols}
        result_cols = [c for c in prev.schema.names if c not in drop]
        sub = subset(work.batch, rows)
        by_row = np.full(len(work.batch), -1, np.int64)
        by_row[work.carry_idx] = work.carry_rows
        taken = prev.take(by_row[rows], result_cols)
        columns: dict[str, Any] = {"id": id_column(sub)}
        for c in result_cols:
            columns[c] = taken.column(c)
        columns.update(kept_columns(sub, self.keep_cols))
        return pa.table(columns)

    def close(self) -> None:
        """Close the previous output."""
        if self.previous is not None:
            self.previous.close()
