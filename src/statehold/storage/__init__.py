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
    """Open a plain path, ``file://`` URI or ``s3://bucket/prefix``.

    S3 options (else taken from the usual AWS_* environment variables): ``endpoint``,
    ``region``, ``access_key_id``, ``secret_access_key``, ``allow_http``.
    """
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and uri[1:3] == ":\\"):
        path = unquote(parsed.path) if parsed.scheme == "file" else uri
        return LocalStorage(path)
    if parsed.scheme in ("s3", "s3a"):
        from statehold.storage.s3 import S3Storage

        return S3Storage(parsed.netloc, parsed.path.strip("/"), **options)
    raise StorageError(f"unsupported storage URI scheme {parsed.scheme!r} in {uri!r}")
