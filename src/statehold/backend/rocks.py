"""The keyed state of one task: one operator + one key-group range in an embedded RocksDB.

Local disk, per operator, under the `local_dir` the caller gives (one per job)::

    <local_dir>/<operator>/kg-<start>-<end>/work-<uuid>/db     the private working DB of
                                                               one open (own RocksDB lock)
    <local_dir>/<operator>/kg-<start>-<end>/snap-<ckpt>-<uuid>/ a local snapshot: RocksDB
                                                               checkpoint + marker file

A snapshot directory is complete only once its marker (`LOCAL_MARKER`, written last and
atomically) lists every file with size and checksum; anything without a valid marker is
ignored. On open, every file a restore needs is looked up in those markers by (RocksDB file
name, checksum) and hard-linked if found, else downloaded and verified. So "the cache holds
this range at this checkpoint" is simply the case where nothing needs downloading, and a
stale, foreign or half-written cache can only cost a download, never wrong state.

RocksDB runs in raw mode: keys and values are bytes and nothing is ever pickled; values are
JSON (see state.py).

Why uploads stay near the changed state (see docs/benchmarks.md, "Incremental checkpoints"):

* Universal ("tiered") compaction, not RocksDB's default leveled compaction. With leveled
  compaction every L0->L1 compaction rewrites every L1 file a flush overlaps; keys are spread
  by hash, so a batch touching 5% of the keys overlaps all of them and the next checkpoint
  re-uploads the whole state (every `_RUNS_TRIGGER` flushes, and at the first open after a
  restore). Universal compaction waits for `_RUNS_TRIGGER` sorted runs, then merges the
  small recent runs with each other, or rewrites the big oldest run if the others reach
  `_MAX_SIZE_AMP` percent of it. Both numbers trade bytes uploaded for bytes stored; the
  defaults were chosen by measurement (docs/benchmarks.md, "The trade between bytes
  uploaded and bytes stored").
* A snapshot waits for a running compaction to finish, so its result is checkpointed
  (a task's working DB is thrown away after the batch, so unfinished work would be lost).
* RocksDB's OPTIONS file and rocksdict's config are the same bytes in every checkpoint: they
  are shared files, reused by checksum, not uploaded again per checkpoint and task.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Checkpoint,
    DBCompactionStyle,
    DBCompressionType,
    Options,
    Rdict,
    UniversalCompactOptions,
    WriteBatch,
    WriteOptions,
)

from statehold import layout
from statehold.backend.keys import (
    Key,
    StateKind,
    check_max_parallelism,
    decode_key,
    range_bounds,
)
from statehold.backend.state import KeyedState, ListState, MapState, ValueState, decode_value
from statehold.errors import StateholdError
from statehold.layout import Scope
from statehold.metadata import (
    CheckpointMetadata,
    InlineFile,
    KeyGroupRange,
    KeyGroupState,
    StateFile,
    file_checksum,
)
from statehold.storage.base import Storage, check_key

BACKEND_NAME = "rocksdb"
BACKEND_FORMAT = 1
LOCAL_MARKER = "statehold-local.json"
_MARKER_FORMAT = "statehold.local-snapshot"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_SNAP_DIR = re.compile(r"^snap-(?P<ckpt>\d+)-[0-9a-f]+$")
_COPY_BATCH = 2000
#: Task files up to this size (RocksDB's MANIFEST and CURRENT) go inside `_metadata`.
INLINE_MAX_BYTES = 16 * 1024
#: Sorted runs (flushes not yet merged) that trigger a universal compaction.
_RUNS_TRIGGER = 16
#: The oldest (largest) run is rewritten only when the newer runs reach this % of it.
_MAX_SIZE_AMP = 50
#: Non-SST files whose content rarely changes: stored in shared/, reused by checksum.
_CONTENT_SHARED = re.compile(r"^(OPTIONS-\d+|rocksdict-config\.json)$")
#: How long a snapshot gives a scheduled compaction to start (it then waits for it).
_COMPACTION_GRACE = 0.05

#: (job storage, key of the `_metadata` the state belongs to, the task state in it)
RestoreSource = tuple[Storage, str, KeyGroupState]


class StateBackendError(StateholdError):
    """State cannot be restored or snapshotted (bad metadata, checksum mismatch, ...)."""


@dataclass
class RestoreStats:
    files_downloaded: int = 0
    bytes_downloaded: int = 0
    files_local: int = 0  # hard-linked (or copied) from a local snapshot
    rescaled: bool = False
    keys_copied: int = 0


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
class _Remote:
    """A file already in a job directory, which a later checkpoint may reference."""

    storage_uri: str
    key: str
    size: int
    checksum: str


@dataclass
class _Pending:
    path: Path
    files: dict[str, _Remote] = field(default_factory=dict)
    content: dict[tuple[int, str], _Remote] = field(default_factory=dict)


def _raw_options(size_amplification: int = _MAX_SIZE_AMP) -> Options:
    """Raw mode, universal compaction (see the module docstring), bloom filters (reads
    look into up to `_RUNS_TRIGGER` runs), ZSTD blocks (state is uploaded and stored, so
    its bytes cost more than the CPU to shrink them)."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_compression_type(DBCompressionType.zstd())
    opts.set_compaction_style(DBCompactionStyle.universal())
    universal = UniversalCompactOptions()
    universal.max_size_amplification_percent = size_amplification
    opts.set_universal_compaction_options(universal)
    opts.set_level_zero_file_num_compaction_trigger(_RUNS_TRIGGER)
    opts.set_level_zero_slowdown_writes_trigger(4 * _RUNS_TRIGGER)
    opts.set_level_zero_stop_writes_trigger(6 * _RUNS_TRIGGER)
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    return opts


