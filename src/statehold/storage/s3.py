"""S3-compatible object storage backend (through obstore).

Everything but the client's configuration is shared with the other object stores
(`statehold.storage.objectstore`). On S3, `create_if_absent` is a PUT with
``If-None-Match: *`` and `delete_many` uses DeleteObjects (up to 1000 keys a request).
"""

from __future__ import annotations

import os
from typing import Any

import obstore.exceptions as obe
from obstore.store import S3Store

from statehold.storage.base import StorageError, check_key
from statehold.storage.objectstore import ObjectStorage, split_options

#: S3's DeleteObjects takes at most this many keys per request.
DELETE_BATCH = 1000


class S3Storage(ObjectStorage):
    """Objects under ``s3://<bucket>/<prefix>``; keys are '/'-paths below the prefix."""

    scheme = "s3"
    delete_batch = DELETE_BATCH

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        allow_http: bool | None = None,
        **client_options: Any,
    ) -> None:
        if not bucket or "/" in bucket:
            raise StorageError(f"bad S3 bucket name {bucket!r}")
        prefix = prefix.strip("/")
        check_key(prefix, allow_empty=True)
        env = os.environ
        endpoint = endpoint or env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT")
        region = region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        access_key_id = access_key_id or env.get("AWS_ACCESS_KEY_ID")
        secret_access_key = secret_access_key or env.get("AWS_SECRET_ACCESS_KEY")

        config: dict[str, Any] = {}
        if endpoint:
            config["endpoint"] = endpoint
        if region:
            config["region"] = region
        if access_key_id:
            config["access_key_id"] = access_key_id
        if secret_access_key:
            config["secret_access_key"] = secret_access_key
        client = split_options(
            config, {**client_options, "allow_http": allow_http}, "AWS_ALLOW_HTTP"
        )
        try:
            store = S3Store(bucket, config=config or None, client_options=client)  # type: ignore[arg-type]
        except obe.BaseError as e:
            raise StorageError(f"cannot configure S3 store for bucket {bucket!r}: {e}") from e
        self._init(store, bucket, prefix, endpoint or "")
