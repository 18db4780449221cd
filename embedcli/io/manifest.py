"""The resume manifest of an output, its staging area, the lock that keeps two runs apart, and job keys.

Layout of the staging area of `-o OUT` (`OUT.embedcli-staging/`, next to OUT so renames stay atomic)::

    part-000000.parquet            committed shards, rows in input order (one file per commit)
    _embedcli/manifest.json        this manifest: the only source of truth about what is committed
    _embedcli/index-000000.parquet the row index of shard 0 (key, id hash, location, blocks), for --incremental
    _embedcli/refs-000000.npy      rows of shard 0 taken over from the previous output (its row numbers)
    _embedcli/errors-000000.jsonl  rows skipped under --on-error skip while making part-000000
    .part-000001.parquet.tmp-PID   a shard being written (deleted as stale when a run resumes)

A shard is committed by renaming its files into place and then rewriting the manifest atomically
(temp file, fsync, rename). Files the manifest does not list are leftovers of a killed run. Each shard
records where reading goes on after it (`end`, a `ReadPoint`: input file, byte offset or row, reader
state), so a resumed run seeks there instead of reading the committed records again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from embedcli.io.commit import INDEX_SUFFIX as INDEX_SUFFIX
from embedcli.io.commit import OLD_SUFFIX as OLD_SUFFIX
from embedcli.io.commit import STAGING_SUFFIX as STAGING_SUFFIX
from embedcli.io.commit import TEMP_MARK, arrow_source, fsync_parent
from embedcli.io.commit import write_atomic as write_atomic
from embedcli.io.errors import OutputError
from embedcli.io.fingerprint import fingerprint_identity
from embedcli.io.formats import output_format
from embedcli.io.sidecar import check_sidecar
from embedcli.io.sidecar import read_json_file as read_json_file

MANIFEST_FORMAT = "embedcli-manifest"
MANIFEST_VERSION = 2  # 2: read points after each shard, rows kept by reference, input units
META_DIR = "_embedcli"
MANIFEST_NAME = "manifest.json"

# Keys of the Parquet key-value metadata (or the JSONL/npy sidecar's "metadata") that describe a run.
KEY_CONFIG = "embedcli.config_hash"
KEY_MODEL = "embedcli.model_hash"
KEY_CONFIG_KEY = "embedcli.config_key"
KEY_JOB = "embedcli.job_key"
KEY_OUTPUT = "embedcli.output_key"
KEY_INPUTS = "embedcli.inputs"
KEY_INPUT_OPTIONS = "embedcli.input_options"
KEY_ROWS = "embedcli.rows"
KEY_RECORDS = "embedcli.input_records"
KEY_SKIPPED = "embedcli.skipped_rows"
KEY_ERRORS = "embedcli.errors"
KEY_COMPLETE = "embedcli.complete"
# `--shard K/N` outputs (embedcli.run.sharding): which slice of how many records.
KEY_SHARD = "embedcli.shard"
KEY_SHARD_RANGE = "embedcli.shard_range"
KEY_SHARD_TOTAL = "embedcli.shard_total"
SHARD_KEYS = (KEY_SHARD, KEY_SHARD_RANGE, KEY_SHARD_TOTAL)


def _sha(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def strip_slash(path: str) -> str:
    """`out/` → `out` (the root `/` stays)."""
    stripped = path.rstrip("/" + os.sep)
    return stripped or path


def staging_dir(output: str) -> str:
    """The staging area of an output path (file or directory): `OUT.embedcli-staging`."""
    return os.path.abspath(strip_slash(output)) + STAGING_SUFFIX


def make_staging_dir(root: str, output: str) -> bool:
    """Create the staging directory `root` of `output` (True), or check the one there (False).

    Never through a link: a symlink, a non-directory or a directory of another user planted at
    the staging path is refused (OutputError), so nothing is ever emptied or written through it.
    """
    try:
        os.mkdir(root, 0o777)
        created = True
    except FileExistsError:
        created = False
    except OSError as e:
        raise output_error(output, e, resumable=False) from None
    st = os.lstat(root)
    if stat.S_ISLNK(st.st_mode):
        raise OutputError(
            output,
            f"its staging path {root} is a symbolic link; embedcli never writes through one",
            fix=f"remove the link (rm {root}) and rerun",
        )
    if not stat.S_ISDIR(st.st_mode):
        raise OutputError(output, f"its staging path {root} exists and is not a directory", fix=f"remove {root}")
    if st.st_uid != os.getuid():
        raise OutputError(
            output,
            f"its staging directory {root} belongs to another user",
            fix="check who made it; remove it, or choose another -o",
        )
    return created


def index_sidecar(output: str) -> str:
    """The (id, key) index kept next to a single-file output: `OUT.embedcli-index.parquet`."""
    return os.path.abspath(output) + INDEX_SUFFIX


def config_key(meta: Mapping[str, str], input_options: Mapping[str, Any], output_format: str) -> str:
    """What must match for work to be mixed: resolved config and model hashes, input options, format."""
    return _sha(
        {
            "config_hash": meta.get(KEY_CONFIG),
            "model_hash": meta.get(KEY_MODEL),
            "input_options": dict(input_options),
            "output_format": output_format,
        }
    )


def job_key(cfg_key: str, fingerprints: list[dict[str, Any]] | None) -> str | None:
    """Config plus the exact inputs (None when an input, e.g. stdin, cannot be fingerprinted)."""
    if fingerprints is None:
        return None
    return _sha({"config_key": cfg_key, "inputs": [fingerprint_identity(fp) for fp in fingerprints]})


# --------------------------------------------------------------------------------------------------
# Atomic files


def fsync_dir(path: str) -> None:
    """fsync a directory so a rename in it is durable (ignored where unsupported)."""
    fsync_parent(os.path.join(path, "x"))


def write_json_atomic(path: str, payload: Any) -> None:
    """JSON (indented, sorted keys) written with `write_atomic`."""
    # ASCII escapes: input paths that are not UTF-8 (surrogate-escaped by Python) round-trip exactly.
    write_atomic(path, json.dumps(payload, indent=1, sort_keys=True).encode("ascii") + b"\n")


def output_error(path: str, e: OSError, resumable: bool = True) -> OutputError:
    """An OutputError for an OSError while writing, saying how to resume (full disk gets its own fix)."""
    fix: str | None
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free some space and rerun the same command" + (
            ": committed work is kept and the run resumes" if resumable else ""
        )
    elif e.errno == errno.EROFS:
        fix = "choose a directory on a writable file system (or remount it read-write)"
    elif isinstance(e, PermissionError):
        fix = "choose a directory you can write to"
    else:
        fix = "rerun the same command once the problem is fixed; committed work is kept" if resumable else None
    return OutputError(path, e.strerror or str(e), fix=fix)


# --------------------------------------------------------------------------------------------------
# The manifest


@dataclass
class ShardEntry:
    """One committed shard: its data file (None when every row was skipped), rows, input records, errors."""

    number: int
    file: str | None
    rows: int
    records: list[int]  # [start, end) in the order records come out of the readers
    errors: int = 0
    index: str | None = None
    errors_file: str | None = None
    refs: str | None = None  # rows taken over from the previous output, by row (`_embedcli/refs-NNNNNN.npy`)
    end: dict[str, Any] | None = None  # where reading goes on after it (`embedcli.io.positions.ReadPoint`)


@dataclass
class Manifest:
    """What a run has committed, and what it was made from."""

    config_key: str
    job_key: str | None
    config: dict[str, str]
    input_options: dict[str, Any]
    inputs: list[dict[str, Any]] | None
    output_format: str
    mode: str = "file"  # "file": assembled into one file at the end; "dir": published as a shard directory
    shards: list[ShardEntry] = field(default_factory=list)
    records_done: int = 0
    rows_done: int = 0
    errors: int = 0
    indexed: bool = True
    complete: bool = False
    output_key: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    previous: dict[str, str] | None = None  # the output rows are taken over from: {"path", "output_key"}
    units: str | None = None  # the run's `embedcli.io.units.InputUnits` so far (JSON)
    format: str = MANIFEST_FORMAT
    version: int = MANIFEST_VERSION

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        """Parse a manifest (ValueError when it is not one)."""
        if data.get("format") != MANIFEST_FORMAT:
            raise ValueError("not an embedcli manifest")
        if int(data.get("version", 0)) > MANIFEST_VERSION:
            raise ValueError(f"manifest version {data.get('version')} is newer than this embedcli")
        fields = dict(data)
        fields["shards"] = [ShardEntry(**s) for s in data.get("shards", [])]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in fields.items() if k in known})

    def save(self, root: str) -> None:
        """Write atomically to `root/_embedcli/manifest.json`."""
        meta_dir = os.path.join(root, META_DIR)
        os.makedirs(meta_dir, exist_ok=True)
        write_json_atomic(os.path.join(meta_dir, MANIFEST_NAME), self.to_dict())

    def append(self, root: str, entry: ShardEntry, records_end: int, units: str | None = None) -> None:
        """Add a committed shard and save (the save is the commit); if saving fails, this object is as before."""
        before = (self.records_done, self.rows_done, self.errors, self.units)
        self.shards.append(entry)
        self.records_done = records_end
        self.rows_done += entry.rows
        self.errors += entry.errors
        if units is not None:
            self.units = units
        try:
            self.save(root)
        except BaseException:
            self.shards.pop()
            self.records_done, self.rows_done, self.errors, self.units = before
            raise

    @classmethod
    def load(cls, root: str) -> Manifest | None:
        """The manifest of a staging area or shard directory; None when absent or unreadable."""
        path = manifest_path(root)
        try:
            with open(path, encoding="utf-8") as f:
                return cls.from_dict(json.load(f))
        except (OSError, ValueError, TypeError):
            return None

    @property
    def skipped(self) -> int:
        """Input records that produced no row (bad rows skipped under --on-error skip)."""
        return self.errors


def manifest_path(root: str) -> str:
    """`root/_embedcli/manifest.json`."""
    return os.path.join(root, META_DIR, MANIFEST_NAME)


# --------------------------------------------------------------------------------------------------
# Locking


class StagingLock:
    """An exclusive, non-blocking flock on the staging directory; released by the kernel if the process dies."""

    def __init__(self, root: str, output: str) -> None:
        self.root = root
        self.output = output
        self._fd: int | None = None

    def acquire(self) -> StagingLock:
        """Take the lock, or raise OutputError when another run holds it."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputError(
                self.output,
                "another embedcli run is writing this output right now",
                fix="wait for it to finish (or stop it), then rerun",
            ) from None
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> StagingLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


