"""HA stores: the embedded default (pointers on the checkpoint storage) and ZooKeeper."""

from statehold.ha.base import CheckpointPointer, FencedError, HAState, HAStore, HAStoreError

__all__ = ["CheckpointPointer", "FencedError", "HAState", "HAStore", "HAStoreError"]
