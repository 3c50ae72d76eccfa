"""HA stores: the embedded default (pointers on the checkpoint storage) and ZooKeeper."""

from statehold.ha.base import CheckpointPointer, FencedError, HAState, HAStore, HAStoreError
from statehold.ha.embedded import EmbeddedHAStore
from statehold.ha.zookeeper import ZooKeeperHAStore

__all__ = [
    "CheckpointPointer",
    "EmbeddedHAStore",
    "FencedError",
    "HAState",
    "HAStore",
    "HAStoreError",
    "ZooKeeperHAStore",
]
