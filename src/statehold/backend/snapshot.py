"""Incremental snapshots: a RocksDB checkpoint of the working DB on local disk, uploaded
into the job directory except for the files a completed checkpoint already holds.

SSTs go to shared/ and are referenced again by later checkpoints while RocksDB keeps them.
RocksDB's OPTIONS file and rocksdict's config are the same bytes in every checkpoint: they
are shared files too, reused by checksum, not uploaded again per checkpoint and task. The
small mutable files (MANIFEST, CURRENT) go inside `_metadata`; any larger one to exclusive/.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rocksdict import Checkpoint, Rdict

from statehold.backend.changelog import CHANGELOG_FORMAT, ChangeLog, changelog_name, is_changelog
from statehold.backend.engine import (
    BACKEND_FORMAT,
    BACKEND_NAME,
    SYNC_COMPACTION_RUNS,
    StateBackendError,
    in_parallel,
    settle_compactions,
    sorted_runs,
)
from statehold.backend.local_snapshots import write_marker
from statehold.backend.restore import RestoreSource
from statehold.format import layout
from statehold.format.layout import Scope
from statehold.format.metadata import (
    InlineFile,
    KeyGroupRange,
    KeyGroupState,
    StateFile,
)
from statehold.storage.base import Storage, file_checksum

#: Task files up to this size (RocksDB's MANIFEST and CURRENT) go inside `_metadata`.
INLINE_MAX_BYTES = 16 * 1024
#: Non-SST files whose content rarely changes: stored in shared/, reused by checksum.
_CONTENT_SHARED = re.compile(r"^(OPTIONS-\d+|rocksdict-config\.json)$")


@dataclass
class SnapshotStats:
    checkpoint_id: int
    bytes_uploaded: int = 0
    files_uploaded: int = 0
    files_reused: int = 0
    bytes_reused: int = 0
    #: Total size of all files of this snapshot (uploaded + reused).
    state_size: int = 0


@dataclass(frozen=True, slots=True)
class RemoteFile:
    """A file already in a job directory, which a later checkpoint may reference."""

    storage_uri: str
    key: str
    size: int
    checksum: str


@dataclass(frozen=True)
class LogBase:
    """A completed checkpoint's state of the range, which a changelog commit extends
    (changelog.py): the base's stored and inline files, and the changelogs since, in
    order."""

    stored: tuple[tuple[str, RemoteFile], ...]
    inline: tuple[InlineFile, ...]
    changelogs: tuple[tuple[str, RemoteFile], ...] = ()

    @classmethod
    def of(
        cls,
        stored: list[tuple[str, RemoteFile]],
        inline: list[InlineFile],
        changelogs: list[tuple[str, RemoteFile]] | None = None,
    ) -> LogBase | None:
        """The base, or None if it has a file in exclusive/ (a larger MANIFEST): those
        belong to their own checkpoint and go with it, so no later one may name them."""
        if not all(shared_file(n) for n, _ in stored):
            return None
        return cls(tuple(stored), tuple(inline), tuple(changelogs or ()))

    @property
    def ssts(self) -> set[str]:
        return {n for n, _ in self.stored if n.endswith(".sst")}

    @property
    def base_bytes(self) -> int:
        return sum(r.size for _, r in self.stored)

    @property
    def changelog_bytes(self) -> int:
        return sum(r.size for _, r in self.changelogs)


@dataclass
class ReusableFiles:
    """Uploaded shared files a snapshot references instead of uploading again: SSTs by
    local name (RocksDB never reuses an SST name with other content), the other shared
    files by (size, checksum); and the state a changelog commit may extend."""

    by_name: dict[str, RemoteFile] = field(default_factory=dict)
    by_content: dict[tuple[int, str], RemoteFile] = field(default_factory=dict)
    base: LogBase | None = None

    @classmethod
    def of_restored(cls, src: RestoreSource) -> ReusableFiles:
        """The shared files of the checkpoint the working DB was restored from."""
        storage, metadata_key, kgs = src
        reusable = cls()
        stored: list[tuple[str, RemoteFile]] = []
        changelogs: list[tuple[str, RemoteFile]] = []
        for f in kgs.files:
            if not f.name or f.external:
                continue
            remote = RemoteFile(storage.uri, layout.resolve(metadata_key, f.path), f.size,
                                f.checksum)
            (changelogs if is_changelog(f.name) else stored).append((f.name, remote))
            if f.scope is not Scope.SHARED or is_changelog(f.name):
                continue
            if f.name.endswith(".sst"):
                reusable.by_name[f.name] = remote
            else:
                reusable.by_content[(f.size, f.checksum)] = remote
        if len(stored) + len(changelogs) == len(kgs.files):
            reusable.base = LogBase.of(stored, kgs.inline, changelogs)
        return reusable


@dataclass
class PendingSnapshot:
    """A local snapshot whose checkpoint is not completed yet: its files become reusable
    only if it completes (one that aborts may have its uploads deleted)."""

    path: Path | None  # None for a changelog commit (rocks.py snapshots after the task)
    files: ReusableFiles


def shared_file(name: str) -> bool:
    """Stored in shared/ (immutable, may be referenced by later checkpoints)."""
    return name.endswith(".sst") or bool(_CONTENT_SHARED.match(name)) or is_changelog(name)


@dataclass(frozen=True)
class SnapshotTarget:
    """What a snapshot is of and where it goes: one task's key groups of `operator`, in
    checkpoint `checkpoint_id` (epoch `epoch`) whose document is `metadata_key`."""

    operator: str
    key_groups: KeyGroupRange
    max_parallelism: int
    epoch: int
    checkpoint_id: int
    metadata_key: str


def write_snapshot(
    db: Rdict,
    snap: Path,
    storage: Storage,
    target: SnapshotTarget,
    reusable: ReusableFiles,
    upload_threads: int,
) -> tuple[KeyGroupState, SnapshotStats, PendingSnapshot]:
    """Checkpoint `db` into the local directory `snap` and upload what `reusable` does
    not hold into `target`'s checkpoint in `storage`. Returns the task state for
    `_metadata`, the statistics, and the snapshot to confirm once the checkpoint
    completes. On failure `snap` is deleted."""
    try:
        checkpoint_locally(db, snap)
        inline, names = _inline_and_stored(snap)
        reuse, new = _reused_and_new(snap, names, reusable, storage.uri)
        uploaded = dict(
            zip(new, in_parallel(_uploader(snap, storage, target), new, upload_threads),
                strict=True)
        )
        stored = reuse | uploaded
        write_marker(
            snap,
            {n: (r.size, r.checksum) for n, r in stored.items()},
            operator=target.operator,
            key_groups=target.key_groups,
            checkpoint_id=target.checkpoint_id,
            metadata_key=target.metadata_key,
        )
        inline_files = [InlineFile.of(n, (snap / n).read_bytes()) for n in inline]
    except BaseException:
        shutil.rmtree(snap, ignore_errors=True)
        raise
    stats = SnapshotStats(
        target.checkpoint_id,
        bytes_uploaded=sum(r.size for r in uploaded.values()),
        files_uploaded=len(uploaded),
        files_reused=len(reuse),
        bytes_reused=sum(r.size for r in reuse.values()),
    )
    stats.state_size = stats.bytes_reused + stats.bytes_uploaded
    files = [_state_file(name, stored[name], target.metadata_key) for name in names]
    return (_task_state(target, files, inline_files, stats), stats,
            _pending(snap, stored, inline_files))


def write_changelog_snapshot(
    log: ChangeLog,
    storage: Storage,
    target: SnapshotTarget,
    reusable: ReusableFiles,
) -> tuple[KeyGroupState, SnapshotStats, PendingSnapshot]:
    """Upload the writes `log` recorded since `reusable.base` as one changelog, and
    return the task state that names the base's files and every changelog since, in
    order (changelog.py). Nothing is flushed or checkpointed locally here."""
    base = reusable.base
    if base is None:
        raise StateBackendError("a changelog commit needs the state of a completed checkpoint")
    new: list[tuple[str, RemoteFile]] = []
    written = log.finish()
    if written is not None:
        name = changelog_name(target.checkpoint_id)
        new.append((name, _store_changelog(*written, name, storage, target)))
    changelogs = [*base.changelogs, *new]
    stats = SnapshotStats(
        target.checkpoint_id,
        bytes_uploaded=sum(r.size for _, r in new),
        files_uploaded=len(new),
        files_reused=len(base.stored) + len(base.changelogs),
        bytes_reused=base.base_bytes + base.changelog_bytes,
    )
    stats.state_size = stats.bytes_reused + stats.bytes_uploaded
    files = [_state_file(n, r, target.metadata_key) for n, r in (*base.stored, *changelogs)]
    state = _task_state(target, files, list(base.inline), stats,
                        backend_format=CHANGELOG_FORMAT if changelogs else BACKEND_FORMAT)
    extended = ReusableFiles(reusable.by_name, reusable.by_content,
                             LogBase(base.stored, base.inline, tuple(changelogs)))
    return state, stats, PendingSnapshot(None, extended)


def checkpoint_locally(db: Rdict, snap: Path) -> None:
    """A RocksDB checkpoint of `db` in `snap`, flushed and without empty WAL files. A
    running compaction is not waited for (engine.py says why) unless the runs reached
    `SYNC_COMPACTION_RUNS`. RocksDB's failures (a full disk above all) come as a bare
    `Exception` from rocksdict: they become one StateBackendError line."""
    try:
        db.flush(True)
        if sorted_runs(db) >= SYNC_COMPACTION_RUNS:
            settle_compactions(db)
        Checkpoint(db).create_checkpoint(str(snap))
    except Exception as e:  # rocksdict raises Exception for every RocksDB status
        raise StateBackendError(
            f"{snap}: RocksDB could not write the local snapshot: {' '.join(str(e).split())}"
        ) from e
    for wal in snap.glob("*.log"):
        # Writes skip the WAL and the flush above emptied it: RocksDB opens the
        # checkpoint without it, so it would only cost a file per task and checkpoint.
        if wal.stat().st_size == 0:
            wal.unlink()


def _inline_and_stored(snap: Path) -> tuple[list[str], list[str]]:
    """The snapshot's file names, sorted: those that go inside `_metadata`, the others."""
    names = sorted(p.name for p in snap.iterdir() if p.is_file())
    inline = [
        n for n in names
        if not shared_file(n) and (snap / n).stat().st_size <= INLINE_MAX_BYTES
    ]
    return inline, [n for n in names if n not in inline]


