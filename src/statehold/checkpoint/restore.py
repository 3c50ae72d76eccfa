"""Restore a new job from another job's checkpoint or a savepoint (no-claim and claim).

Both modes make the new job directory self-contained *before* the new job starts: every
file the source checkpoint references is brought into the new directory — copied
(server-side copy or hard link, never re-read and re-uploaded through the tasks) for
no-claim, moved for claim — under its own name, then a ``chk-N/_metadata`` naming only
files inside the new directory is written and published in the new job's HA store. From
then on the new job resumes from its own checkpoint like after any restart: its first
completed checkpoint references nothing outside its directory, and the lineage records
that the source is no longer needed.

Idempotent: a restore interrupted by a crash is simply run again (files already in place
are skipped); once the new job's HA store names a checkpoint, restore does nothing.
"""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from statehold.checkpoint.copy_log import CopyLog
from statehold.checkpoint.published import write_metadata_once
from statehold.errors import StateholdError
from statehold.format import layout
from statehold.format.layout import Scope
from statehold.format.metadata import (
    CheckpointMetadata,
    Lineage,
    RestoreMode,
    StateFile,
    check_stored,
    decode,
    encode,
    read_metadata,
)
from statehold.ha.base import CheckpointPointer, HAStore, HAStoreError
from statehold.storage.base import NotFoundError, Storage

log = logging.getLogger("statehold.checkpoint.restore")


class RestoreError(StateholdError):
    """The source cannot be restored as asked."""


@dataclass(frozen=True, slots=True)
class RestoreReport:
    mode: RestoreMode
    checkpoint_id: int
    files: int
    bytes: int
    skipped: bool = False


def _target_key(source_key: str, scope: Scope) -> str:
    """Where a source file lives in the new job: same directory and name for shared,
    exclusive and task-owned files; a savepoint's own exclusive copies go to exclusive/."""
    name = source_key.rsplit("/", 1)[-1]
    if source_key.startswith(f"{layout.SAVEPOINTS_DIR}/"):
        return f"{layout.EXCLUSIVE_DIR}/{name}" if scope is not Scope.TASKOWNED else (
            f"{layout.TASKOWNED_DIR}/{name}"
        )
    return source_key


def restore_into(
    source: Storage,
    source_metadata_key: str,
    target: Storage,
    ha: HAStore,
    *,
    job_id: str,
    mode: RestoreMode,
    threads: int = 8,
) -> RestoreReport:
    """Make `target` (a new job directory) hold a restorable copy of the source checkpoint.

    `source` is the source job directory; `source_metadata_key` its ``chk-N/_metadata``
    or ``savepoints/NAME/_metadata``. The source is never modified by no-claim; claim
    moves the referenced files out of it (the source job must not run again)."""
    if mode is RestoreMode.RESUME:
        raise RestoreError("resume restores a job from its own directory; nothing to copy")
    if source.uri.rstrip("/") == target.uri.rstrip("/"):
        raise RestoreError(f"{target.uri}: a {mode} restore needs a new job directory")
    meta = read_metadata(source, source_metadata_key)
    state = ha.read()
    if state.retained:
        log.info("%s already has checkpoints: resuming, not restoring again", target.uri)
        return RestoreReport(mode, state.retained[-1].checkpoint_id, 0, 0, skipped=True)

    moves = _moves(source, source_metadata_key, meta)
    moved_bytes = _bring_all(source, target, mode, moves, threads)

    newest = max((layout.parse(dst).epoch or 0 for _src, dst, _f in moves), default=0)
    epoch = _claim_above(ha, newest)
    metadata_key = layout.checkpoint_metadata_key(meta.checkpoint_id)
    relocated = _relocate(meta, source_metadata_key, metadata_key, moves)
    restored = relocated.model_copy(
        update={
            "job_id": job_id,
            "epoch": epoch,
            "kind": "checkpoint",
            "savepoint_name": None,
            "lineage": Lineage(
                mode=mode,
                source=f"{source.uri.rstrip('/')}/{source_metadata_key}",
                source_job_id=meta.job_id,
                source_checkpoint_id=meta.checkpoint_id,
                source_needed=False,
            ),
        }
    )
    data = encode(restored, metadata_key)
    # An existing document is an interrupted restore's leftover, or the document of a
    # restore into the same job running beside this one: replaced only if no newer epoch
    # wrote it and nothing publishes it, compared and put in one step (two runs of one
    # restore at once: the fenced one overwrote the document the other had published;
    # simulation, concurrent restores).
    write_metadata_once(target, ha, epoch, metadata_key, data)
    restored = decode(data, metadata_key)
    ha.publish(
        epoch,
        [CheckpointPointer(restored.checkpoint_id, metadata_key, epoch, restored.checksum)],
    )
    log.info(
        "%s: restored checkpoint %d of job %s (%s, %d files)",
        target.uri, meta.checkpoint_id, meta.job_id, mode, len(moves),
    )
    return RestoreReport(mode, meta.checkpoint_id, len(moves), moved_bytes)


