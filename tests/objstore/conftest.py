"""Real object stores on 127.0.0.1 for the session: moto's S3 server, a GCS emulator, a dataset Hub.

The CLI reaches them only the way a user's would: through the environment (`AWS_ENDPOINT_URL` and dummy
credentials; `STORAGE_EMULATOR_HOST`; `HF_ENDPOINT`), never through a client handed to embedcli. The SDK's own
files and the instance-metadata lookup are switched off, so nothing can reach any other address.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.hub_server import FakeHub, serving


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}): {log.read_text(errors='replace')[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the server did not listen on 127.0.0.1:{port} in {timeout:.0f} s")


class Server:
    """A server process on 127.0.0.1:PORT, logging to a file, stopped (and waited for) by `stop`."""

    def __init__(self, argv: list[str], port: int, log: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.out = open(log, "wb")  # closed by stop()
        self.proc = subprocess.Popen(argv, stdout=self.out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            _wait_listening(port, self.proc, log)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.close()


# S3 -----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """moto in server mode (a real S3 HTTP API) on 127.0.0.1, for the session."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed: pip install -e '.[test]'")
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    server = Server([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port, log)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_env(s3_server: Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a CLI run that reads the test's S3: the endpoint and dummy credentials, as a user sets them."""
    nowhere = str(tmp_path_factory.mktemp("aws") / "none")
    return {
        "AWS_ENDPOINT_URL": s3_server.url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": nowhere,
        "AWS_SHARED_CREDENTIALS_FILE": nowhere,
    }


class Bucket:
    """A fresh bucket of the test's S3 (made with boto3): `put(key, bytes)`, `url(key)`."""

    def __init__(self, client: Any, name: str) -> None:
        self.client = client
        self.name = name
        client.create_bucket(Bucket=name)

    def put(self, key: str, data: bytes | str) -> str:
        self.client.put_object(Bucket=self.name, Key=key, Body=data.encode() if isinstance(data, str) else data)
        return self.url(key)

    def url(self, key: str) -> str:
        return f"s3://{self.name}/{key}"


_buckets = iter(range(1_000_000))


@pytest.fixture
def bucket(s3_env: dict[str, str]) -> Bucket:
    """A fresh bucket on the session's S3 server."""
    import boto3

    client = boto3.client(
        "s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )
    return Bucket(client, f"bucket-{next(_buckets)}")


# GCS ----------------------------------------------------------------------------------------------------------


GCS_BUCKET = "gbucket"


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """gcp-storage-emulator (the GCS JSON API, in memory) on 127.0.0.1, with one bucket, for the session."""
    pytest.importorskip("gcp_storage_emulator", reason="gcp-storage-emulator is not installed: pip install -e '.[test]'")
    port = _free_port()
    root = tmp_path_factory.mktemp("gcs")
    argv = [sys.executable, "-m", "gcp_storage_emulator", "-d", str(root / "data"), "start", "--host", "127.0.0.1",
            "--port", str(port), "--in-memory", "--default-bucket", GCS_BUCKET]
    server = Server(argv, port, root / "gcs.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def gcs_env(gcs_server: Server) -> dict[str, str]:
    """The environment of a CLI run that reads the test's GCS emulator (as google-cloud-storage and gcsfs read it)."""
    return {"STORAGE_EMULATOR_HOST": gcs_server.url}


@pytest.fixture(scope="session")
def gcs_put(gcs_server: Server) -> Callable[[str, bytes | str], str]:
    """`gcs_put(key, bytes) -> gs://URL`: an object in the emulator's bucket."""
    import datetime

    import pyarrow.fs as pafs

    fs = pafs.GcsFileSystem(anonymous=True, scheme="http", endpoint_override=f"127.0.0.1:{gcs_server.port}",
                            retry_time_limit=datetime.timedelta(seconds=5))

    def put(key: str, data: bytes | str) -> str:
        with fs.open_output_stream(f"{GCS_BUCKET}/{key}") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        return f"gs://{GCS_BUCKET}/{key}"

    return put


# The Hub ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def dataset_hub() -> Iterator[FakeHub]:
    """A dataset Hub on 127.0.0.1 (tests/fixtures/hub_server.py), empty until a test adds repos."""
    with serving() as hub:
        yield hub


def hub_env(hub: FakeHub) -> dict[str, str]:
    """The environment of a CLI process that reads `hf://` from the test's Hub (huggingface_hub reads it at import)."""
    return {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_TOKEN": "", "HF_HUB_DISABLE_TELEMETRY": "1"}