def _reused_and_new(
    snap: Path, names: list[str], reusable: ReusableFiles, storage_uri: str
) -> tuple[dict[str, RemoteFile], list[str]]:
    """Which of `names` an uploaded file in `storage_uri` already holds, and the rest."""
    reuse: dict[str, RemoteFile] = {}
    new: list[str] = []
    for name in names:
        old: RemoteFile | None = None
        if name.endswith(".sst"):
            old = reusable.by_name.get(name)
            if old is not None and old.size != (snap / name).stat().st_size:
                old = None
        elif shared_file(name) and reusable.by_content:
            local = snap / name
            old = reusable.by_content.get((local.stat().st_size, file_checksum(local)))
        if old is not None and old.storage_uri == storage_uri:
            reuse[name] = old
        else:
            new.append(name)
    return reuse, new


def _uploader(snap: Path, storage: Storage, target: SnapshotTarget) -> Callable[[str], RemoteFile]:
    """Uploads one file of `snap` into shared/ or exclusive/ of `target`'s checkpoint."""

    def upload(name: str) -> RemoteFile:
        path = snap / name
        size, checksum = path.stat().st_size, file_checksum(path)
        key_of = layout.shared_key if shared_file(name) else layout.exclusive_key
        key = key_of(target.epoch, target.checkpoint_id, hint=name)
        storage.upload(path, key)
        return RemoteFile(storage.uri, key, size, checksum)

    return upload


