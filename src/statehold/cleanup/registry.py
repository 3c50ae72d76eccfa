"""The shared-state registry: which holder references which physical file right now.

Lifecycle invariant 4 (DESIGN.md): when a checkpoint is subsumed or aborted, only the
files nobody else still references may be discarded. Files are keyed by their key in the
job directory (``shared/e1-c3-...``), so a file reused by many incremental checkpoints
is counted once, and every holder that references it is known by name, not just by a
count: a retained checkpoint, a pending checkpoint (protected until it completes or
aborts) or a savepoint (protected until it is explicitly disposed).

Pure in-memory bookkeeping that reads no storage: after a restart it is built from the
retained checkpoints' and savepoints' documents the caller already read
(`from_metadata`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from statehold.cleanup.discard import Discard
from statehold.errors import InvalidArgumentError, StateholdError
from statehold.format import layout
from statehold.format.layout import Kind, Scope
from statehold.format.metadata import (
    CheckpointMetadata,
    MetadataError,
    referenced_keys,
)


class UnknownCheckpointError(StateholdError, KeyError):
    """The registry holds no checkpoint of that id."""


@dataclass(frozen=True, slots=True, order=True)
class CheckpointHolder:
    """Checkpoint `checkpoint_id` (pending or completed) references the file."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True, order=True)
class SavepointHolder:
    """Savepoint `name` references the file (released only by an explicit dispose)."""

    name: str


@dataclass(frozen=True, slots=True, order=True)
class QuarantineHolder:
    """A damaged document (`metadata_key`) may still name the file: kept until a person
    disposes of the document."""

    metadata_key: str


Holder = CheckpointHolder | SavepointHolder | QuarantineHolder


@dataclass(frozen=True, slots=True)
class FileEntry:
    """A snapshot of what the registry knows about one file."""

    key: str
    scope: Scope
    #: The checkpoint that wrote the file (from its name), else the first to register it.
    created_by: int | None
    #: The newest checkpoint that referenced the file.
    last_used_by: int | None
    holders: frozenset[Holder]


@dataclass(slots=True)
class _Entry:
    scope: Scope
    created_by: int | None
    last_used_by: int | None
    holders: set[Holder] = field(default_factory=set)


@dataclass(slots=True)
class _Checkpoint:
    pending: bool
    files: set[str] = field(default_factory=set)


def _merge_scope(old: Scope, new: Scope) -> Scope:
    """Conflicting scopes resolve to the more protective one: TASKOWNED is never deleted
    by us, and a file two holders call SHARED and EXCLUSIVE is evidently shared."""
    if Scope.TASKOWNED in (old, new):
        return Scope.TASKOWNED
    if Scope.SHARED in (old, new):
        return Scope.SHARED
    return old


