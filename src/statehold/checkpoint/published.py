"""Is checkpoint N published? Asked of the HA store alone, by an epoch still current.

The HA store is the only record of what is retained, so everything that must never touch a
published checkpoint asks here: the write-once ``chk-N/_metadata`` (a zombie attempt never
overwrites the current attempt's document, nor a published one), the settling of a publish
whose outcome is unknown, and an abort that must not delete a checkpoint that landed.
"""

from __future__ import annotations

from statehold.errors import CheckpointError
from statehold.format import layout
from statehold.format.metadata import MetadataError, decode
from statehold.ha.base import CheckpointPointer, FencedError, HAStore
from statehold.storage.base import AlreadyExistsError, ConflictError, NotFoundError, Storage


def listed(ha: HAStore, epoch: int, checkpoint_id: int, checksum: str | None) -> bool:
    """Does the HA store list checkpoint N (with that document)? FencedError if `epoch`
    is no longer current; the store's own error if it cannot be read."""
    state = ha.read()
    if state.epoch != epoch:
        raise FencedError(f"epoch {epoch} is fenced: current is {state.epoch}")
    return any(
        p.checkpoint_id == checkpoint_id and (checksum is None or p.checksum == checksum)
        for p in state.retained
    )


def may_be_listed(ha: HAStore, epoch: int, checkpoint_id: int) -> bool:
    """Might the HA store list checkpoint N? Only its answer to a current `epoch` that N
    is not listed is a no: an error, fenced or not, is a maybe."""
    try:
        return listed(ha, epoch, checkpoint_id, None)
    except Exception:
        return True


def publish_settled(
    ha: HAStore, epoch: int, pointers: list[CheckpointPointer], checkpoint_id: int,
    checksum: str,
) -> bool:
    """Publish `pointers` (N's with `checksum` among them). A publish whose outcome is
    unknown is settled by reading the store: True if it failed but landed; its error
    again if N is not (known to be) listed. FencedError always propagates."""
    try:
        ha.publish(epoch, pointers)
    except FencedError:
        raise
    except Exception:
        if not listed(ha, epoch, checkpoint_id, checksum):
            raise
        return True
    return False


def write_metadata_once(
    storage: Storage, ha: HAStore, epoch: int, metadata_key: str, data: bytes
) -> None:
    """Create ``chk-N/_metadata``. An existing document is replaced only if this or an
    older epoch wrote it (an aborted try of N, or a crashed attempt's leftover) and
    the HA store does not list N; a newer attempt's document, or a published one, is
    never overwritten.

    The replace is conditional on the version that was checked, and nothing here deletes:
    checkpoint ids are Spark batch ids, reused after a failure, so a zombie paused between
    its check and an unconditional delete removed the document a newer attempt had
    written and published meanwhile (simulation, seed 10129)."""
    checkpoint_id = layout.parse(metadata_key).checkpoint_id
    assert checkpoint_id is not None
    for _ in range(10):
        try:
            storage.create_if_absent(metadata_key, data)
            return
        except AlreadyExistsError:
            pass
        try:
            existing, version = storage.read_versioned(metadata_key)
        except NotFoundError:
            continue  # removed meanwhile (the job moved past N): create it again
        try:
            existing_epoch = decode(existing, metadata_key).epoch
        except MetadataError:
            existing_epoch = -1  # torn or foreign: not a valid document of anyone
        if existing_epoch > epoch:
            raise CheckpointError(f"{metadata_key} was already written by epoch {existing_epoch}")
        if listed(ha, epoch, checkpoint_id, None):  # also FencedError if no longer current
            raise CheckpointError(f"{metadata_key} is published already; not replaced")
        try:
            storage.replace_if_version(metadata_key, version, data)
            return
        except ConflictError:
            pass  # another attempt wrote it since: look again
    raise CheckpointError(f"could not write {metadata_key}: contention")
