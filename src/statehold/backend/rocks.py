"""The keyed state of one task: one operator + one key-group range in an embedded RocksDB.

`TaskStateBackend` is the facade a Spark task (or the state reader) uses: open (empty, or
restored from a checkpoint), read and write state per key, snapshot into a checkpoint,
confirm the snapshot once the checkpoint completed, close. The parts live beside it:

* engine.py: RocksDB options (universal compaction, and why), the raw KV view, transfers;
* local_snapshots.py: the local disk layout, snapshot markers, linking, pruning;
* restore.py: restore sources, fetching their files, copying keys in when rescaling;
* snapshot.py: the incremental snapshot and upload, and which uploaded files are reused;
* changelog.py: changelog commits (`changelog=True`), which upload a batch's writes.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from rocksdict import Rdict, WriteOptions

from statehold.backend.changelog import (
    MAX_CHANGELOG_SHARE,
    MAX_CHANGELOGS,
    ChangeLog,
    LoggedKV,
)
from statehold.backend.engine import (
    MAX_SIZE_AMP,
    RocksKV,
    StateBackendError,
    compacting,
    open_db,
    raw_options,
    settle_compactions,
)
from statehold.backend.keys import (
    INDEX_KINDS,
    Key,
    StateKind,
    check_max_parallelism,
    decode_key,
    range_bounds,
)
from statehold.backend.local_snapshots import (
    equivalent_snapshot,
    link_or_copy,
    local_pool,
    new_snapshot_dir,
    operator_dir_name,
    prune_snapshots,
    range_dir_name,
    read_marker,
    state_digest,
    write_marker,
)
from statehold.backend.restore import (
    RestoreSource,
    RestoreStats,
    check_sources,
    copy_in,
    drop_outside_range,
    fetch,
    largest_overlap,
    replay_changelogs,
    sources_from_metadata,
)
from statehold.backend.snapshot import (
    PendingSnapshot,
    ReusableFiles,
    SnapshotStats,
    SnapshotTarget,
    checkpoint_locally,
    write_changelog_snapshot,
    write_snapshot,
)
from statehold.backend.state import (
    TIMERS_NAME,
    KeyedState,
    ListState,
    MapState,
    ValueState,
    fold_entry,
)
from statehold.backend.ttl import MAX_GARBAGE
from statehold.errors import InvalidArgumentError
from statehold.format.metadata import NEW_JOB_KEY_HASH, KeyGroupRange, KeyGroupState, KeyHash
from statehold.state.json_codec import EntryDecoders
from statehold.storage.base import Storage, check_key, file_checksum

log = logging.getLogger(__name__)

__all__ = [
    "RestoreSource",
    "RestoreStats",
    "SnapshotStats",
    "StateBackendError",
    "TaskStateBackend",
    "sources_from_metadata",
]


class TaskStateBackend:
    """Keyed state of one task. Use `TaskStateBackend.open(...)`; one thread at a time."""

    def __init__(
        self,
        local_dir: Path,
        operator: str,
        key_groups: KeyGroupRange,
        max_parallelism: int,
        *,
        transfer_threads: int = 4,
        size_amplification: int = MAX_SIZE_AMP,
        max_garbage: float = MAX_GARBAGE,
        changelog: bool = False,
        key_hash: KeyHash = NEW_JOB_KEY_HASH,
    ) -> None:
        if not operator:
            raise InvalidArgumentError("operator name must not be empty")
        check_max_parallelism(max_parallelism)
        if key_groups.end >= max_parallelism:
            raise InvalidArgumentError(
                f"key groups {key_groups} exceed max parallelism {max_parallelism}"
            )
        self.operator = operator
        self.key_groups = key_groups
        self.max_parallelism = max_parallelism
        #: How keys map to key groups: the job's, recorded in its checkpoints.
        self.key_hash = KeyHash(key_hash)
        self.transfer_threads = max(1, transfer_threads)
        self.op_dir = Path(local_dir).absolute() / operator_dir_name(operator)
        self.range_dir = self.op_dir / range_dir_name(key_groups)
        self.work_dir = self.range_dir / f"work-{uuid.uuid4().hex}"
        self.db_dir = self.work_dir / "db"
        self.restore_stats = RestoreStats()
        self.last_snapshot: SnapshotStats | None = None
        #: Uploaded files a snapshot may reference, from completed checkpoints only (files
        #: of a snapshot whose checkpoint may still abort are never referenced).
        self._reusable = ReusableFiles()
        self._pending: dict[int, PendingSnapshot] = {}
        self._db: Rdict | None = None
        self._kv: RocksKV | None = None
        #: Commit by changelog when the state extends a completed checkpoint (changelog.py).
        self.changelog = changelog
        #: The memtable holds writes a changelog commit uploaded but nothing flushed yet.
        self._unflushed = False
        #: SSTs of the working DB whose content is known, name -> (size, checksum): those
        #: it was restored from or snapshotted. RocksDB never reuses an SST's number in a
        #: DB, so a local snapshot's marker takes these instead of hashing the whole state.
        self._known_ssts: dict[str, tuple[int, str]] = {}
        #: the last snapshot's target and state (`close_after_compactions`)
        self._last_state: tuple[SnapshotTarget, KeyGroupState, set[str], int] | None = None
        #: The processing time (ms) state TTLs are measured on (None: the wall clock).
        self.now_ms: int | None = None
        if size_amplification < 1:
            raise InvalidArgumentError("size_amplification must be a positive percentage")
        if not 0 < max_garbage <= 1:
            raise InvalidArgumentError("max_garbage must be a fraction in (0, 1]")
        #: Garbage share of the SST entries that compacts the DB at the end of a batch
        #: (`statehold.backend.ttl.expire_and_compact`).
        self.max_garbage = max_garbage
        self._options = raw_options(size_amplification)

    # -- opening -------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        local_dir: Path,
        operator: str,
        key_groups: KeyGroupRange,
        max_parallelism: int,
        restore: Sequence[RestoreSource] | None = None,
        *,
        transfer_threads: int = 4,
        size_amplification: int = MAX_SIZE_AMP,
        max_garbage: float = MAX_GARBAGE,
        changelog: bool = False,
        key_hash: KeyHash = NEW_JOB_KEY_HASH,
    ) -> TaskStateBackend:
        """Open the state of `operator` for `key_groups`: empty if `restore` is None or
        empty, else rebuilt from the overlapping ranges of the checkpoint in `restore`
        (the same parallelism, or rescaled from any other).

        `size_amplification` (percent) trades storage for upload: the oldest, largest run
        is rewritten (and uploaded again) when the newer runs reach this share of it. Lower
        keeps the stored state closer to the live data; higher uploads less on average
        (docs/benchmarks.md measures both). `max_garbage` (a fraction) likewise: deleted
        entries and tombstones beyond that share of the SST entries compact the whole DB
        at the end of a batch, so expired state leaves storage (stored state stays within
        about 1 / (1 - max_garbage) of the live state) at the price of uploading the
        compacted state on those batches. `changelog` commits a checkpoint by uploading
        the batch's writes instead of flushing and checkpointing RocksDB on the commit path
        (changelog.py): a shorter commit for a longer restore when no local snapshot is
        at hand. `key_hash` is the job's (its checkpoints record it): how `for_key` finds a
        key's key group."""
        self = cls(
            local_dir,
            operator,
            key_groups,
            max_parallelism,
            transfer_threads=transfer_threads,
            size_amplification=size_amplification,
            max_garbage=max_garbage,
            changelog=changelog,
            key_hash=key_hash,
        )
        self.work_dir.mkdir(parents=True)
        try:
            if restore:
                self._restore(restore)
            else:
                self._attach(open_db(str(self.db_dir), self._options))
        except BaseException:
            self._discard_work()
            raise
        return self

    def _attach(self, db: Rdict) -> None:
        # No write-ahead log: the working DB is a private copy that a crash discards (the
        # task restores from the last checkpoint), and a snapshot either flushes before
        # copying or uploads the batch's writes (changelog.py), so the log would only
        # cost time on every put.
        no_wal = WriteOptions()
        no_wal.disable_wal = True  # type: ignore[method-assign,assignment]  # a property
        db.set_write_options(no_wal)
        self._db = db
        self._kv = LoggedKV(db, ChangeLog(self.work_dir)) if self.changelog else RocksKV(db)

    def _restore(self, restore: Sequence[RestoreSource]) -> None:
        sources = [s for s in restore if s[2].key_groups.overlaps(self.key_groups)]
        check_sources(sources, self.key_groups, self.max_parallelism, self.operator)
        pool = local_pool(self.op_dir)
        base = largest_overlap(sources, self.key_groups)
        others = [s for s in sources if s is not base]
        fetched = not (not others and base[2].key_groups == self.key_groups
                       and self._open_equivalent(base[2]))
        if fetched:
            fetch(base, self.db_dir, pool, self.restore_stats, self.transfer_threads)
        self._attach(open_db(str(self.db_dir), self._options))
        if fetched:
            replay_changelogs(self._require_db(), self.db_dir, base[2])
            self._know(base[2])
        self._reusable = ReusableFiles.of_restored(base)
        if others or base[2].key_groups != self.key_groups:
            self._reusable.base = None  # a rescaled state extends no checkpoint's
        if base[2].key_groups != self.key_groups:
            self.restore_stats.rescaled = True
            drop_outside_range(self._require_db(), self.key_groups)
        for i, src in enumerate(others):
            copy_in(
                src,
                self.work_dir / f"src-{i}",
                pool,
                self._require_db(),
                self.key_groups,
                self.restore_stats,
                self.transfer_threads,
            )
        restored = [s[2].info.get("checkpoint_id") for s in sources]
        if all(isinstance(c, int) for c in restored):
            oldest = min(c for c in restored if isinstance(c, int))
            prune_snapshots(self.op_dir, oldest, holding=self.range_dir)

    def _open_equivalent(self, state: KeyGroupState) -> bool:
        """Put into the working DB's directory the files of a local snapshot equivalent to
        `state` (compacted after its task snapshotted), if this executor has one."""
        ckpt = state.info.get("checkpoint_id")
        if not isinstance(ckpt, int):
            return False
        snap = equivalent_snapshot(self.range_dir, ckpt, state_digest(state))
        files = read_marker(snap) if snap is not None else None
        if snap is None or files is None:
            return False
        self.db_dir.mkdir(parents=True)
        try:
            for name in files:
                # SSTs are immutable: hard link. RocksDB rewrites the others: copy.
                link_or_copy(snap / name, self.db_dir / name, link=name.endswith(".sst"))
        except FileNotFoundError:  # pruned meanwhile: restore the checkpoint's own files
            shutil.rmtree(self.db_dir, ignore_errors=True)
            return False
        self.restore_stats.files_local += len(files)
        self.restore_stats.compacted = True
        self._known_ssts.update((n, f) for n, f in files.items() if n.endswith(".sst"))
        return True

    def _know(self, state: KeyGroupState) -> None:
        """The SSTs of `state` are in the working DB with these sizes and checksums."""
        self._known_ssts.update(
            (f.name, (f.size, f.checksum))
            for f in state.files if f.name and f.name.endswith(".sst")
        )

    # -- state access --------------------------------------------------------------------
    def _require_db(self) -> Rdict:
        if self._db is None:
            raise StateBackendError("state backend is closed")
        return self._db

    def _require_kv(self) -> RocksKV:
        self._require_db()
        assert self._kv is not None
        return self._kv

    def for_key(self, key: Key, key_group: int | None = None) -> KeyedState:
        """All state of `key` (which must belong to this task's key groups); `key_group`:
        its group if the caller has it from the job's hash already."""
        state = KeyedState(
            self._require_kv(), key, self.max_parallelism, self.now_ms, self.key_hash,
            key_group,
        )
        if state.key_group not in self.key_groups:
            raise InvalidArgumentError(
                f"key {key!r} is in key group {state.key_group}, not in this task's "
                f"{self.key_groups.start}..{self.key_groups.end}"
            )
        return state

    def value_state(self, name: str, key: Key) -> ValueState[Any]:
        return self.for_key(key).value(name)

    def list_state(self, name: str, key: Key) -> ListState[Any]:
        return self.for_key(key).list(name)

    def map_state(self, name: str, key: Key) -> MapState[Any, Any]:
        return self.for_key(key).map(name)

    def items(
        self, decoders: Mapping[str, EntryDecoders] | None = None
    ) -> Iterator[tuple[Key, dict[str, Any]]]:
        """Every key of this task's range with all its state: (key, {state name: value});
        list state as a list, map state as a dict, timers (expiry ms) under
        `TIMERS_NAME`. Grouped per key group, so memory is bounded by the state of one key
        group."""
        kv = self._require_kv()
        lower, upper = range_bounds(self.key_groups)
        group = -1
        current: dict[Key, dict[str, Any]] = {}
        for raw, data in kv.range(lower, upper):
            d = decode_key(raw)
            if d.kind in INDEX_KINDS:
                continue
            if d.key_group != group:
                yield from current.items()
                current, group = {}, d.key_group
            fold_entry(current.setdefault(d.key, {}), d, data, decoders)
        yield from current.items()

    def state_names(self) -> set[str]:
        """The names of all states stored in this task's range. Cheap: per key group, one
        seek per name (a name's entries are contiguous within a key group)."""
        db = self._require_db()
        names: set[str] = set()
        it = db.iter()
        try:
            for group in range(self.key_groups.start, self.key_groups.end + 1):
                prefix = group.to_bytes(2, "big")
                it.seek(prefix)
                while it.valid():
                    raw = bytes(it.key())
                    if not raw.startswith(prefix):
                        break
                    name = decode_key(raw).state_name
                    if name:
                        names.add(name)
                    else:  # statehold's own entries: timers show as TIMERS_NAME
                        it.seek(prefix + b"\x00" + StateKind.TIMER.value)
                        if it.valid() and bytes(it.key()).startswith(
                            prefix + b"\x00" + StateKind.TIMER.value
                        ):
                            names.add(TIMERS_NAME)
                        it.seek(prefix + b"\x01")
                        continue
                    it.seek(prefix + name.encode("utf-8") + b"\x01")
        finally:
            del it
        return names

    def keys(self) -> Iterator[Key]:
        return (k for k, _ in self.items())

    # -- snapshots -----------------------------------------------------------------------
    def snapshot(
        self,
        storage: Storage,
        epoch: int,
        checkpoint_id: int,
        metadata_key: str,
        upload_threads: int = 4,
    ) -> KeyGroupState:
        """Snapshot the state into checkpoint `checkpoint_id` of the job in `storage`.

        SSTs already uploaded by a completed checkpoint (restored, or confirmed with
        `commit_local`) are referenced again; only new SSTs are uploaded, to shared/. So
        are RocksDB's OPTIONS and rocksdict's config, reused by checksum. The small mutable
        files (MANIFEST, CURRENT) go inside `_metadata`, larger ones to exclusive/.
        With `changelog`, a state that extends a completed checkpoint's uploads only the
        writes since (`_extends_base`). Statistics: `info` of the result and
        `self.last_snapshot`."""
        db = self._require_db()
        check_key(metadata_key)
        snap = new_snapshot_dir(self.range_dir, checkpoint_id)
        target = SnapshotTarget(
            self.operator, self.key_groups, self.max_parallelism, epoch, checkpoint_id,
            metadata_key,
        )
        kv = self._require_kv()
        if isinstance(kv, LoggedKV) and self._extends_base(db):
            state, stats, pending = write_changelog_snapshot(
                kv.log, storage, target, self._reusable
            )
            self._unflushed = True
        else:
            state, stats, pending = write_snapshot(
                db, snap, storage, target, self._reusable, upload_threads
            )
            self._unflushed = False
        if isinstance(kv, LoggedKV):
            kv.log.discard()
            kv.log = ChangeLog(self.work_dir)
        self._pending[checkpoint_id] = pending
        self.last_snapshot = stats
        # the files the checkpoint holds (a compaction may have replaced some since)
        ssts = {f.name for f in state.files if f.name and f.name.endswith(".sst")}
        self._last_state = (target, state, ssts, db.latest_sequence_number())
        self._know(state)
        return state

    def _extends_base(self, db: Rdict) -> bool:
        """Whether this snapshot may be a changelog commit: the DB holds a completed
        checkpoint's state plus the logged writes (no snapshot since awaits its
        checkpoint), RocksDB still holds some of that base's SSTs (else its rewrite is
        due for upload anyway) and the changelogs stay within their limits."""
        base = self._reusable.base
        return (
            base is not None
            and not self._pending
            and len(base.changelogs) < MAX_CHANGELOGS
            and base.changelog_bytes <= MAX_CHANGELOG_SHARE * base.base_bytes
            and bool(base.ssts & _live_ssts(db))
        )

    def commit_local(self, checkpoint_id: int) -> None:
        """The driver completed `checkpoint_id`: later snapshots of this backend may
        reference its files, and older local snapshots of the operator are deleted.

        Optional for correctness: a new task restoring `checkpoint_id` finds the local
        snapshot by its marker either way, and prunes older ones itself."""
        pending = self._pending.pop(checkpoint_id, None)
        if pending is None:
            raise StateBackendError(f"no local snapshot of checkpoint {checkpoint_id}")
        self._reusable = pending.files
        for cid in [c for c in self._pending if c < checkpoint_id]:
            path = self._pending.pop(cid).path
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)
        prune_snapshots(self.op_dir, checkpoint_id)

    # -- closing -------------------------------------------------------------------------
    def _discard_work(self) -> None:
        if self._db is not None:
            _close_quietly(self._db, self.work_dir)
        self._db = self._kv = None
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def close(self) -> None:
        """Close the DB and delete the private working copy. Local snapshots stay: the
        next task for this range restores from them without downloading."""
        self._discard_work()

    def close_after_compactions(self) -> threading.Thread | None:
        """Close as `close` does, unless a compaction ran, runs or is due since the last
        snapshot (which did not wait for it: engine.py). Then a daemon thread lets it
        finish, keeps the result as a local snapshot equivalent to the last snapshot's
        state, and closes; it is returned. Only if nothing was written since the snapshot
        (the sequence number tells), so the compacted DB holds the same state. If the
        process ends first, the work is lost and the next task of the range compacts
        again."""
        db, last = self._db, self._last_state
        if (db is None or last is None or db.latest_sequence_number() != last[3]
                or not (self._unflushed or compacting(db) or _live_ssts(db) != last[2])):
            self.close()  # written to since the snapshot, or nothing to finish
            return None
        self._db = self._kv = None  # the thread's now: this backend is closed
        thread = threading.Thread(
            target=_compact_and_keep,
            args=(db, self.work_dir, self.range_dir, last[0], last[1], dict(self._known_ssts)),
            name=f"statehold-compaction-{self.range_dir.name}",
            daemon=True,
        )
        thread.start()
        return thread

    def __enter__(self) -> TaskStateBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _close_quietly(db: Rdict, work_dir: Path) -> None:
    """Close a working DB whose directory is deleted next and never read again (the next
    task restores from a checkpoint): a failed final flush loses nothing, so rocksdict's
    bare Exception (a full disk, say) is only logged."""
    try:
        db.close()
    except Exception as e:
        log.warning("closing %s: %s", work_dir, " ".join(str(e).split()))


