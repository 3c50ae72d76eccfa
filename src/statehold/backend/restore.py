"""Restoring a task's key-group range from a checkpoint: which source ranges it needs, their
files brought onto local disk (linked from local snapshots or downloaded and verified), and,
when the parallelism changed, the keys of the range copied in from the other sources.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from rocksdict import AccessType, Rdict, WriteBatch

from statehold.backend.changelog import (
    CHANGELOG_FORMAT,
    changelog_checkpoint,
    is_changelog,
    replay,
)
from statehold.backend.engine import (
    BACKEND_FORMAT,
    BACKEND_NAME,
    RocksKV,
    StateBackendError,
    in_parallel,
    raw_options,
)
from statehold.backend.keys import range_bounds
from statehold.backend.local_snapshots import LOCAL_MARKER, SAFE_NAME, LocalPool, link_or_copy
from statehold.format import layout
from statehold.format.metadata import (
    CheckpointMetadata,
    KeyGroupRange,
    KeyGroupState,
    StateFile,
)
from statehold.storage.base import Storage, file_checksum

#: Keys per write when copying a source range's keys in.
_COPY_BATCH = 2000

#: (job storage, key of the `_metadata` the state belongs to, the task state in it)
RestoreSource = tuple[Storage, str, KeyGroupState]


@dataclass
class RestoreStats:
    files_downloaded: int = 0
    bytes_downloaded: int = 0
    files_local: int = 0  # hard-linked (or copied) from a local snapshot
    rescaled: bool = False
    keys_copied: int = 0
    #: opened from a local snapshot compacted after its checkpoint (`rocks._open_equivalent`)
    compacted: bool = False


def sources_from_metadata(
    storage: Storage, metadata_key: str, meta: CheckpointMetadata, operator: str
) -> list[RestoreSource]:
    """The restore sources of one operator in a checkpoint (all its key-group ranges;
    `TaskStateBackend.open` picks the ones overlapping the task's range)."""
    for op in meta.operators:
        if op.operator == operator:
            return [(storage, metadata_key, kg) for kg in op.ranges]
    return []


def check_sources(
    sources: list[RestoreSource], key_groups: KeyGroupRange, max_parallelism: int, operator: str
) -> None:
    """Refuse state of another backend or max parallelism, and gaps in `key_groups`."""
    covered: set[int] = set()
    for _s, _m, kgs in sources:
        info = kgs.info
        if info.get("backend") != BACKEND_NAME or info.get("format") not in (
            BACKEND_FORMAT, CHANGELOG_FORMAT
        ):
            raise StateBackendError(
                f"key groups {kgs.key_groups.start}-{kgs.key_groups.end}: not state of "
                f"this backend ({BACKEND_NAME} v{BACKEND_FORMAT}-{CHANGELOG_FORMAT}): "
                f"{info.get('backend')!r} v{info.get('format')!r}"
            )
        changelogs(kgs)
        if info.get("max_parallelism") != max_parallelism:
            raise StateBackendError(
                f"state was written with max parallelism {info.get('max_parallelism')}, "
                f"job has {max_parallelism} (it is fixed at job creation)"
            )
        covered.update(range(kgs.key_groups.start, kgs.key_groups.end + 1))
    missing = set(range(key_groups.start, key_groups.end + 1)) - covered
    if missing:
        raise StateBackendError(
            f"restore has no state for key groups {min(missing)}..{max(missing)} "
            f"of operator {operator!r}"
        )


def changelogs(kgs: KeyGroupState) -> list[str]:
    """The changelogs a task state names, in the order they apply; refused unless its
    format has them and they come in the order of the checkpoints that wrote them."""
    names = [f.name for f in kgs.files if f.name and is_changelog(f.name)]
    where = f"key groups {kgs.key_groups.start}-{kgs.key_groups.end}"
    if names and kgs.info.get("format") != CHANGELOG_FORMAT:
        raise StateBackendError(f"{where}: changelogs in a state of format "
                                f"{kgs.info.get('format')!r}")
    ids = [changelog_checkpoint(n) for n in names]
    if ids != sorted(set(ids)):
        raise StateBackendError(f"{where}: changelogs out of order: {names}")
    return names


def replay_changelogs(
    db: Rdict, fetched: Path, kgs: KeyGroupState, key_groups: KeyGroupRange | None = None
) -> None:
    """Apply the changelogs of `kgs` that `fetch` put in `fetched` (only the keys of
    `key_groups`, if given) and delete them there."""
    names = changelogs(kgs)
    if names:
        replay(db, [fetched / n for n in names],
               None if key_groups is None else range_bounds(key_groups))
    for n in names:
        (fetched / n).unlink(missing_ok=True)


def largest_overlap(sources: list[RestoreSource], key_groups: KeyGroupRange) -> RestoreSource:
    """The source sharing the most key groups with `key_groups`: its DB becomes the
    working DB, so the fewest keys are copied."""

    def overlap(src: RestoreSource) -> int:
        r = src[2].key_groups
        return min(r.end, key_groups.end) - max(r.start, key_groups.start) + 1

    return max(sources, key=overlap)


def fetch(
    src: RestoreSource, target: Path, pool: LocalPool, stats: RestoreStats, threads: int
) -> None:
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
        if not f.name or not SAFE_NAME.match(f.name) or f.name == LOCAL_MARKER:
            raise StateBackendError(f"{metadata_key}: bad local file name {f.name!r}")
        local = pool.get((f.name, f.checksum))
        if local is not None:
            try:
                # SSTs are immutable: hard link. RocksDB rewrites the others: copy.
                link_or_copy(local, target / f.name, link=f.name.endswith(".sst"))
                stats.files_local += 1
                continue
            except FileNotFoundError:
                pass  # pruned meanwhile by another task: download instead
        todo.append((f, layout.resolve(metadata_key, f.path)))
    stored = {f.name for f in kgs.files}
    for small in kgs.inline:
        if not SAFE_NAME.match(small.name) or small.name == LOCAL_MARKER or (
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

    in_parallel(download, todo, threads)
    stats.files_downloaded += len(todo)
    stats.bytes_downloaded += sum(f.size for f, _ in todo)


def drop_outside_range(db: Rdict, key_groups: KeyGroupRange) -> None:
    """Delete every key outside `key_groups` (the base source covered more of them)."""
    lower, upper = range_bounds(key_groups)
    if lower > b"\x00\x00":
        db.delete_range(b"\x00\x00", lower)
    db.delete_range(upper, b"\xff\xff\xff")


def copy_in(
    src: RestoreSource,
    path: Path,
    pool: LocalPool,
    db: Rdict,
    key_groups: KeyGroupRange,
    stats: RestoreStats,
    threads: int,
) -> None:
    """Rescaling: copy the keys of `key_groups` from another source range's DB (fetched
    to `path`, deleted afterwards) into `db`."""
    fetch(src, path, pool, stats, threads)
    r = src[2].key_groups
    both = KeyGroupRange(start=max(r.start, key_groups.start), end=min(r.end, key_groups.end))
    lower, upper = range_bounds(both)
    source = Rdict(str(path), raw_options(), access_type=AccessType.read_only())
    try:
        batch = WriteBatch(raw_mode=True)
        for key, value in RocksKV(source).range(lower, upper):
            batch.put(key, value)
            stats.keys_copied += 1
            if batch.len() >= _COPY_BATCH:
                db.write(batch)
                batch = WriteBatch(raw_mode=True)
        if batch.len():
            db.write(batch)
    finally:
        source.close()
        del source
    # changelogs post-date the base they extend, so they apply after its keys
    replay_changelogs(db, path, src[2], both)
    shutil.rmtree(path, ignore_errors=True)
