"""Writing to an object store (`s3://`, `gs://`) through the pyarrow filesystems that `embedcli.io.location` reads
with: whole objects put in one request (a multipart upload for a large one, visible only once complete), objects
listed under a prefix, fetched to a local file, deleted. A store has no rename: what stands for one is said where
it is used (`embedcli.io.store_area`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

from embedcli.errors import UsageError
from embedcli.io.commit import write_atomic
from embedcli.io.errors import OutputError
from embedcli.io.location import Location, _one_line, locate, url_scheme

WRITABLE_SCHEMES: tuple[str, ...] = ("s3", "gs")
"""Schemes embedcli writes objects to (`hf://` is read-only here)."""
COPY_BYTES = 8 << 20


def is_object_url(path: str | None) -> bool:
    """Whether `path` is a URL of a store embedcli writes to (`s3://`, `gs://`)."""
    return bool(path) and url_scheme(path or "") in WRITABLE_SCHEMES


def check_writable(flag: str, url: str) -> Location:
    """The location of an object URL given to `flag`; UsageError (exit 2, one line) when it names no object of a
    store embedcli writes, OutputError when the store cannot be reached."""
    scheme = url_scheme(url)
    if scheme not in WRITABLE_SCHEMES:
        raise UsageError(f"{flag} {url}: {scheme}:// is not supported for {flag}; write to a local path, s3:// or gs://")
    rest = url[url.index("://") + 3 :]
    if url.endswith("/") or "/" not in rest.strip("/"):
        raise UsageError(f"{flag} {url}: name one object, {scheme}://BUCKET/KEY (a prefix of shards is not "
                         "written to a store yet)")
    import pyarrow.fs as pafs

    bucket = rest.split("/", 1)[0]
    try:
        loc = locate(url)
        found = loc.fs.get_file_info(bucket).type
    except Exception as e:  # a store that cannot be reached (the clients' errors share no base class)
        raise OutputError(url, f"cannot reach the store: {_one_line(e)}") from None
    if found == pafs.FileType.NotFound:
        raise OutputError(url, f"the bucket {bucket!r} does not exist", fix="create it, or name another bucket")
    return loc


def _failed(url: str, e: BaseException) -> OutputError:
    return OutputError(url, _one_line(e), fix="rerun the same command once the store can be written; committed work "
                       "is kept")


def put_bytes(url: str, data: bytes) -> None:
    """Write `data` as the object `url` in one request (OutputError when the store refuses)."""
    loc = locate(url)
    try:
        with loc.fs.open_output_stream(loc.path) as out:
            out.write(data)
    except Exception as e:  # the clients' own errors share no base class
        raise _failed(url, e) from None


def write_whole(path: str, data: bytes) -> None:
    """Write a small file (`--stats`, `--errors-file`) whole: an object in one request, a local file by rename."""
    if is_object_url(path):
        put_bytes(path, data)
    else:
        write_atomic(path, data)


def upload(local: str, url: str) -> None:
    """Copy the local file `local` to the object `url` (a multipart upload when large: visible once complete)."""
    loc = locate(url)
    try:
        with open(local, "rb") as src, loc.fs.open_output_stream(loc.path) as out:
            shutil.copyfileobj(src, out, COPY_BYTES)
    except Exception as e:
        raise _failed(url, e) from None


def _missing_object(e: OSError) -> bool:
    """Whether a store error says the object is not there (pyarrow's S3 answer to a missing key is an OSError)."""
    text = str(e).lower()
    return "not found" in text or "nosuchkey" in text


def download(url: str, local: str) -> bool:
    """Copy the object `url` to the new local file `local`; False when there is no such object."""
    loc = locate(url)
    try:
        with loc.fs.open_input_stream(loc.path, compression=None) as src:
            fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
            with os.fdopen(fd, "wb") as out:
                while True:
                    chunk = src.read(COPY_BYTES)
                    if not chunk:
                        break
                    out.write(chunk)
    except FileNotFoundError:
        return False
    except OSError as e:
        if _missing_object(e):
            return False
        raise OutputError(url, f"cannot read it back: {_one_line(e)}") from None
    return True


def parquet_schema_metadata(url: str) -> dict[bytes, bytes] | None:
    """The key-value metadata of a Parquet object's schema, read from its footer alone (ranged reads, not the
    object); None when there is no such object or it is not Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    loc = locate(url)
    try:
        with loc.fs.open_input_file(loc.path) as f:
            return dict(pq.read_schema(f).metadata or {})
    except FileNotFoundError:
        return None
    except pa.ArrowInvalid:
        return None  # not Parquet: the caller reads the object whole
    except OSError as e:
        if _missing_object(e):
            return None
        raise OutputError(url, f"cannot read it: {_one_line(e)}") from None


def read_object(url: str) -> bytes | None:
    """The bytes of a small object, or None when there is none."""
    loc = locate(url)
    try:
        with loc.fs.open_input_stream(loc.path, compression=None) as src:
            return bytes(src.read())
    except FileNotFoundError:
        return None
    except OSError as e:
        if _missing_object(e):
            return None
        raise OutputError(url, f"cannot read it: {_one_line(e)}") from None


def exists(url: str) -> bool:
    """Whether the object `url` exists."""
    import pyarrow.fs as pafs

    loc = locate(url)
    try:
        return bool(loc.fs.get_file_info(loc.path).type == pafs.FileType.File)
    except Exception as e:
        raise OutputError(url, f"cannot reach the store: {_one_line(e)}") from None


def list_under(prefix_url: str) -> Iterator[str]:
    """The URLs of every object under `prefix_url/` (none when there is no such prefix)."""
    import pyarrow.fs as pafs

    loc = locate(prefix_url)
    try:
        infos = loc.fs.get_file_info(pafs.FileSelector(loc.path.rstrip("/"), allow_not_found=True, recursive=True))
    except Exception as e:
        raise OutputError(prefix_url, f"cannot list it: {_one_line(e)}") from None
    for info in infos:
        if info.type == pafs.FileType.File:
            yield loc.url_of(info.path)


def delete(url: str) -> None:
    """Delete the object `url` (nothing when there is none)."""
    loc = locate(url)
    try:
        loc.fs.delete_file(loc.path)
    except FileNotFoundError:
        return
    except OSError as e:
        if _missing_object(e):
            return
        raise OutputError(url, f"cannot delete it: {_one_line(e)}") from None


def delete_prefix(prefix_url: str) -> None:
    """Delete every object under `prefix_url/` and the folder markers pyarrow leaves (nothing when there is none)."""
    loc = locate(prefix_url)
    try:
        loc.fs.delete_dir(loc.path.rstrip("/"))
    except FileNotFoundError:
        return
    except OSError as e:
        if _missing_object(e):
            return
        raise OutputError(prefix_url, f"cannot delete it: {_one_line(e)}") from None
