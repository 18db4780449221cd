"""One real Ray cluster for the distributed tests: a head node and a second node on 127.0.0.1.

Both are started with `ray start --block` (each node 1 CPU, a small object store, token authentication with
a token made for the session, its own temp folder) and stopped at the end of the session: their process
groups are signalled, then every process still naming the cluster's temp folder is killed by its id.
The test process joins the cluster as a driver (for in-process CLI runs); `ray_env` is the environment a
subprocess driver needs to join it too.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
STARTUP_S = 90

# Read by Ray when it is imported (before any test module here imports it): every driver of the session,
# this process included, authenticates to the test cluster with a token made for the session. An xdist
# worker makes its own (it inherits the controller's environment): each worker's cluster has its own, so
# the actors a test finds by it (`RayCluster.worker_pids`) are its cluster's, not the other worker's.
os.environ.setdefault("RAY_AUTH_MODE", "token")
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@dataclass(frozen=True)
class RayCluster:
    """The session's cluster: its address, the environment a driver needs, its temp folder."""

    address: str
    env: dict[str, str]
    temp_dir: str

    def processes(self) -> list[tuple[int, str]]:
        """(pid, command line) of the cluster's processes (those naming its temp folder), workers included."""
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue
            if self.temp_dir in cmd:
                found.append((int(entry.name), cmd))
        return found

    @staticmethod
    def busy(pids: list[int]) -> list[int]:
        """Those of actor processes `pids` doing a task now (Ray titles an actor's process
        `ray::MapWorker(...).submit` while it runs one): their titles alone read, so a slice of a few
        milliseconds is caught where a scan of every process would miss it."""
        found = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().decode("utf-8", "replace").rstrip("\0 ").endswith(".submit"):
                        found.append(pid)
            except OSError:
                continue
        return found

    def worker_pids(self) -> list[int]:
        """The processes running the Ray Data engine's actors (`ray::MapWorker(...)`)."""
        pids = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    cmd = f.read().decode("utf-8", "replace")
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    env = f.read()
            except OSError:
                continue
            if cmd.startswith("ray::MapWorker") and self.env["RAY_AUTH_TOKEN"].encode() in env:
                pids.append(int(entry.name))
        return pids


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, str(HERE / "ray_node.py"), "start", "--block", *args], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(procs: list[subprocess.Popen[bytes]], cluster: RayCluster) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # the group `ray start` leads: its raylet, GCS and helpers
        p.wait(timeout=30)
    deadline = time.monotonic() + 10
    while (left := cluster.processes()) and time.monotonic() < deadline:
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """The session's two-node cluster on 127.0.0.1 (see the module docstring), joined by this process."""
    ray = pytest.importorskip("ray")
    import ray_node  # noqa: F401  # this process, a driver of the cluster, keeps 127.0.0.1 as the nodes do
    temp_dir = tempfile.mkdtemp(prefix="ecray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        # A subprocess driver keeps 127.0.0.1 as ray_node.py does for the nodes (Ray's switch for a one-host
        # cluster, read when Ray is imported).
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }
    node = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--object-store-memory=200000000",
            f"--temp-dir={temp_dir}", "--disable-usage-stats", "--dashboard-agent-listen-port=0"]
    cluster = RayCluster(f"127.0.0.1:{port}", {k: v for k, v in env.items() if k.startswith(("RAY_", "PYTHONPATH"))},
                         temp_dir)
    procs = [_start(["--head", f"--port={port}", "--include-dashboard=false", *node],
                    {**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}, Path(temp_dir) / "head.log")]
    try:
        _wait_for(ray, cluster, procs, nodes=1)
        procs.append(_start([f"--address={cluster.address}", *node], {**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"},
                            Path(temp_dir) / "worker.log"))
        ray.init(address=cluster.address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
        try:
            _wait_for(ray, cluster, procs, nodes=2)
        finally:
            ray.shutdown()
        yield cluster
    finally:
        _stop(procs, cluster)
        subprocess.run(["rm", "-rf", temp_dir], check=False)


@pytest.fixture(scope="module")
def ray_driver(ray_cluster: RayCluster) -> Iterator[RayCluster]:
    """This process joined to the session's cluster for a module's in-process runs (left at its end, so a
    later test may start a Ray of its own)."""
    import ray

    ray.init(address=ray_cluster.address, include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=False)
    try:
        yield ray_cluster
    finally:
        ray.shutdown()


def _wait_for(ray, cluster: RayCluster, procs: list[subprocess.Popen[bytes]], nodes: int) -> None:  # type: ignore[no-untyped-def]
    """Until the head's GCS port answers (`nodes` 1) or `nodes` nodes are alive (this process joined)."""
    deadline = time.monotonic() + STARTUP_S
    host, port = cluster.address.split(":")
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                log = Path(cluster.temp_dir) / ("head.log" if p is procs[0] else "worker.log")
                raise RuntimeError(f"ray start exited {p.returncode}:\n{log.read_text()[-3000:]}")
        if ray.is_initialized():
            if sum(1 for n in ray.nodes() if n["Alive"]) >= nodes:
                return
        else:
            with socket.socket() as s:
                if s.connect_ex((host, int(port))) == 0:
                    return
        time.sleep(0.5)
    raise RuntimeError(f"the test Ray cluster did not come up with {nodes} nodes in {STARTUP_S} s")
