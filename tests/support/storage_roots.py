"""Fresh storage roots on every backend: local disk, and the object store servers (S3 on
moto, GCS on fake-gcs-server, Azure Blob on Azurite) that conftest's session fixtures
start."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from statehold.storage import Storage, open_storage
from tests.support.infra.object_store_servers import AzuriteServer, GCSServer, S3Server

_counter = itertools.count()

StorageFactory = Callable[[], Storage]


#: Object store backends: the server fixture and the URI scheme of each.
OBJECT_STORES = {"s3": ("s3_server", "s3"), "gcs": ("gcs_server", "gs"),
                 "azure": ("azurite_server", "az")}


Server = S3Server | GCSServer | AzuriteServer


def object_store_server(request: pytest.FixtureRequest, backend: str) -> Server:
    server: Server = request.getfixturevalue(OBJECT_STORES[backend][0])
    return server


def storage_factory_for(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> StorageFactory:
    """Makes fresh, empty storage roots on `backend` ("local", "s3", "gcs", "azure")."""

    def make() -> Storage:
        n = next(_counter)
        if backend == "local":
            return open_storage(str(tmp_path / f"root-{n}"))
        server = object_store_server(request, backend)
        bucket = server.container if isinstance(server, AzuriteServer) else server.bucket
        scheme = OBJECT_STORES[backend][1]
        return open_storage(f"{scheme}://{bucket}/t{os.getpid()}-{n}", **server.options)

    return make