#: A file to bring: its source key, its key in the new job, its entry in the metadata.
Move = tuple[str, str, StateFile]


def _moves(source: Storage, source_metadata_key: str, meta: CheckpointMetadata) -> list[Move]:
    moves: list[Move] = []
    for _op, _kg, f in meta.state_files():
        if f.external:
            raise RestoreError(f"{source.uri}/{source_metadata_key}: references external {f.path}")
        key = layout.resolve(source_metadata_key, f.path)
        moves.append((key, _target_key(key, f.scope), f))
    return moves


def _bring_all(
    source: Storage, target: Storage, mode: RestoreMode, moves: list[Move], threads: int
) -> int:
    """Bring every file into `target` (moved for claim, copied otherwise) on `threads`
    threads; the bytes actually brought (an interrupted restore's files are kept)."""
    copied = CopyLog(log, f"{target.uri}: restore from {source.uri}", len(moves),
                     sum(f.size for _src, _dst, f in moves))

    def bring(item: Move) -> int:
        """Bring one file (unless an interrupted restore already did) and check it: size
        and checksum, in the pool, so nothing is published unless every file is what the
        metadata says."""
        src, dst, f = item
        have = target.stat(dst)
        brought = 0
        if have is None or have.size != f.size:
            try:
                if mode is RestoreMode.CLAIM:
                    source.move(src, dst, target=target)
                else:
                    source.copy(src, dst, target=target)
            except NotFoundError as e:
                raise RestoreError(f"{source.uri}/{src}: missing, cannot restore: {e}") from e
            brought = f.size
        for key, why in check_stored(target, {dst: f}):
            raise RestoreError(
                f"{target.uri}/{key}: does not match the source checkpoint ({why}); "
                "nothing published"
            )
        copied.add(f.size)
        return brought

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return sum(pool.map(bring, moves))


def _claim_above(ha: HAStore, floor: int) -> int:
    """Claim the new job's epoch above every restored file's: the files keep their
    names, and the deletion policy never deletes a file of an epoch newer than the job's,
    so a file named by a later epoch of the source would never be reclaimed once no
    checkpoint needs it (found by the simulation, seed 21). A fresh store is seeded at
    `floor`; one an interrupted restore already used claims until it is above."""
    if ha.read().epoch < floor:
        # (not fresh, or a store that cannot be seeded: claimed past below)
        with contextlib.suppress(HAStoreError):
            ha.seed(floor, [])
    epoch = ha.claim_epoch().epoch
    while epoch <= floor:
        epoch = ha.claim_epoch().epoch
    return epoch


def _relocate(
    meta: CheckpointMetadata,
    source_metadata_key: str,
    metadata_key: str,
    moves: list[Move],
) -> CheckpointMetadata:
    """The same document with every path relative to the new `_metadata`."""
    new_path = {src: dst for src, dst, _f in moves}
    operators = []
    for op in meta.operators:
        ranges = []
        for kg in op.ranges:
            files = [
                f.model_copy(
                    update={
                        "path": layout.relativize(
                            metadata_key, new_path[layout.resolve(source_metadata_key, f.path)]
                        )
                    }
                )
                for f in kg.files
            ]
            ranges.append(kg.model_copy(update={"files": files}))
        operators.append(op.model_copy(update={"ranges": ranges}))
    return meta.model_copy(update={"operators": operators})
