"""Where a path points: a local path (read as always, by the callers' own code), or a URL.

Object-store URLs (`s3://`, `gs://`, `hf://`) are read through pyarrow's filesystems: S3 with the standard AWS
SDK environment and files (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_PROFILE`, `~/.aws/config` ...), GCS with
Google's default credentials (or the emulator that `STORAGE_EMULATOR_HOST` names, as google-cloud-storage and
gcsfs read it), the Hugging Face Hub through huggingface_hub's `HfFileSystem` (read-only, `HF_ENDPOINT` and
`HF_TOKEN` as huggingface_hub reads them). `file://` URLs are local paths (`local_path`). Any other scheme is
refused in one line (exit 2), never taken for a local folder named `scheme:`.

Nothing here is imported before a URL is seen: pyarrow.fs and huggingface_hub load on first use.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from embedcli.errors import InputError, UsageError

OBJECT_SCHEMES: tuple[str, ...] = ("s3", "gs", "hf")
"""Schemes read through pyarrow's filesystems (`gcs` is taken as `gs`)."""
SCHEMES: tuple[str, ...] = (*OBJECT_SCHEMES, "file")
"""Every scheme a path that is read may have."""
SUPPORTED = ", ".join(f"{s}://" for s in SCHEMES)

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")
_ALIASES = {"gcs": "gs"}
_GLOB = re.compile(r"[*?\[]")
_LIBRARY = {"s3": "pyarrow built with S3 support", "gs": "pyarrow built with GCS support", "hf": "huggingface_hub"}

READ_BYTES = 8 << 20
"""Bytes asked of a store per read of a streamed object (one ranged GET): memory stays at this, whatever the object."""


def url_scheme(path: str) -> str | None:
    """The scheme of `path` when it is a URL (`s3://...` -> `s3`, lower case), else None (a local path)."""
    m = _SCHEME.match(path)
    if m is None:
        return None
    scheme = m.group(1).lower()
    return _ALIASES.get(scheme, scheme)


def is_url(path: str) -> bool:
    """Whether `path` is a URL (`scheme://...`) rather than a local path."""
    return _SCHEME.match(path) is not None


def local_path(path: str, flag: str | None = None) -> str:
    """`file:///abs/name` (or `file://localhost/abs/name`) as the local path `/abs/name`; any other path as is."""
    if url_scheme(path) != "file":
        return path
    rest = path[path.index("://") + 3 :]
    host, slash, name = rest.partition("/")
    if host not in ("", "localhost") or not slash:
        raise UsageError(f"{_shown(flag, path)}: a file:// URL names an absolute local path, file:///abs/path "
                         f"(this one names the host {host!r})")
    return "/" + unquote(name, errors="surrogateescape")


def _shown(flag: str | None, path: str) -> str:
    return f"{flag} {path}" if flag else path


def check_scheme(path: str, flag: str | None = None) -> None:
    """UsageError (exit 2) in one line when `path` is a URL whose scheme cannot be read here."""
    scheme = url_scheme(path)
    if scheme is None or scheme == "file":
        return
    if scheme not in OBJECT_SCHEMES:
        raise UsageError(f"{_shown(flag, path)}: {scheme}:// is not supported; embedcli reads local paths "
                         f"and {SUPPORTED} URLs")
    try:
        _filesystem_class(scheme)
    except ImportError:
        raise UsageError(f"{_shown(flag, path)}: reading {scheme}:// needs {_LIBRARY[scheme]}, which is not "
                         "installed here") from None


def refuse_url(flag: str, path: str | None, what: str = "a local path") -> None:
    """UsageError (exit 2) in one line when `flag`'s value is a URL: that place takes local paths only (yet).

    Used where embedcli writes (`-o`, `--stats`, `--errors-file`) or reads an output's own structure
    (`--previous`, `--calibration`, merge and inspect): never created as a local folder named `s3:`.
    """
    if not path:
        return
    scheme = url_scheme(path)
    if scheme is None:
        return
    if scheme == "file":
        fix = f"write the local path itself ({local_path(path, flag)})"
    elif scheme in OBJECT_SCHEMES:
        fix = f"{scheme}:// is not supported for {flag} yet; give {what}"
    else:
        fix = f"{scheme}:// is not supported; give {what}"
    raise UsageError(f"{flag} {path}: {fix}")


def refuse_output_urls(command: str, paths: Sequence[str]) -> None:
    """UsageError (exit 2) in one line when a path given to `command` (merge, inspect: they read the structure of
    an embedcli output, its manifest and sidecars) is a URL."""
    for path in paths:
        refuse_url(command, path, "the local path of an embedcli output")


# --------------------------------------------------------------------------------------------------
# Filesystems


