"""The staging area of an output in an object store (`-o s3://BUCKET/KEY`, `gs://...`): a local spool mirrored to
the store, where a commit is an object put last and the lock is a lease.

**Writing.** The run writes exactly as it writes a local output (`embedcli.run.staging`, `embedcli.io.shards`),
into a private spool folder that stands for the output's folder: `SPOOL/NAME` and `SPOOL/NAME.embedcli-staging/`.
So a store output holds the same bytes as a local run's, and no write path of the loop knows about stores. The
spool is mirrored to the store at three points:

- **Each commit.** The committed shard's files are put as objects under `URL.embedcli-staging/` (a shard object is
  never rewritten once a manifest names it), then the manifest object, *last*: the manifest is the commit point.
  Objects under the prefix that the manifest does not name are garbage of a killed run, deleted when the next run
  takes the staging over, and with the whole prefix when the output is published.
- **Start.** The staged manifest and the objects it names are fetched into the spool, so a run killed (even
  `kill -9`) resumes from the store as from a local staging folder: no committed row is read or computed again.
  Whether an existing output is complete or made otherwise comes from a Parquet object's footer alone, so a rerun
  that finds it complete (a cron job's nightly no-op) fetches none of it; a run with work to do then fetches the
  output object and its sidecars (`URL.embedcli-index.parquet`, ...): `--incremental` carries rows over from them.
- **Publish.** Sidecars first, the output object last, each put in one request (a multipart upload when large:
  S3 and GCS make an object visible only once its upload completes, which stands for the local rename); then
  the staging prefix is deleted (its manifest first, then the rest with the lease).

The spool lives under the temp folder (`embedcli-out-PID-*`) and is removed when the run ends; a `kill -9` leaves
it behind (the store's copy is the one a rerun resumes from), and the next store run of the same user removes the
spools of processes gone.

**The lock: a lease object, written then read back** (`URL.embedcli-staging/_embedcli/lock.json`: owner token,
host, boot id, pid, expiry). pyarrow's filesystems cannot make a conditional put (S3 `If-None-Match: *`, GCS
`ifGenerationMatch=0`), and adding botocore and a GCS client only for the lock would give S3 and GCS two
code paths and two new dependencies. So: a run refuses an unexpired lease of another owner (exit 1, as a locked
local output); otherwise it writes its own lease and reads it back, refusing when another owner's is there. The
lease is renewed, and re-checked, at every commit *before* the manifest object is put, so two runs that raced
past the read-back in the same instant find out at their next commit, before either commits over the other.
Between the last commit and the end (assembling the output, uploading it) a thread renews it (`Lease.kept`), and
the publish re-checks it first.
A lease is taken over once it expires, or at once when it names this host (same boot) and a process that no
longer exists (a run killed with `kill -9`, resumed on the same machine; containers that share a kernel and a
host name look like one machine here: give them distinct host names). Its length is the larger of ten
minutes and three times `--commit-every`, so a live run always renews it in time.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from embedcli.errors import EmbedcliError, InputError, UsageError
from embedcli.io.commit import INDEX_SUFFIX, STAGING_SUFFIX
from embedcli.io.errors import OutputError
from embedcli.io.formats import output_format
from embedcli.io.manifest import MANIFEST_NAME, META_DIR, Manifest, embedcli_metadata, output_metadata
from embedcli.io.objects import (
    delete,
    delete_prefix,
    download,
    is_object_url,
    list_under,
    parquet_schema_metadata,
    put_bytes,
    read_object,
    upload,
)

LOCK_NAME = f"{META_DIR}/lock.json"
MANIFEST_KEY = f"{META_DIR}/{MANIFEST_NAME}"
MIN_LEASE_SECONDS = 600.0
SIBLINGS = (INDEX_SUFFIX, ".meta.json", ".ids.jsonl")
"""Files kept beside an output (suffixes of its name), put before it and deleted with it."""


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Lease:
    """The lock of a store output's staging prefix: a lease object with an owner and an expiry (see the module)."""

    def __init__(self, url: str, output: str, seconds: float) -> None:
        self.url = url
        self.output = output
        self.seconds = seconds
        self.owner = secrets.token_hex(8)
        self.held = False

    def _read(self) -> dict[str, Any] | None:
        data = read_object(self.url)
        if data is None:
            return None
        try:
            lease = json.loads(data)
        except ValueError:
            return None
        return lease if isinstance(lease, dict) else None

    def _write(self) -> None:
        lease = {"owner": self.owner, "host": socket.gethostname(), "boot": _boot_id(), "pid": os.getpid(),
                 "expires": time.time() + self.seconds}
        put_bytes(self.url, json.dumps(lease, sort_keys=True).encode())

    def _refuse(self, lease: dict[str, Any]) -> OutputError:
        until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(lease.get("expires", 0))))
        return OutputError(
            self.output,
            f"another embedcli run is writing this output right now (its lease {self.url} is held by "
            f"{lease.get('host', '?')} pid {lease.get('pid', '?')} until {until})",
            fix="wait for it to finish (or stop it), then rerun; the lease of a run that died ends at that time",
        )

    def stale(self, lease: dict[str, Any]) -> bool:
        """Whether another owner's lease may be taken over: expired, or of a process gone on this very machine."""
        if float(lease.get("expires", 0)) < time.time():
            return True
        here = lease.get("host") == socket.gethostname() and lease.get("boot") == _boot_id()
        pid = lease.get("pid")
        return here and isinstance(pid, int) and pid != os.getpid() and not _alive(pid)

    def acquire(self) -> None:
        """Take the lease, or raise OutputError while another run holds it."""
        held = self._read()
        if held is not None and held.get("owner") != self.owner and not self.stale(held):
            raise self._refuse(held)
        self._write()
        back = self._read()
        if back is None or back.get("owner") != self.owner:
            raise self._refuse(back or {})
        self.held = True

    def renew(self) -> None:
        """Check the lease is still this run's and extend it (OutputError when another run took it over)."""
        back = self._read()
        if back is None or back.get("owner") != self.owner:
            self.held = False
            raise OutputError(self.output, f"another embedcli run took over its lock ({self.url})",
                              fix="let that run finish; this one committed nothing more")
        self._write()

    @contextlib.contextmanager
    def kept(self, every: float | None = None) -> Iterator[None]:
        """The lease renewed every `every` seconds (default: a quarter of its length) in a thread while the block
        runs: assembling and uploading a large output can outlast a lease, and no commit renews it meanwhile.

        A renewal that finds another owner (or cannot reach the store) ends the thread quietly: the next
        renewal in the run's own thread (`publish`'s first step) reports it. The thread is joined on the way
        out, so no renewal is in flight once the block is left.
        """
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(every if every is not None else self.seconds / 4):
                try:
                    self.renew()
                except (EmbedcliError, OSError):
                    return

        thread = threading.Thread(target=beat, name="embedcli-lease", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def release(self) -> None:
        """Delete the lease object if it is still this run's (idempotent)."""
        if not self.held:
            return
        self.held = False
        with contextlib.suppress(EmbedcliError):  # a store gone unreachable: the lease ends when it expires
            back = self._read()
            if back is not None and back.get("owner") == self.owner:
                delete(self.url)


SPOOL_PREFIX = "embedcli-out-"


def _sweep_spools() -> None:
    """Remove this user's spools whose process is gone (left by a `kill -9`)."""
    top = tempfile.gettempdir()
    try:
        names = os.listdir(top)
    except OSError:
        return
    for name in names:
        pid = name[len(SPOOL_PREFIX) :].split("-", 1)[0]
        if not name.startswith(SPOOL_PREFIX) or not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        path = os.path.join(top, name)
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            if st.st_uid == os.getuid() and os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)


