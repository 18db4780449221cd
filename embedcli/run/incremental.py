"""`--incremental`: rows whose key (BLAKE2b of id and texts) is in the previous output are carried over."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.errors import UsageError
from embedcli.io.arrow_values import arrow_array
from embedcli.io.manifest import KEY_CONFIG, KEY_INPUT_OPTIONS, KEY_MODEL, output_metadata
from embedcli.io.previous import PreviousOutput
from embedcli.io.shards import RowsOut, row_keys
from embedcli.io.units import InputUnits, file_entry
from embedcli.io.writers import output_format
from embedcli.run.checks import Work, index_table
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

    def rows_out(self, works: Sequence[Work], n_compute: int, computed: Any, counts: Any) -> RowsOut | None:
        """The output rows of consecutive work items in input order (`computed`: the results of their
        `n_compute` rows to compute, in order): computed, carried over by row key, carried over unread.
        Adds to `counts`' computed_rows, carried_rows and carried_unread."""
        if computed is not None and computed.num_rows != n_compute:  # not one output row per input row
            if any(w.rows != len(w.compute_idx) for w in works):
                raise UsageError("--incremental needs one output row per input row; this command does not give that")
            counts.computed_rows += n_compute
            return RowsOut(computed, None, None)
        tables: list[Any] = []
        refs: list[np.ndarray] = []
        index: list[Any] = []
        at = 0
        for work in works:
            if not work.rows:
                continue
            k = len(work.compute_idx) if work.compute is not None else 0
            own = computed.slice(at, k) if computed is not None and k else None
            at += k
            table, ref = self._work_rows(work, own)
            if table is not None and table.num_rows:
                tables.append(table.replace_schema_metadata(None))
            refs.append(ref)
            index.append(index_table(work, self.previous.index_take if self.previous is not None else None))
            counts.computed_rows += k
            counts.carried_rows += work.rows - k
            counts.carried_unread += work.unread
        if not refs:
            return None
        table = None
        if tables:
            first = tables[0].schema  # a select and cast only where a table differs (a pool of 10,000 one-row files)
            table = tables[0] if len(tables) == 1 else pa.concat_tables(
                [t if t.schema.equals(first) else t.select(first.names).cast(first) for t in tables])
        all_refs = np.concatenate(refs)
        return RowsOut(table, all_refs if bool((all_refs >= 0).any()) else None, pa.concat_tables(index))

    def _work_rows(self, work: Work, computed: Any) -> tuple[Any, np.ndarray]:
        """A work item's rows not taken over as they are (a table, in order), and per output row the
        previous-output row taken over as it is, or -1."""
        prev = work.prev_rows()
        if not (prev >= 0).any():
            return computed, np.full(work.rows, -1, np.int64)
        unread = work.src < 0
        by_key = (prev >= 0) & ~unread
        if not by_key.any() or self.by_reference(work.batch):
            return computed, prev
        # rows carried by row key with this run's id and kept columns: written, not referenced
        made = self.carried(work, work.src[by_key])
        if computed is None or computed.num_rows == 0:
            both = made
        else:
            made = made.select(computed.column_names).cast(computed.schema)
            both = pa.concat_tables([computed.replace_schema_metadata(None), made.replace_schema_metadata(None)])
        is_computed = (prev < 0)[~unread]
        position = np.empty(len(is_computed), np.int64)
        position[is_computed] = np.arange(int(is_computed.sum()))
        position[~is_computed] = int(is_computed.sum()) + np.arange(int((~is_computed).sum()))
        return both.take(arrow_array(position)).combine_chunks(), np.where(unread, prev, -1)

    def close(self) -> None:
        """Close the previous output."""
        if self.previous is not None:
            self.previous.close()


def count_units(units: InputUnits, work: Work, previous: PreviousOutput | None,
                carry_units: Mapping[bytes, Any] | None) -> None:
    """Count a work item's records and rows per input file and row group into `units`; a file carried over
    whole takes its row groups from the previous output's units."""
    for f, group, records, rows in work.counts:
        units.add(f, group, records, rows)
    for f, group, ident in work.identities:
        units.identify(f, ident, group)
        if group < 0 and f in work.whole_files and previous is not None and carry_units and ident in carry_units:
            entry = file_entry(previous.units, ident)
            if entry is not None:
                units.copy_groups(f, entry)
    for f, state in work.exits:
        units.exit(f, state)
