"""Storage backends behind one interface; `open_storage` picks one from a URI."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlparse

from statehold.storage.base import (
    AlreadyExistsError,
    ConflictError,
    DeleteError,
    FileInfo,
    NotFoundError,
    Storage,
    StorageError,
    UnsafePathError,
    check_key,
)
from statehold.storage.local import LocalStorage

__all__ = [
    "AlreadyExistsError",
    "ConflictError",
    "DeleteError",
    "FileInfo",
    "LocalStorage",
    "NotFoundError",
    "Storage",
    "StorageError",
    "UnsafePathError",
    "check_key",
    "open_storage",
]


def open_storage(uri: str, **options: Any) -> Storage:
    """Open a plain path, ``file://`` URI, ``s3://bucket/prefix``, ``gs://bucket/prefix``
    or ``az://container/prefix`` (also ``abfs[s]://container@account.dfs.core.windows.net/
    prefix``).

    Object store options (else taken from each store's usual environment variables):
    S3: ``endpoint``, ``region``, ``access_key_id``, ``secret_access_key``,
    ``allow_http``; GCS: ``endpoint``, ``service_account_key``,
    ``application_credentials``, ``bearer_token``, ``allow_http``; Azure:
    ``account_name``, ``account_key``, ``sas_key``, ``endpoint``, ``allow_http``. Other
    options go to obstore's store or HTTP client configuration.
    """
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and uri[1:3] == ":\\"):
        path = unquote(parsed.path) if parsed.scheme == "file" else uri
        return LocalStorage(path)
    prefix = parsed.path.strip("/")
    if parsed.scheme in ("s3", "s3a"):
        from statehold.storage.s3 import S3Storage

        return S3Storage(parsed.netloc, prefix, **options)
    if parsed.scheme in ("gs", "gcs"):
        from statehold.storage.gcs import GCSStorage

        return GCSStorage(parsed.netloc, prefix, **options)
    if parsed.scheme in ("az", "azure", "abfs", "abfss"):
        from statehold.storage.azure import AzureStorage

        container, at, host = parsed.netloc.partition("@")
        if at and "account_name" not in options:  # container@account.dfs.core.windows.net
            options["account_name"] = host.split(".", 1)[0]
        return AzureStorage(container, prefix, **options)
    raise StorageError(f"unsupported storage URI scheme {parsed.scheme!r} in {uri!r}")