def _store_changelog(
    written: bytes | Path, checksum: str, name: str, storage: Storage, target: SnapshotTarget
) -> RemoteFile:
    """Put a finished changelog into shared/ of `target`'s checkpoint: from memory if it
    stayed there (no local file written and read back), else from its file."""
    key = layout.shared_key(target.epoch, target.checkpoint_id, hint=name)
    if isinstance(written, bytes):
        storage.write(key, written)
        return RemoteFile(storage.uri, key, len(written), checksum)
    try:
        size = written.stat().st_size
        storage.upload(written, key)
    finally:
        written.unlink(missing_ok=True)
    return RemoteFile(storage.uri, key, size, checksum)


def _state_file(name: str, stored: RemoteFile, metadata_key: str) -> StateFile:
    scope = Scope.SHARED if shared_file(name) else Scope.EXCLUSIVE
    path = layout.relativize(metadata_key, stored.key)
    return StateFile(path=path, scope=scope, size=stored.size, checksum=stored.checksum, name=name)


def _pending(
    snap: Path, stored: dict[str, RemoteFile], inline: list[InlineFile]
) -> PendingSnapshot:
    """`snap` with the shared files a later snapshot may reuse once it completes, and the
    base a changelog commit may extend."""
    return PendingSnapshot(
        snap,
        ReusableFiles(
            {n: r for n, r in stored.items() if n.endswith(".sst")},
            {
                (r.size, r.checksum): r
                for n, r in stored.items()
                if shared_file(n) and not n.endswith(".sst")
            },
            LogBase.of(sorted(stored.items()), inline),
        ),
    )


def _task_state(
    target: SnapshotTarget,
    files: list[StateFile],
    inline: list[InlineFile],
    stats: SnapshotStats,
    backend_format: int = BACKEND_FORMAT,
) -> KeyGroupState:
    """The task's entry in `_metadata`."""
    return KeyGroupState(
        key_groups=target.key_groups,
        files=files,
        inline=inline,
        info={
            "backend": BACKEND_NAME,
            "format": backend_format,
            "operator": target.operator,
            "max_parallelism": target.max_parallelism,
            "epoch": target.epoch,
            "checkpoint_id": target.checkpoint_id,
            "bytes_uploaded": stats.bytes_uploaded,
            "files_uploaded": stats.files_uploaded,
            "files_reused": stats.files_reused,
            "bytes_reused": stats.bytes_reused,
            "state_size": stats.state_size,
        },
    )