def _filesystem_class(scheme: str) -> Any:
    """The pyarrow filesystem class of a scheme (ImportError when this pyarrow or environment lacks it)."""
    if scheme == "s3":
        from pyarrow.fs import S3FileSystem

        return S3FileSystem
    if scheme == "gs":
        from pyarrow.fs import GcsFileSystem

        return GcsFileSystem
    from huggingface_hub import HfFileSystem

    return HfFileSystem


@dataclass(frozen=True)
class Location:
    """An object URL resolved: its filesystem (pyarrow), the path in it, and for hf:// the fsspec filesystem."""

    url: str
    fs: Any
    path: str
    fsspec: Any = None

    def url_of(self, path: str) -> str:
        """The URL of another path of the same filesystem (as listed by it)."""
        scheme = self.url[: self.url.index("://")]
        return f"{scheme}://{path.lstrip('/')}"


# The environment a filesystem is made from: one made under other settings is not reused (a library caller may
# change them between runs; the CLI makes each once).
_SETTINGS = (
    "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "STORAGE_EMULATOR_HOST", "HF_ENDPOINT", "HF_TOKEN",
)


def _filesystem(scheme: str, bucket: str) -> tuple[Any, Any]:
    """(pyarrow filesystem, fsspec filesystem or None) of a scheme and bucket, made once per process and settings."""
    return _made_filesystem(scheme, bucket, tuple(os.environ.get(k) for k in _SETTINGS))


@functools.cache
def _made_filesystem(scheme: str, bucket: str, settings: tuple[str | None, ...]) -> tuple[Any, Any]:
    import pyarrow.fs as pafs

    if scheme == "s3":
        # from_uri reads the SDK's environment and files, and asks the bucket's region when none is set; a delayed
        # open puts a small object (a manifest, a lease) in one request rather than a multipart upload's three
        return pafs.FileSystem.from_uri(f"s3://{bucket}?allow_delayed_open=true")[0], None
    if scheme == "gs":
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator:  # as google-cloud-storage and gcsfs read it: an emulator, no credentials
            parts = urlsplit(emulator if "://" in emulator else f"http://{emulator}")
            return pafs.GcsFileSystem(
                anonymous=True, scheme=parts.scheme or "http", endpoint_override=parts.netloc,
                retry_time_limit=datetime.timedelta(seconds=15),
            ), None
        return pafs.GcsFileSystem(), None
    from huggingface_hub import HfFileSystem

    hf = HfFileSystem()
    return pafs.PyFileSystem(pafs.FSSpecHandler(hf)), hf


def locate(url: str) -> Location:
    """The filesystem and path of an object URL (UsageError for a scheme that cannot be read)."""
    check_scheme(url)
    scheme = url_scheme(url)
    if scheme not in OBJECT_SCHEMES:  # a local path or file:// URL is the callers' own to read
        raise ValueError(f"not an object-store URL: {url!r}")
    rest = url[url.index("://") + 3 :]
    bucket = rest.split("/", 1)[0]
    if not bucket or "/" not in rest.strip("/"):
        what = "hf://datasets/ORG/NAME/FILE" if scheme == "hf" else f"{scheme}://BUCKET/KEY"
        raise InputError(url, "names no object", fix=f"name one: {what}")
    with _reading(url, "cannot reach the store"):
        fs, fsspec = _filesystem(scheme, "" if scheme == "hf" else bucket)
    return Location(url, fs, rest, fsspec)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


@contextlib.contextmanager
def _reading(url: str, what: str = "cannot read") -> Iterator[None]:
    """A call to a store's client: its failure as an InputError naming the URL, in one line."""
    try:
        yield
    except (InputError, UsageError):
        raise
    except FileNotFoundError:
        raise InputError(url, "no such object", fix="check the URL") from None
    except Exception as e:  # the clients' own errors (network, credentials, HTTP) share no base class
        raise InputError(url, f"{what}: {_one_line(e)}") from None


# --------------------------------------------------------------------------------------------------
# Globs and listing