# --------------------------------------------------------------------------------------------------
# Reading what an existing output says about itself


def embedcli_metadata(raw: Mapping[bytes, bytes]) -> dict[str, str] | None:
    """A Parquet schema's key-value metadata as text, or None when it carries no embedcli key."""
    meta = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in raw.items()}
    return meta if any(k.startswith("embedcli.") for k in meta) else None


def output_metadata(path: str, fmt: str | None = None) -> dict[str, str] | None:
    """The embedcli key-value metadata of an existing output file or shard directory, or None.

    Parquet: the file's key-value metadata; JSONL/npy: the `.meta.json` sidecar; a directory: its
    manifest's metadata. None when the path does not exist or carries no embedcli metadata.
    """
    if os.path.isdir(path):
        manifest = Manifest.load(path)
        return dict(manifest.metadata) if manifest and manifest.metadata else None
    if not os.path.isfile(path):
        return None

    kind = output_format(path, fmt, reading=True)
    if kind == "parquet":
        try:
            raw = pq.read_schema(arrow_source(path)).metadata or {}
        except (pa.ArrowException, OSError):
            return None
        return embedcli_metadata(raw)
    sidecar = read_json_file(f"{path}.meta.json")
    if not sidecar or not isinstance(sidecar.get("metadata"), dict):
        return None
    meta = {str(k): str(v) for k, v in sidecar["metadata"].items()}
    if KEY_COMPLETE in meta and check_sidecar(path, sidecar):
        meta[KEY_COMPLETE] = "false"  # the sidecar names other bytes (a commit cut between renames)
    return meta if any(k.startswith("embedcli.") for k in meta) else None


def iter_tmp_files(directory: str) -> Iterator[str]:
    """Paths of `.NAME.tmp-PID` leftovers in a directory."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.startswith(".") and TEMP_MARK in name:
            yield os.path.join(directory, name)
