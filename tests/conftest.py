"""Shared fixtures: a real S3 protocol server (moto) on 127.0.0.1, and storage roots on
both backends so every storage-touching test runs on local disk and on S3."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from statehold.storage import Storage, open_storage


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str
    access_key_id: str = "testing"
    secret_access_key: str = "testing"
    region: str = "us-east-1"

    @property
    def options(self) -> dict[str, object]:
        """Keyword options for `open_storage` on this server."""
        return {
            "endpoint": self.endpoint,
            "region": self.region,
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
            "allow_http": True,
        }

    @property
    def env(self) -> dict[str, str]:
        """The same settings as AWS_* environment variables, for subprocesses."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": self.region,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_ALLOW_HTTP": "true",
        }


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A moto S3 server on 127.0.0.1 (a real HTTP server speaking the S3 protocol)."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    info = S3Server(endpoint=f"http://{host}:{port}", bucket="statehold-test")
    client = boto3.client(
        "s3",
        endpoint_url=info.endpoint,
        aws_access_key_id=info.access_key_id,
        aws_secret_access_key=info.secret_access_key,
        region_name=info.region,
    )
    client.create_bucket(Bucket=info.bucket)
    yield info
    server.stop()


_counter = itertools.count()

StorageFactory = Callable[[], Storage]


@pytest.fixture(params=["local", "s3"])
def storage_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> StorageFactory:
    """Makes fresh, empty storage roots on the parametrized backend."""

    def make() -> Storage:
        n = next(_counter)
        if request.param == "local":
            return open_storage(str(tmp_path / f"root-{n}"))
        server: S3Server = request.getfixturevalue("s3_server")
        return open_storage(f"s3://{server.bucket}/t{os.getpid()}-{n}", **server.options)

    return make


@pytest.fixture
def storage(storage_factory: StorageFactory) -> Storage:
    """A fresh, empty storage root (a job directory), on local disk and on S3."""
    return storage_factory()