def _shared_file(name: str) -> bool:
    """Stored in shared/ (immutable, may be referenced by later checkpoints)."""
    return name.endswith(".sst") or bool(_CONTENT_SHARED.match(name))


def _settle_compactions(db: Rdict) -> None:
    """Wait until no compaction runs. One scheduled by the flush just before gets
    `_COMPACTION_GRACE` seconds to start; one that RocksDB keeps pending without picking
    (none of its runs qualifies yet) is not waited for."""
    deadline = time.monotonic() + _COMPACTION_GRACE
    while True:
        if db.property_int_value("rocksdb.num-running-compactions"):
            deadline = time.monotonic() + _COMPACTION_GRACE
        elif not db.property_int_value("rocksdb.compaction-pending") or (
            time.monotonic() >= deadline
        ):
            return
        time.sleep(0.005)


def operator_dir_name(operator: str) -> str:
    """A filesystem-safe, collision-free directory name for an operator."""
    digest = hashlib.blake2b(operator.encode("utf-8"), digest_size=4).hexdigest()
    return re.sub(r"[^A-Za-z0-9._-]", "_", operator)[:60] + "-" + digest


def range_dir_name(key_groups: KeyGroupRange) -> str:
    return f"kg-{key_groups.start}-{key_groups.end}"


def sources_from_metadata(
    storage: Storage, metadata_key: str, meta: CheckpointMetadata, operator: str
) -> list[RestoreSource]:
    """The restore sources of one operator in a checkpoint (all its key-group ranges;
    `TaskStateBackend.open` picks the ones overlapping the task's range)."""
    for op in meta.operators:
        if op.operator == operator:
            return [(storage, metadata_key, kg) for kg in op.ranges]
    return []