class SharedStateRegistry:
    """Reference tracking for the files of checkpoints and savepoints.

    Every method is thread-safe (the coordinator and the cleaner may call from
    different threads). Releasing returns a `Discard` for the cleaner; the registry never
    deletes anything itself.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._entries: dict[str, _Entry] = {}
        self._checkpoints: dict[int, _Checkpoint] = {}
        self._savepoints: dict[str, set[str]] = {}

    # -- registering -------------------------------------------------------------------
    def register_checkpoint(
        self, checkpoint_id: int, files: Mapping[str, Scope], *, pending: bool = False
    ) -> None:
        """Record that checkpoint `checkpoint_id` references `files` (key -> scope).

        Calling again for the same id adds files (tasks may report one by one); the
        `pending` flag must then match the checkpoint's state."""
        if checkpoint_id < 0:
            raise InvalidArgumentError(f"negative checkpoint id {checkpoint_id}")
        infos = {key: layout.parse(key) for key in files}  # refuses unsafe keys first
        with self._lock:
            ckpt = self._checkpoints.get(checkpoint_id)
            if ckpt is None:
                ckpt = self._checkpoints[checkpoint_id] = _Checkpoint(pending=pending)
            elif ckpt.pending != pending:
                state = "pending" if ckpt.pending else "completed"
                raise InvalidArgumentError(
                    f"checkpoint {checkpoint_id} is already registered as {state}"
                )
            holder = CheckpointHolder(checkpoint_id)
            for key, scope in files.items():
                entry = self._add(key, scope, infos[key], holder, fallback_creator=checkpoint_id)
                if entry.last_used_by is None or checkpoint_id > entry.last_used_by:
                    entry.last_used_by = checkpoint_id
                ckpt.files.add(key)

    def complete(self, checkpoint_id: int) -> None:
        """Pending -> completed (idempotent). UnknownCheckpointError (a KeyError) if the id is
        not registered."""
        with self._lock:
            ckpt = self._checkpoints.get(checkpoint_id)
            if ckpt is None:
                raise UnknownCheckpointError(f"checkpoint {checkpoint_id} is not registered")
            ckpt.pending = False

    def register_savepoint(self, name: str, files: Mapping[str, Scope]) -> None:
        """Record that savepoint `name` references `files`; adds to an existing one."""
        layout.check_savepoint_name(name)
        infos = {key: layout.parse(key) for key in files}
        with self._lock:
            held = self._savepoints.setdefault(name, set())
            holder = SavepointHolder(name)
            for key, scope in files.items():
                self._add(key, scope, infos[key], holder, fallback_creator=None)
                held.add(key)

    def register_quarantined(self, metadata_key: str, files: Iterable[str]) -> None:
        """A document that cannot be verified may still name `files`: hold them."""
        holder = QuarantineHolder(metadata_key)
        with self._lock:
            for key in files:
                self._add(key, Scope.SHARED, layout.parse(key), holder, fallback_creator=None)

    def _add(
        self,
        key: str,
        scope: Scope,
        info: layout.PathInfo,
        holder: Holder,
        fallback_creator: int | None,
    ) -> _Entry:
        scope = Scope(scope)
        if info.kind is Kind.TASKOWNED:
            scope = Scope.TASKOWNED  # where it lives decides: the task owns it
        entry = self._entries.get(key)
        if entry is None:
            created = info.checkpoint_id if info.checkpoint_id is not None else fallback_creator
            entry = self._entries[key] = _Entry(scope, created, None)
        else:
            entry.scope = _merge_scope(entry.scope, scope)
            if entry.created_by is None:
                entry.created_by = fallback_creator
        entry.holders.add(holder)
        return entry

    # -- releasing ---------------------------------------------------------------------
    def release_checkpoint(self, checkpoint_id: int, *, reason: str = "") -> Discard:
        """Checkpoint `checkpoint_id` is subsumed or aborted: drop its references and
        return what may be deleted now — its files nobody else references (never
        TASKOWNED) and its directory ``chk-N``. Idempotent: an unknown id returns only
        the directory."""
        with self._lock:
            ckpt = self._checkpoints.pop(checkpoint_id, None)
            files = ckpt.files if ckpt is not None else set()
            if not reason:
                state = "aborted" if ckpt is not None and ckpt.pending else "released"
                reason = f"checkpoint {checkpoint_id} {state}"
            return self._release(
                CheckpointHolder(checkpoint_id),
                files,
                layout.checkpoint_dir(checkpoint_id),
                layout.checkpoint_metadata_key(checkpoint_id),
                reason,
            )

    def _release(
        self, holder: Holder, files: set[str], directory: str, metadata_key: str, reason: str
    ) -> Discard:
        keys: list[str] = []
        for key in files:
            entry = self._entries.get(key)
            if entry is None:
                continue
            entry.holders.discard(holder)
            if entry.holders:
                continue
            del self._entries[key]
            if entry.scope is not Scope.TASKOWNED:
                keys.append(key)
        prefix = directory + "/"
        if any(k.startswith(prefix) for k in self._entries):
            # Someone else still references a file inside this directory: removing the
            # directory would lose it, so discard only the metadata (and the free files
            # listed above); the reconcile finds any other leftovers.
            if metadata_key not in self._entries:
                keys.append(metadata_key)
            return Discard(tuple(sorted(keys)), (), reason)
        return Discard(tuple(sorted(keys)), (directory,), reason)

    # -- querying ----------------------------------------------------------------------
    def entry(self, key: str) -> FileEntry | None:
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                return None
            return FileEntry(key, e.scope, e.created_by, e.last_used_by, frozenset(e.holders))

    def referenced(self) -> set[str]:
        """Every key some holder references (including TASKOWNED ones): what a reconcile
        must never delete."""
        with self._lock:
            return set(self._entries)

    def checkpoints(self, *, pending: bool | None = None) -> list[int]:
        """Registered checkpoint ids, ascending; only pending or only completed ones if
        `pending` is given."""
        with self._lock:
            return sorted(
                i for i, c in self._checkpoints.items() if pending is None or c.pending == pending
            )

    def savepoints(self) -> list[str]:
        with self._lock:
            return sorted(self._savepoints)

    # -- restoring ---------------------------------------------------------------------
    @classmethod
    def from_metadata(
        cls, documents: Iterable[tuple[str, CheckpointMetadata]]
    ) -> SharedStateRegistry:
        """A registry of completed checkpoints and savepoints from their verified
        `_metadata` documents, each given with its key in the job directory (which says
        whether it is ``chk-N/_metadata`` or ``savepoints/<name>/_metadata``). External
        files (no-claim) are not ours and are not tracked."""
        registry = cls()
        for metadata_key, meta in documents:
            info = _check_metadata_key(metadata_key)
            files = {k: f.scope for k, f in referenced_keys(meta, metadata_key).items()}
            if info.kind is Kind.CHECKPOINT_METADATA and info.checkpoint_id is not None:
                if meta.kind != "checkpoint" or meta.checkpoint_id != info.checkpoint_id:
                    raise MetadataError(
                        f"{metadata_key}: holds {meta.kind} {meta.checkpoint_id}, "
                        "not the checkpoint its directory names"
                    )
                registry.register_checkpoint(info.checkpoint_id, files)
            elif info.kind is Kind.SAVEPOINT_METADATA and info.savepoint is not None:
                registry.register_savepoint(info.savepoint, files)
        return registry


def _check_metadata_key(metadata_key: str) -> layout.PathInfo:
    info = layout.parse(metadata_key)
    if info.kind not in (Kind.CHECKPOINT_METADATA, Kind.SAVEPOINT_METADATA):
        raise InvalidArgumentError(
            f"{metadata_key} is not a checkpoint or savepoint _metadata key"
        )
    return info
