"""Google Cloud Storage backend (through obstore; everything but the client's
configuration is shared, see `statehold.storage.objectstore`).

obstore speaks GCS's XML API. `create_if_absent` is a PUT with
``x-goog-if-generation-match: 0`` (succeeds only if no live generation exists). GCS's
XML API has no multi-object delete (the JSON API's batch endpoint is not used by obstore),
so `delete_many` issues one DELETE per key, several at once.
"""

from __future__ import annotations

import os
from typing import Any

import obstore.exceptions as obe
from obstore.store import GCSStore

from statehold.storage.base import StorageError, check_key
from statehold.storage.objectstore import ObjectStorage, split_options


class GCSStorage(ObjectStorage):
    """Objects under ``gs://<bucket>/<prefix>``; keys are '/'-paths below the prefix."""

    scheme = "gs"
    bulk_delete = False

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint: str | None = None,
        service_account_key: str | None = None,
        application_credentials: str | None = None,
        bearer_token: str | None = None,
        allow_http: bool | None = None,
        **options: Any,
    ) -> None:
        """Credentials as obstore finds them (``GOOGLE_APPLICATION_CREDENTIALS``,
        ``GOOGLE_SERVICE_ACCOUNT_KEY``, the metadata server) unless given here.
        `endpoint` (or ``GOOGLE_BASE_URL``) points at another server, e.g. an emulator;
        `allow_http` (or ``GOOGLE_ALLOW_HTTP``) lets it be plain HTTP."""
        if not bucket or "/" in bucket:
            raise StorageError(f"bad GCS bucket name {bucket!r}")
        prefix = prefix.strip("/")
        check_key(prefix, allow_empty=True)
        endpoint = endpoint or options.pop("base_url", None) or os.environ.get("GOOGLE_BASE_URL")
        config: dict[str, Any] = {}
        for name, value in (
            ("base_url", endpoint),
            ("service_account_key", service_account_key),
            ("application_credentials", application_credentials),
            ("bearer_token", bearer_token),
        ):
            if value:
                config[name] = value
        client = split_options(config, {**options, "allow_http": allow_http}, "GOOGLE_ALLOW_HTTP")
        try:
            store = GCSStore(bucket, config=config or None, client_options=client)  # type: ignore[arg-type]
        except obe.BaseError as e:
            raise StorageError(f"cannot configure GCS store for bucket {bucket!r}: {e}") from e
        self._init(store, bucket, prefix, endpoint or "")