def _segment_regex(segment: str) -> str:
    """A path segment of a glob as a regex: `*`, `?` and `[...]` within the segment, hidden names only by a dot."""
    out = []
    i = 0
    while i < len(segment):
        c = segment[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = segment.find("]", i + 2 if segment[i + 1 : i + 2] in ("!", "]") else i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = segment[i + 1 : end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    regex = "".join(out)
    # as glob.glob: a wildcard never matches a leading dot (hidden names)
    return regex if segment.startswith(".") else f"(?!\\.){regex}"


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob over `/`-separated keys as glob.glob(recursive=True) reads it: `**` spans folders (none hidden)."""
    parts = []
    segments = pattern.split("/")
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg == "**":
            parts.append("(?:(?!\\.)[^/]*/)*" if not last else "(?:(?!\\.)[^/]*(?:/(?!\\.)[^/]*)*)?")
        else:
            parts.append(_segment_regex(seg) + ("" if last else "/"))
    return re.compile("".join(parts) + r"\Z")


def expand_url(url: str) -> list[str]:
    """The object URLs a URL or URL glob names, sorted as a local glob's matches (InputError for none)."""
    loc = locate(url)
    if not _GLOB.search(loc.path):
        info = _info(loc)
        if info.type == _file_type().File:
            return [url]
        if info.type == _file_type().Directory:
            raise InputError(url, "is a folder (a prefix of objects)",
                             fix=f"name the objects in it, e.g. '{url.rstrip('/')}/*.jsonl'")
        raise InputError(url, "no such object", fix="check the URL")
    import pyarrow.fs as pafs

    segments = loc.path.split("/")
    first = next(i for i, s in enumerate(segments) if _GLOB.search(s))
    # the bucket (hf://: the repo, ORG/NAME after datasets/ or spaces/, if any) is named, never matched
    named = 1 if url_scheme(url) != "hf" else (3 if segments[0] in ("datasets", "spaces") else 2)
    if first < named:
        raise InputError(url, "a pattern matches objects, not buckets or repos", fix="name the bucket (repo) itself")
    base = "/".join(segments[:first])
    deep = len(segments) - first > 1 or "**" in segments[first:]
    regex = glob_regex(loc.path)
    with _reading(url):
        infos = loc.fs.get_file_info(pafs.FileSelector(base, allow_not_found=True, recursive=deep))
    matches = sorted(loc.url_of(i.path) for i in infos if i.type == pafs.FileType.File and regex.match(i.path.lstrip("/")))
    if not matches:
        raise InputError(url, "no such object: the pattern matched no objects", fix="check the pattern and the prefix")
    return matches


def _file_type() -> Any:
    import pyarrow.fs as pafs

    return pafs.FileType


def _info(loc: Location) -> Any:
    with _reading(loc.url):
        return loc.fs.get_file_info(loc.path)


def is_object_file(url: str) -> bool:
    """Whether an object URL names an existing object (False for a prefix or nothing; InputError when unreadable)."""
    return bool(_info(locate(url)).type == _file_type().File)


# --------------------------------------------------------------------------------------------------
# Reading


def open_stream(url: str) -> Any:
    """An object's bytes as a pyarrow input stream read front to back (never decompressed here)."""
    loc = locate(url)
    with _reading(url):
        # buffered: the store is asked for READ_BYTES at a time, whatever the reader above asks for
        return loc.fs.open_input_stream(loc.path, compression=None, buffer_size=READ_BYTES)


def open_random_access(url: str) -> Any:
    """An object as a pyarrow random-access file: reads are ranged requests (Parquet seeks to its footer)."""
    loc = locate(url)
    with _reading(url):
        return loc.fs.open_input_file(loc.path)


# The metadata keys of an object (pyarrow's, from the store's HEAD answer) that change when its bytes do:
# S3's ETag, VersionId and Last-Modified; GCS's etag, generation and updated.
_IDENTITY_KEYS = {
    "ETag": "etag", "etag": "etag", "VersionId": "version", "generation": "generation",
    "Last-Modified": "modified", "updated": "modified",
}


def object_fingerprint(url: str) -> dict[str, Any]:
    """An object's identity for resume manifests and reruns, from the store's own metadata (its bytes are not
    read): the size, and the ETag / generation / modification time the store gives (the Hub: the content's
    git blob id or LFS sha256), so a rewritten object is another input."""
    loc = locate(url)
    fp: dict[str, Any] = {"path": url}
    with _reading(url):
        if loc.fsspec is not None:
            from huggingface_hub import HfApi
            from huggingface_hub.hf_api import RepoFile

            where = loc.fsspec.resolve_path(loc.path)
            found = HfApi().get_paths_info(
                where.repo_id, [where.path_in_repo], revision=where.revision, repo_type=where.repo_type
            )
            entry = found[0] if found else None
            if not isinstance(entry, RepoFile):
                raise FileNotFoundError(url)
            fp["size"] = int(entry.size)
            fp["etag"] = str(entry.lfs.sha256 if entry.lfs else entry.blob_id)
            return fp
        with loc.fs.open_input_file(loc.path) as f:  # one HEAD request
            fp["size"] = int(f.size())
            meta = {k: v.decode("utf-8", "replace") for k, v in (f.metadata() or {}).items()}
    for key, name in _IDENTITY_KEYS.items():
        if meta.get(key):
            fp.setdefault(name, meta[key])
    if len(fp) == 2:  # a store that says none of them: its listing's modification time
        mtime = _info(loc).mtime_ns
        if mtime is not None:
            fp["mtime_ns"] = int(mtime)
    return fp