def _write_json_atomic(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}{layout.TEMP_MARKER}{uuid.uuid4().hex}")
    with open(tmp, "wb") as f:
        f.write(json.dumps(doc, sort_keys=True).encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_marker(snap: Path) -> dict[str, tuple[int, str]] | None:
    """The files of a complete local snapshot, {name: (size, checksum)}; None if the
    directory is incomplete, damaged or not ours."""
    try:
        doc = json.loads((snap / LOCAL_MARKER).read_bytes())
        if doc.get("format") != _MARKER_FORMAT:
            return None
        files = {str(n): (int(v["size"]), str(v["checksum"])) for n, v in doc["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    for name, (size, _c) in files.items():
        if not _SAFE_NAME.match(name):
            return None
        try:
            if (snap / name).stat().st_size != size:
                return None
        except OSError:
            return None
    return files


def _link_or_copy(src: Path, dst: Path, *, link: bool) -> None:
    if link:
        try:
            os.link(src, dst)
            return
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise
    shutil.copyfile(src, dst)


class _RocksKV:
    """The KV protocol of state.py on a raw-mode Rdict."""

    def __init__(self, db: Rdict) -> None:
        self.db = db

    def get(self, key: bytes) -> bytes | None:
        value = self.db.get(key)
        return None if value is None else bytes(value)

    def put(self, key: bytes, value: bytes) -> None:
        self.db.put(key, value)

    def delete(self, key: bytes) -> None:
        self.db.delete(key)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self.range(prefix, None, prefix)

    def range(
        self, lower: bytes, upper: bytes | None, prefix: bytes = b""
    ) -> Iterator[tuple[bytes, bytes]]:
        # Bounds are checked here, not with ReadOptions: rocksdict encodes ReadOptions
        # bounds in its non-raw format.
        it = self.db.iter()
        it.seek(lower)
        try:
            while it.valid():
                key = bytes(it.key())
                if (upper is not None and key >= upper) or not key.startswith(prefix):
                    return
                yield key, bytes(it.value())
                it.next()
        finally:
            del it


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
        size_amplification: int = _MAX_SIZE_AMP,
    ) -> None:
        if not operator:
            raise ValueError("operator name must not be empty")
        check_max_parallelism(max_parallelism)
        if key_groups.end >= max_parallelism:
            raise ValueError(f"key groups {key_groups} exceed max parallelism {max_parallelism}")
        self.operator = operator
        self.key_groups = key_groups
        self.max_parallelism = max_parallelism
        self.transfer_threads = max(1, transfer_threads)
        self.op_dir = Path(local_dir).absolute() / operator_dir_name(operator)
        self.range_dir = self.op_dir / range_dir_name(key_groups)
        self.work_dir = self.range_dir / f"work-{uuid.uuid4().hex}"
        self.db_dir = self.work_dir / "db"
        self.restore_stats = RestoreStats()
        self.last_snapshot: SnapshotStats | None = None
        #: Local SST name -> the uploaded file it equals, from completed checkpoints only
        #: (files of a snapshot whose checkpoint may still abort are never referenced).
        self._confirmed: dict[str, _Remote] = {}
        #: (size, checksum) -> uploaded non-SST shared file (OPTIONS, ...), same rule.
        self._confirmed_content: dict[tuple[int, str], _Remote] = {}
        self._pending: dict[int, _Pending] = {}
        self._db: Rdict | None = None
        self._kv: _RocksKV | None = None
        if size_amplification < 1:
            raise ValueError("size_amplification must be a positive percentage")
        self._options = _raw_options(size_amplification)

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
        size_amplification: int = _MAX_SIZE_AMP,
    ) -> TaskStateBackend:
        """Open the state of `operator` for `key_groups`: empty if `restore` is None or
        empty, else rebuilt from the overlapping ranges of the checkpoint in `restore`
        (the same parallelism, or rescaled from any other).

        `size_amplification` (percent) trades storage for upload: the oldest, largest run
        is rewritten (and uploaded again) when the newer runs reach this share of it. Lower
        keeps the stored state closer to the live data; higher uploads less on average
        (docs/benchmarks.md measures both)."""
        self = cls(
            local_dir,
            operator,
            key_groups,
            max_parallelism,
            transfer_threads=transfer_threads,
            size_amplification=size_amplification,
        )
        self.work_dir.mkdir(parents=True)
        try:
            if restore:
                self._restore(restore)
            else:
                self._attach(Rdict(str(self.db_dir), self._options))
        except BaseException:
            self._discard_work()
            raise
        return self

    def _attach(self, db: Rdict) -> None:
        # No write-ahead log: the working DB is a private copy that a crash discards (the
        # task restores from the last checkpoint), and snapshot() flushes before copying,
        # so the log would only cost time on every put.
        no_wal = WriteOptions()
        no_wal.disable_wal = True  # type: ignore[method-assign,assignment]  # a property
        db.set_write_options(no_wal)
        self._db = db
        self._kv = _RocksKV(db)

    def _restore(self, restore: Sequence[RestoreSource]) -> None:
        sources = [s for s in restore if s[2].key_groups.overlaps(self.key_groups)]
        self._check_sources(sources)
        pool = self._local_pool()

        def overlap(src: RestoreSource) -> int:
            r = src[2].key_groups
            return min(r.end, self.key_groups.end) - max(r.start, self.key_groups.start) + 1

        base = max(sources, key=overlap)
        others = [s for s in sources if s is not base]
        self._fetch(base, self.db_dir, pool)
        self._attach(Rdict(str(self.db_dir), self._options))
        storage, metadata_key, kgs = base
        for f in kgs.files:
            if f.scope is Scope.SHARED and f.name and not f.external:
                key = layout.resolve(metadata_key, f.path)
                remote = _Remote(storage.uri, key, f.size, f.checksum)
                if f.name.endswith(".sst"):
                    self._confirmed[f.name] = remote
                else:
                    self._confirmed_content[(f.size, f.checksum)] = remote
        if kgs.key_groups != self.key_groups:
            self.restore_stats.rescaled = True
            self._drop_outside_range()
        for i, src in enumerate(others):
            self._copy_in(src, self.work_dir / f"src-{i}", pool)
        restored = [s[2].info.get("checkpoint_id") for s in sources]
        if all(isinstance(c, int) for c in restored):
            self._prune_local(min(c for c in restored if isinstance(c, int)))

    def _check_sources(self, sources: list[RestoreSource]) -> None:
        covered: set[int] = set()
        for _s, _m, kgs in sources:
            info = kgs.info
            if info.get("backend") != BACKEND_NAME or info.get("format") != BACKEND_FORMAT:
                raise StateBackendError(
                    f"key groups {kgs.key_groups.start}-{kgs.key_groups.end}: not state of "
                    f"this backend ({BACKEND_NAME} v{BACKEND_FORMAT}): {info.get('backend')!r}"
                )
            if info.get("max_parallelism") != self.max_parallelism:
                raise StateBackendError(
                    f"state was written with max parallelism {info.get('max_parallelism')}, "
                    f"job has {self.max_parallelism} (it is fixed at job creation)"
                )
            covered.update(range(kgs.key_groups.start, kgs.key_groups.end + 1))
        missing = set(range(self.key_groups.start, self.key_groups.end + 1)) - covered
        if missing:
            raise StateBackendError(
                f"restore has no state for key groups {min(missing)}..{max(missing)} "
                f"of operator {self.operator!r}"
            )

    def _local_pool(self) -> dict[tuple[str, str], Path]:
        """(name, checksum) -> path of every file in a complete local snapshot of this
        operator (any range, any checkpoint)."""
        pool: dict[tuple[str, str], Path] = {}
        for snap in self.op_dir.glob("kg-*/snap-*"):
            files = _read_marker(snap)
            for name, (_size, checksum) in (files or {}).items():
                pool[(name, checksum)] = snap / name
        return pool

    def _fetch(self, src: RestoreSource, target: Path, pool: dict[tuple[str, str], Path]) -> None:
        """Materialise one source range's RocksDB files in `target`: local hard links where
        a snapshot has the same file, downloads (verified) for the rest."""
        storage, metadata_key, kgs = src
        target.mkdir(parents=True)
        todo: list[tuple[StateFile, str]] = []
        for f in kgs.files:
            if f.external:
                raise StateBackendError(
                    f"{f.path}: external state files must be copied into the job first"
                )
            if not f.name or not _SAFE_NAME.match(f.name) or f.name == LOCAL_MARKER:
                raise StateBackendError(f"{metadata_key}: bad local file name {f.name!r}")
            local = pool.get((f.name, f.checksum))
            if local is not None:
                try:
                    # SSTs are immutable: hard link. RocksDB rewrites the others: copy.
                    _link_or_copy(local, target / f.name, link=f.name.endswith(".sst"))
                    self.restore_stats.files_local += 1
                    continue
                except FileNotFoundError:
                    pass  # pruned meanwhile by another task: download instead
            todo.append((f, layout.resolve(metadata_key, f.path)))
        stored = {f.name for f in kgs.files}
        for small in kgs.inline:
            if not _SAFE_NAME.match(small.name) or small.name == LOCAL_MARKER or (
                small.name in stored
            ):
                raise StateBackendError(f"{metadata_key}: bad inline file name {small.name!r}")
            try:
                (target / small.name).write_bytes(small.content())
            except ValueError as e:
                raise StateBackendError(f"{metadata_key}: {e}") from e

        def download(item: tuple[StateFile, str]) -> None:
            f, key = item
            assert f.name is not None
            tmp = target / f".{f.name}{layout.TEMP_MARKER}{uuid.uuid4().hex}"
            storage.download(key, tmp)
            if tmp.stat().st_size != f.size or file_checksum(tmp) != f.checksum:
                tmp.unlink(missing_ok=True)
                raise StateBackendError(f"{storage.uri}/{key}: checksum mismatch")
            os.replace(tmp, target / f.name)

        self._run(download, todo)
        self.restore_stats.files_downloaded += len(todo)
        self.restore_stats.bytes_downloaded += sum(f.size for f, _ in todo)

    def _run(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        if len(items) <= 1 or self.transfer_threads == 1:
            return [fn(i) for i in items]
        with ThreadPoolExecutor(min(self.transfer_threads, len(items))) as pool:
            return list(pool.map(fn, items))

    def _drop_outside_range(self) -> None:
        lower, upper = range_bounds(self.key_groups)
        db = self._require_db()
        if lower > b"\x00\x00":
            db.delete_range(b"\x00\x00", lower)
        db.delete_range(upper, b"\xff\xff\xff")

    def _copy_in(self, src: RestoreSource, path: Path, pool: dict[tuple[str, str], Path]) -> None:
        """Rescaling: copy the keys of our range from another source range's DB."""
        self._fetch(src, path, pool)
        r = src[2].key_groups
        both = KeyGroupRange(
            start=max(r.start, self.key_groups.start), end=min(r.end, self.key_groups.end)
        )
        lower, upper = range_bounds(both)
        source = Rdict(str(path), _raw_options(), access_type=AccessType.read_only())
        try:
            batch, db = WriteBatch(raw_mode=True), self._require_db()
            for key, value in _RocksKV(source).range(lower, upper):
                batch.put(key, value)
                self.restore_stats.keys_copied += 1
                if batch.len() >= _COPY_BATCH:
                    db.write(batch)
                    batch = WriteBatch(raw_mode=True)
            if batch.len():
                db.write(batch)
        finally:
            source.close()
            del source
        shutil.rmtree(path, ignore_errors=True)

    # -- state access --------------------------------------------------------------------
    def _require_db(self) -> Rdict:
        if self._db is None:
            raise StateBackendError("state backend is closed")
        return self._db

    def _require_kv(self) -> _RocksKV:
        self._require_db()
        assert self._kv is not None
        return self._kv

    def for_key(self, key: Key) -> KeyedState:
        """All state of `key` (which must belong to this task's key groups)."""
        state = KeyedState(self._require_kv(), key, self.max_parallelism)
        if state.key_group not in self.key_groups:
            raise ValueError(
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

    def items(self) -> Iterator[tuple[Key, dict[str, Any]]]:
        """Every key of this task's range with all its state: (key, {state name: value});
        list state as a list, map state as a dict. Grouped per key group, so memory is
        bounded by the state of one key group."""
        kv = self._require_kv()
        lower, upper = range_bounds(self.key_groups)
        group = -1
        current: dict[Key, dict[str, Any]] = {}
        for raw, data in kv.range(lower, upper):
            d = decode_key(raw)
            if d.key_group != group:
                yield from current.items()
                current, group = {}, d.key_group
            states = current.setdefault(d.key, {})
            value = decode_value(d.kind, d.suffix, data)
            if d.kind is StateKind.MAP:
                states.setdefault(d.state_name, {})[value[0]] = value[1]
            else:
                states[d.state_name] = value
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
                    names.add(name)
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
        files (MANIFEST, CURRENT, WAL) go to exclusive/. Statistics: `info` of the result
        and `self.last_snapshot`."""
        db = self._require_db()
        check_key(metadata_key)
        snap = self.range_dir / f"snap-{checkpoint_id}-{uuid.uuid4().hex}"
        stats = SnapshotStats(checkpoint_id)
        try:
            db.flush(True)
            _settle_compactions(db)
            Checkpoint(db).create_checkpoint(str(snap))
            for wal in snap.glob("*.log"):
                # Writes skip the WAL and the flush above emptied it: RocksDB opens the
                # checkpoint without it, so it would only cost a file per task and checkpoint.
                if wal.stat().st_size == 0:
                    wal.unlink()
            names = sorted(p.name for p in snap.iterdir() if p.is_file())
            inline = [
                n for n in names
                if not _shared_file(n) and (snap / n).stat().st_size <= INLINE_MAX_BYTES
            ]
            names = [n for n in names if n not in inline]
            reuse: dict[str, _Remote] = {}
            new: list[str] = []
            for name in names:
                old: _Remote | None = None
                if name.endswith(".sst"):
                    old = self._confirmed.get(name)
                    if old is not None and old.size != (snap / name).stat().st_size:
                        old = None
                elif _shared_file(name) and self._confirmed_content:
                    local = snap / name
                    content = (local.stat().st_size, file_checksum(local))
                    old = self._confirmed_content.get(content)
                if old is not None and old.storage_uri == storage.uri:
                    reuse[name] = old
                else:
                    new.append(name)

            def upload(name: str) -> _Remote:
                path = snap / name
                size, checksum = path.stat().st_size, file_checksum(path)
                if _shared_file(name):
                    key = layout.shared_key(epoch, checkpoint_id, hint=name)
                else:
                    key = layout.exclusive_key(epoch, checkpoint_id, hint=name)
                storage.upload(path, key)
                return _Remote(storage.uri, key, size, checksum)

            saved_threads, self.transfer_threads = self.transfer_threads, upload_threads
            try:
                uploaded = dict(zip(new, self._run(upload, new), strict=True))
            finally:
                self.transfer_threads = saved_threads
            files: list[StateFile] = []
            for name in names:
                r = reuse.get(name) or uploaded[name]
                scope = Scope.SHARED if _shared_file(name) else Scope.EXCLUSIVE
                path = layout.relativize(metadata_key, r.key)
                files.append(
                    StateFile(path=path, scope=scope, size=r.size, checksum=r.checksum, name=name)
                )
            stats.files_reused = len(reuse)
            stats.bytes_reused = sum(r.size for r in reuse.values())
            stats.files_uploaded = len(uploaded)
            stats.bytes_uploaded = sum(r.size for r in uploaded.values())
            inline_files = [InlineFile.of(n, (snap / n).read_bytes()) for n in inline]
            stats.state_size = stats.bytes_reused + stats.bytes_uploaded
            everything = reuse | uploaded
            _write_json_atomic(
                snap / LOCAL_MARKER,
                {
                    "format": _MARKER_FORMAT,
                    "version": 1,
                    "operator": self.operator,
                    "key_groups": [self.key_groups.start, self.key_groups.end],
                    "checkpoint_id": checkpoint_id,
                    "metadata_key": metadata_key,
                    "files": {
                        n: {"size": r.size, "checksum": r.checksum} for n, r in everything.items()
                    },
                },
            )
        except BaseException:
            shutil.rmtree(snap, ignore_errors=True)
            raise
        self._pending[checkpoint_id] = _Pending(
            snap,
            {n: r for n, r in everything.items() if n.endswith(".sst")},
            {
                (r.size, r.checksum): r
                for n, r in everything.items()
                if _shared_file(n) and not n.endswith(".sst")
            },
        )
        self.last_snapshot = stats
        return KeyGroupState(
            key_groups=self.key_groups,
            files=files,
            inline=inline_files,
            info={
                "backend": BACKEND_NAME,
                "format": BACKEND_FORMAT,
                "operator": self.operator,
                "max_parallelism": self.max_parallelism,
                "epoch": epoch,
                "checkpoint_id": checkpoint_id,
                "bytes_uploaded": stats.bytes_uploaded,
                "files_uploaded": stats.files_uploaded,
                "files_reused": stats.files_reused,
                "state_size": stats.state_size,
            },
        )

    def commit_local(self, checkpoint_id: int) -> None:
        """The driver completed `checkpoint_id`: later snapshots of this backend may
        reference its files, and older local snapshots of the operator are deleted.

        Optional for correctness: a new task restoring `checkpoint_id` finds the local
        snapshot by its marker either way, and prunes older ones itself."""
        pending = self._pending.pop(checkpoint_id, None)
        if pending is None:
            raise StateBackendError(f"no local snapshot of checkpoint {checkpoint_id}")
        self._confirmed = pending.files
        self._confirmed_content = pending.content
        for cid in [c for c in self._pending if c < checkpoint_id]:
            shutil.rmtree(self._pending.pop(cid).path, ignore_errors=True)
        self._prune_local(checkpoint_id)

    def _prune_local(self, keep_from: int) -> None:
        """Delete this operator's local snapshots older than checkpoint `keep_from` (no
        task restores from them any more; a straggler that still does just downloads)."""
        for snap in self.op_dir.glob("kg-*/snap-*"):
            m = _SNAP_DIR.match(snap.name)
            if m and int(m["ckpt"]) < keep_from:
                shutil.rmtree(snap, ignore_errors=True)

    # -- closing -------------------------------------------------------------------------
    def _discard_work(self) -> None:
        if self._db is not None:
            self._db.close()
        self._db = self._kv = None
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def close(self) -> None:
        """Close the DB and delete the private working copy. Local snapshots stay: the
        next task for this range restores from them without downloading."""
        self._discard_work()

    def __enter__(self) -> TaskStateBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