def _signature(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


class StoreArea:
    """A store output's local spool and its mirror in the store (see the module docstring)."""

    def __init__(self, url: str, lease_seconds: float = MIN_LEASE_SECONDS) -> None:
        self.url = url
        self.staging = url + STAGING_SUFFIX
        _sweep_spools()
        self.spool = tempfile.mkdtemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-")
        self.name = url.rsplit("/", 1)[-1]
        self.local = os.path.join(self.spool, self.name)
        self.root = self.local + STAGING_SUFFIX
        self.lease = Lease(f"{self.staging}/{LOCK_NAME}", url, max(MIN_LEASE_SECONDS, lease_seconds))
        self._pushed: dict[str, tuple[int, int, int] | None] = {}  # staged name -> the local file put as it
        self._fetched: dict[str, tuple[int, int, int] | None] = {}  # output file name -> as fetched (None: absent)

    # -- start ---------------------------------------------------------------------------------------
    def open(self) -> None:
        """Take the lease and fetch the staged work it guards into the spool (the existing output waits for
        `existing_metadata` / `fetch_output`)."""
        self.lease.acquire()
        named = self._fetch_staging()
        for obj in list_under(self.staging):  # what no manifest names: a killed run's leftovers
            rel = obj[len(self.staging) + 1 :]
            if rel not in named and rel not in (MANIFEST_KEY, LOCK_NAME):
                delete(obj)

    def existing_metadata(self, fmt: str | None) -> dict[str, str] | None:
        """The existing output's embedcli metadata. A Parquet object's comes from its footer alone, so a rerun
        that finds its output complete (a nightly no-op) reads none of its rows; any other output is fetched
        first and read as a local one is (a JSONL/npy sidecar names the output's bytes; a foreign file is
        refused from its local copy)."""
        if not self._fetched and output_format(self.local, fmt, reading=True) == "parquet":
            raw = parquet_schema_metadata(self.url)
            meta = embedcli_metadata(raw) if raw is not None else None
            if meta is not None:
                return meta
        self.fetch_output()
        return output_metadata(self.local, fmt)

    def fetch_output(self) -> None:
        """Fetch the existing output object and its sidecars into the spool (once)."""
        if self._fetched:
            return
        for name in (*(self.name + s for s in SIBLINGS), self.name):
            local = os.path.join(self.spool, name)
            download(self._url(name), local)
            self._fetched[name] = _signature(local)

    def _url(self, name: str) -> str:
        return self.url[: len(self.url) - len(self.name)] + name

    def _fetch_staging(self) -> set[str]:
        data = read_object(f"{self.staging}/{MANIFEST_KEY}")
        if data is None:
            return set()
        try:
            manifest = Manifest.from_dict(json.loads(data))
        except (ValueError, TypeError):
            return set()  # unreadable: the run starts over, as over a local one
        os.makedirs(os.path.join(self.root, META_DIR))
        with open(os.path.join(self.root, MANIFEST_KEY), "xb") as f:
            f.write(data)
        named = set()
        for name in _staged_names(manifest):
            local = os.path.join(self.root, name)
            os.makedirs(os.path.dirname(local), exist_ok=True)
            if download(f"{self.staging}/{name}", local):
                self._pushed[name] = _signature(local)
                named.add(name)
        return named

    # -- commits -------------------------------------------------------------------------------------
    def committed(self, manifest: Manifest) -> None:
        """Mirror a commit: renew the lease, put the staged files not yet in the store, then the manifest."""
        self.lease.renew()
        for name in _staged_names(manifest):
            local = os.path.join(self.root, name)
            signature = _signature(local)
            if signature is not None and self._pushed.get(name) != signature:
                upload(local, f"{self.staging}/{name}")
                self._pushed[name] = signature
        upload(os.path.join(self.root, MANIFEST_KEY), f"{self.staging}/{MANIFEST_KEY}")

    # -- the end -------------------------------------------------------------------------------------
    def publish(self) -> None:
        """Mirror the end of a run: the output files it wrote or removed (sidecars first, the output last), then
        the staging prefix once the spool's staging folder is gone."""
        self.lease.renew()  # still this run's after assembling, or the run stops here
        with self.lease.kept():  # however long the uploads take
            for name in (*(self.name + s for s in SIBLINGS), self.name):
                local = os.path.join(self.spool, name)
                now = _signature(local)
                if now is None and self._fetched.get(name) is not None:
                    delete(self._url(name))
                elif now is not None and now != self._fetched.get(name):
                    upload(local, self._url(name))
                self._fetched[name] = now
        if os.path.exists(self.root):
            return
        delete(f"{self.staging}/{MANIFEST_KEY}")  # first: a prefix half deleted is never a manifest naming nothing
        delete_prefix(self.staging)  # the rest, the lease with it
        self.lease.held = False

    def kept(self) -> contextlib.AbstractContextManager[None]:
        """The lease renewed in a thread while the block runs (`Lease.kept`): a long assembly."""
        return self.lease.kept()

    def close(self) -> None:
        """Release the lease and remove the spool."""
        self.lease.release()
        shutil.rmtree(self.spool, ignore_errors=True)


def _staged_names(manifest: Manifest) -> list[str]:
    return [n for s in manifest.shards for n in (s.file, s.index, s.errors_file, s.refs) if n]


class LocalArea:
    """Today's staging area of a local output: written where it is named; nothing to mirror."""

    def __init__(self, path: str) -> None:
        self.local = path

    def open(self) -> None:
        """Nothing to fetch."""

    def existing_metadata(self, fmt: str | None) -> dict[str, str] | None:
        """The existing output's embedcli metadata (`output_metadata`)."""
        return output_metadata(self.local, fmt)

    def fetch_output(self) -> None:
        """Nothing to fetch: the output is where it is named."""

    def committed(self, manifest: Manifest) -> None:
        """Nothing to mirror: the local manifest rename was the commit."""

    def publish(self) -> None:
        """Nothing to mirror: the local rename was the publish."""

    def kept(self) -> contextlib.AbstractContextManager[None]:
        """Nothing to renew: a local output's lock is held by its process."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """Nothing to release."""


OutputArea = LocalArea | StoreArea
"""Where a staged run's output lives: `local` is the path it writes; `committed`, `publish` mirror it."""


@contextlib.contextmanager
def output_area(path: str, lease_seconds: float = MIN_LEASE_SECONDS) -> Iterator[OutputArea]:
    """The staging area of `-o path` (an object store's for `s3://`, `gs://`), opened; closed on the way out."""
    area: OutputArea = StoreArea(path, lease_seconds) if is_object_url(path) else LocalArea(path)
    try:
        area.open()
        yield area
    finally:
        area.close()


@contextlib.contextmanager
def fetched_output(flag: str, url: str) -> Iterator[str]:
    """A private local copy of the output object `url` with the sidecars beside it (its row index, ...), as
    `flag` reads it (`--previous`): its local path, removed on the way out. InputError when there is no such
    object; a folder of a killed run is swept as a spool is."""
    if url.endswith("/"):
        raise UsageError(f"{flag} {url}: a directory of shards is not read from an object store yet; name one "
                         "object (s3://BUCKET/out/vectors.parquet)")
    _sweep_spools()
    folder = tempfile.mkdtemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-")
    try:
        name = url.rsplit("/", 1)[-1]
        local = os.path.join(folder, name)
        if not download(url, local):
            raise InputError(url, f"no such object for {flag}", fix=f"check {flag}, or drop it for a full run")
        for suffix in SIBLINGS:
            download(url + suffix, local + suffix)
        yield local
    finally:
        shutil.rmtree(folder, ignore_errors=True)
