"""HA stores: the embedded default (pointers on the checkpoint storage) and ZooKeeper.

`ZooKeeperHAStore` is imported on first use: its client (kazoo) is the ``zookeeper``
extra, which Spark's executors do not install and never import."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from statehold.ha.base import CheckpointPointer, FencedError, HAState, HAStore, HAStoreError
from statehold.ha.embedded import EmbeddedHAStore

if TYPE_CHECKING:
    from statehold.ha.zookeeper import ZooKeeperHAStore


def __getattr__(name: str) -> Any:
    if name == "ZooKeeperHAStore":
        from statehold.ha.zookeeper import ZooKeeperHAStore

        return ZooKeeperHAStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CheckpointPointer",
    "EmbeddedHAStore",
    "FencedError",
    "HAState",
    "HAStore",
    "HAStoreError",
    "ZooKeeperHAStore",
]