def _live_ssts(db: Rdict) -> set[str]:
    return {str(f["name"]).rsplit("/", 1)[-1] for f in db.live_files()}


#: The longest a background compaction may run before its DB is closed unfinished.
BACKGROUND_COMPACTION_TIMEOUT = 600.0


def _size_and_checksum(
    path: Path, known_ssts: Mapping[str, tuple[int, str]]
) -> tuple[int, str]:
    size = path.stat().st_size
    known = known_ssts.get(path.name)
    return known if known is not None and known[0] == size else (size, file_checksum(path))


def _compact_and_keep(
    db: Rdict,
    work_dir: Path,
    range_dir: Path,
    target: SnapshotTarget,
    state: KeyGroupState,
    known_ssts: Mapping[str, tuple[int, str]],
) -> None:
    """`close_after_compactions`'s thread: flush, wait for the DB's compactions,
    checkpoint it as a snapshot equivalent to `state`, close it, delete its working
    directory. Only the files not in `known_ssts` are hashed for the marker."""
    snap = new_snapshot_dir(range_dir, target.checkpoint_id)
    try:
        db.flush(True)  # after a changelog commit, the batch's writes (changelog.py)
        settle_compactions(db)  # one the flush scheduled gets its grace to start
        deadline = time.monotonic() + BACKGROUND_COMPACTION_TIMEOUT
        while compacting(db) and time.monotonic() < deadline:
            time.sleep(0.01)
        if not compacting(db):
            checkpoint_locally(db, snap)
            files = {p.name: _size_and_checksum(p, known_ssts)
                     for p in snap.iterdir() if p.is_file()}
            write_marker(snap, files, operator=target.operator,
                         key_groups=target.key_groups, checkpoint_id=target.checkpoint_id,
                         metadata_key=target.metadata_key, equivalent_to=state_digest(state))
    except Exception as e:  # a full disk, the range pruned meanwhile: the work is lost
        shutil.rmtree(snap, ignore_errors=True)
        log.warning("background compaction in %s: %s", work_dir, " ".join(str(e).split()))
    finally:
        _close_quietly(db, work_dir)
        shutil.rmtree(work_dir, ignore_errors=True)
