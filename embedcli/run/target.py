"""What `-o` names, decided once: stdout, one file, or a directory of shards; checked before any work."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from embedcli.errors import STDIN, OutputError, UsageError
from embedcli.io.commit import check_read_only
from embedcli.io.location import refuse_url
from embedcli.io.manifest import manifest_path, strip_slash
from embedcli.io.objects import check_writable, is_object_url
from embedcli.io.readers import expand_paths
from embedcli.io.stores.url import LANCE_SCHEME, is_store_url, parse_lance, parse_postgres, redact
from embedcli.io.writers import check_output_path, output_format
from embedcli.run.flags import RunFlags
from embedcli.run.paths import check_no_clobber, check_side_file


@dataclass(frozen=True)
class Output:
    """A resolved `-o`: mode "stdout" | "file" | "dir" | "store", the path (absolute for a directory; the URL of a
    store) and its format ("lancedb" / "postgresql" for a store); `url`: the object URL (`s3://`, `gs://`) of a
    file written through a local spool (`embedcli.io.store_area`), whose path `path` then is."""

    mode: str
    path: str
    fmt: str
    url: str | None = None

    @property
    def name(self) -> str:
        """The output as the user named it (for messages)."""
        return self.url or self.path


def is_shard_dir(path: str, flags: RunFlags) -> bool:
    """Whether `-o path` is a directory of shards: `--shards-dir`, a trailing /, or a directory embedcli wrote."""
    if path == STDIN:
        return False
    return (
        flags.shards_dir
        or path.endswith(("/", os.sep))
        or (os.path.isdir(path) and os.path.isfile(manifest_path(path)))
    )


def check_target(path: str, flags: RunFlags, inputs: Sequence[str] = (), stats_file: str | None = None) -> None:
    """Before any work (a command calls this before loading its model): InputError for an input path or
    pattern that names no file; OutputError unless `-o path`, `--stats` and `--errors-file` can be written;
    UsageError when one of them is an input or another, or a URL other than a store's (`lancedb://`, `postgresql://`)."""
    if is_store_url(path):
        check_store_target(path, flags)
    elif is_object_url(path):
        check_object_target(path, flags)
    else:
        refuse_url("-o", path, "a local path, - for stdout, an object (s3://BUCKET/KEY, gs://BUCKET/KEY) or a "
                   "store (lancedb://DIR/TABLE, postgresql://...?table=NAME)")
    for flag, side in (("--stats", stats_file), ("--errors-file", flags.errors_file)):
        if is_object_url(side):
            check_writable(flag, side or "")
        else:
            refuse_url(flag, side, "a local path, s3://BUCKET/KEY or gs://BUCKET/KEY")
    if not is_object_url(flags.previous):  # an object is fetched when the run starts (`embedcli.run.execute`)
        refuse_url("--previous", flags.previous, "the local path of the previous output, s3://BUCKET/KEY or "
                   "gs://BUCKET/KEY")
    elif (flags.previous or "").endswith("/"):
        raise UsageError(f"--previous {flags.previous}: a directory of shards is not read from an object store "
                         "yet; name one object (s3://BUCKET/out/vectors.parquet)")
    if inputs:
        expand_paths(inputs)
    written = [("-o", path), ("--stats", stats_file), ("--errors-file", flags.errors_file)]
    urls = [(flag, p) for flag, p in written if is_object_url(p)]
    for i, (flag, url) in enumerate(urls):
        if url in inputs:
            raise UsageError(f"{flag} {url} is an input: writing it would destroy the input; choose another {flag}")
        for other_flag, other in urls[:i]:
            if url == other:
                raise UsageError(f"{flag} {url} is also {other_flag} {other}: give each its own path")
    if is_store_url(path) or is_object_url(path):
        check_side_file("--stats", None if is_object_url(stats_file) else stats_file)
        check_side_file("--errors-file", None if is_object_url(flags.errors_file) else flags.errors_file)
        return  # a missing input is said before a first `auto` run loads and probes the model
    as_dir = is_shard_dir(path, flags)
    check_read_only(path)
    check_output_path(path, as_dir=as_dir)
    check_side_file("--stats", None if is_object_url(stats_file) else stats_file)
    check_side_file("--errors-file", None if is_object_url(flags.errors_file) else flags.errors_file)
    writes = [(flag, p) for flag, p in written[1:] if not is_object_url(p)]
    check_no_clobber(inputs, path, output_is_dir=as_dir, writes=writes)


def check_store_target(url: str, flags: RunFlags, fmt: str | None = None) -> None:
    """UsageError (exit 2, one line) for a store URL that does not parse, or flags a store cannot honour."""
    shown = redact(url)
    if url.startswith(LANCE_SCHEME):
        parse_lance(url)
    else:
        parse_postgres(url)
    refused = [
        ("--shard", flags.shard is not None, "write each slice to its own file and merge them, then load the merge"),
        ("--shards-dir", flags.shards_dir, "a store is one table"),
        ("--previous", flags.previous is not None, "--incremental compares the input with the table itself"),
        ("--output-format", fmt is not None, "a store has its own format"),
    ]
    for flag, given, why in refused:
        if given:
            raise UsageError(f"-o {shown}: a store output does not take {flag} ({why})")


def check_object_target(url: str, flags: RunFlags) -> None:
    """UsageError (exit 2, one line) for an object URL `-o` that names no object, or flags it cannot honour."""
    if flags.shards_dir or url.endswith("/"):
        raise UsageError(f"-o {url}: a directory of shards is not written to an object store yet; name one object "
                         "(s3://BUCKET/out/vectors.parquet)")
    check_writable("-o", url)


def resolve_output(path: str, fmt: str | None, flags: RunFlags) -> Output:
    """The `Output` of `-o path` under `flags`; UsageError / OutputError when it cannot be one."""
    if is_store_url(path):
        check_store_target(path, flags, fmt)
        return Output("store", path, "lancedb" if path.startswith(LANCE_SCHEME) else "postgresql")
    if is_object_url(path):
        check_object_target(path, flags)
        return Output("file", path, output_format(path, fmt), url=path)
    if path == STDIN:
        if flags.shards_dir:
            raise UsageError("--shards-dir needs a directory for -o, not - (stdout)")
        if flags.incremental and not flags.previous:
            raise UsageError("--incremental with -o - (stdout) needs --previous OLD_OUTPUT")
        return Output("stdout", STDIN, output_format(STDIN, fmt))
    if is_shard_dir(path, flags):
        if fmt is not None and output_format("x.parquet", fmt) != "parquet":
            raise UsageError(f"a directory of shards is Parquet; --output-format {fmt} needs a file name for -o")
        out = os.path.abspath(strip_slash(path))
        if os.path.exists(out) and not os.path.isdir(out):
            raise OutputError(path, "exists and is not a directory", fix="name a directory for --shards-dir")
        check_output_path(os.path.join(os.path.dirname(out), "x"))
        return Output("dir", out, "parquet")
    check_output_path(path)
    return Output("file", path, output_format(path, fmt))
