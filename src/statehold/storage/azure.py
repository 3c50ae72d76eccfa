"""Azure Blob Storage backend (through obstore; everything but the client's configuration
is shared, see `statehold.storage.objectstore`).

`create_if_absent` is a Put Blob with ``If-None-Match: *``; `delete_many` goes through
the Blob Batch API (obstore sends up to 256 deletes per request). A batch reports a
missing blob as an error, so a batch that hits one is redone key by key.
"""

from __future__ import annotations

import os
from typing import Any, Self
from urllib.parse import urlsplit

import obstore.exceptions as obe
from obstore.store import AzureStore

from statehold.storage.base import StorageError, check_key
from statehold.storage.objectstore import ObjectStorage, split_options


def _account_from_endpoint(endpoint: str | None) -> str | None:
    """The account of a blob URL: the host's first label (``acct.blob.core.windows.net``),
    or the first path segment where the host is an emulator's (``127.0.0.1:10000/acct``)."""
    if not endpoint:
        return None
    parsed = urlsplit(endpoint)
    segment = parsed.path.strip("/").split("/", 1)[0]
    if segment:
        return segment
    host = parsed.hostname or ""
    return host.split(".", 1)[0] if ".blob." in host else None


class AzureStorage(ObjectStorage):
    """Blobs under ``az://<container>/<prefix>``; keys are '/'-paths below the prefix."""

    scheme = "az"

    def __init__(
        self,
        container: str,
        prefix: str = "",
        *,
        account_name: str | None = None,
        account_key: str | None = None,
        sas_key: str | None = None,
        endpoint: str | None = None,
        allow_http: bool | None = None,
        **options: Any,
    ) -> None:
        """Account and credentials as obstore finds them (``AZURE_STORAGE_ACCOUNT_NAME``,
        ``AZURE_STORAGE_ACCOUNT_KEY``, ``AZURE_STORAGE_SAS_KEY``, a managed identity, the
        Azure CLI) unless given here. `endpoint` (or ``AZURE_STORAGE_ENDPOINT``) is the
        account's blob URL, e.g. ``http://127.0.0.1:10000/devstoreaccount1`` for Azurite;
        `allow_http` (or ``AZURE_ALLOW_HTTP``) lets it be plain HTTP."""
        if not container or "/" in container:
            raise StorageError(f"bad Azure container name {container!r}")
        prefix = prefix.strip("/")
        check_key(prefix, allow_empty=True)
        env = os.environ
        endpoint = endpoint or env.get("AZURE_STORAGE_ENDPOINT") or env.get("AZURE_ENDPOINT")
        account_name = account_name or env.get("AZURE_STORAGE_ACCOUNT_NAME")
        config: dict[str, Any] = {}
        for name, value in (
            ("account_name", account_name),
            ("account_key", account_key),
            ("sas_key", sas_key),
            ("endpoint", endpoint),
        ):
            if value:
                config[name] = value
        client = split_options(config, {**options, "allow_http": allow_http}, "AZURE_ALLOW_HTTP")
        try:
            store = AzureStore(container, config=config or None, client_options=client)  # type: ignore[arg-type]
        except obe.BaseError as e:
            raise StorageError(
                f"cannot configure Azure store for container {container!r}: {e}"
            ) from e
        #: The account and its blob URL as resolved here (None where obstore finds them
        #: itself); Spark's ABFS settings are derived from them (`statehold.spark.abfs_conf`).
        self.account_name: str | None = account_name or _account_from_endpoint(endpoint)
        self.blob_endpoint: str | None = endpoint
        self._init(store, container, prefix, endpoint or account_name or "")

    def child(self, prefix: str) -> Self:
        new = super().child(prefix)
        new.account_name, new.blob_endpoint = self.account_name, self.blob_endpoint
        return new
