"""Choose the HA store from one setting, so a pipeline moves from a laptop (embedded, no
server) to a cluster (ZooKeeper) by changing a URI, not code.

    None or "embedded"                    pointers in ``<job>/_ha/`` on the job's storage
    "zookeeper://host:port[,host:port]/path"  znode ``<path>/<job_id>`` in that ensemble
"""

from __future__ import annotations

from statehold.errors import InvalidArgumentError, is_missing_extra, missing_extra
from statehold.ha.base import HAStore
from statehold.ha.embedded import EmbeddedHAStore
from statehold.ha.uri import URI_SCHEME
from statehold.storage.base import Storage

EMBEDDED = "embedded"


def open_ha_store(uri: str | None, job_storage: Storage, job_id: str) -> HAStore:
    """The HA store named by `uri` for the job whose directory is `job_storage`.

    InvalidArgumentError (a ValueError) for anything that is not ``embedded`` or a
    ``zookeeper://`` URI, so a typo never silently falls back to another store (two
    drivers on different stores would not fence each other). The ZooKeeper client
    (kazoo, the ``zookeeper`` extra) is imported only here, when a store needs it;
    MissingExtraError says how to install it."""
    if uri is None or uri.strip() == EMBEDDED:
        return EmbeddedHAStore(job_storage)
    text = uri.strip()
    if text.startswith(f"{URI_SCHEME}://"):
        try:
            from statehold.ha.zookeeper import ZooKeeperHAStore
        except ModuleNotFoundError as exc:
            if not is_missing_extra(exc, "zookeeper"):
                raise
            raise missing_extra(exc, "zookeeper", f"the HA store {text}") from exc
        return ZooKeeperHAStore.from_uri(text, job_id)
    raise InvalidArgumentError(
        f"unknown HA store {uri!r}: use {EMBEDDED!r} (the default, pointers on the "
        f"checkpoint storage) or {URI_SCHEME}://host:port[,host:port]/path"
    )


__all__ = ["EMBEDDED", "open_ha_store"]
