"""The deletion rule for Spark's own checkpoint locations (`statehold gc CKPT`), the
counterpart of the job directory's rule (`statehold.cleanup.policy`, whose `Verdict`s it
gives): every delete in a Spark checkpoint location asks it. It judges one listed file
from plain data (`SparkView`), in this order:

* **Foreign**: symlinks and names Spark does not write; reported, never deleted.
* **Referenced**: a file some batch Spark may still restart from (or be rolled back to)
  needs, and every file of a store whose needs could not be resolved (spared whole).
* **Kept**: the query's ``metadata``, ``offsets/``, ``commits/``, ``sources/``, operator
  metadata and state schemas: Spark purges them itself, by its own retention; a
  rollback's mark (the rollback removes it when it finishes); and what a repair set aside
  under ``_repaired/`` (the user's to remove: it may be all that is left of a version).
* **Protected** (may be in flight): a file modified at or after the listing began, or
  younger than the grace; a version file above the newest committed version (a batch
  running now writes it).
* A ``.crc`` (Hadoop's checksum beside a file) follows its subject: kept while the
  subject is kept, deletable once the subject is gone or being deleted.
* **Deletable**: the rest: orphan SSTs and RocksDB logs, zips, changelogs, deltas and
  snapshots no retained version needs, old temp files.

`check_deletable` is the last line, run on every key just before gc deletes it.
`SparkGcRule` is this rule as the one guarded batch deleter (`cleanup.bulk_delete`)
asks it for one gc pass: that last line, and before each batch of deletes the re-check
of what the listing relied on (no rollback begun, the commit log not gone back) and of
each file (still the size and mtime it was judged by, still old; not for SSTs and
RocksDB logs, whose names are never written twice).

A rollback (`statehold rollback`) deletes what the batches after the one it rolls back
to wrote, and `check_rollback_deletable` is its last line: the offsets and commit logs,
the sources' and a file sink's logs, state version files, operator metadata v2 and
schema v3 files, their checksums, and its own mark once it is done. Never the query's
``metadata``, a store's schema, SSTs or RocksDB logs (shared between versions: gc
decides about them), nor a name Spark does not write. Which *batches* go is the caller's
decision; this rule guarantees a rollback cannot delete a kind of file it has no
business with, whatever its planning got wrong.

A repair (`statehold repair`) sets aside a snapshot that does not load: it moves it out
of Spark's way, under ``_repaired/<time>/``, which on an object store is a copy then a
delete of the original. `check_set_aside` is its last line, for every key it moves: only
a RocksDB snapshot zip, an SST a zip lists, an HDFS-backed snapshot and their checksums,
and only to a key under ``_repaired/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from statehold.cleanup.rule import DeletionInterrupted, Verdict
from statehold.errors import StateholdError
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import (
    COMMITS_DIR,
    ROLLBACK_MARKER,
    VERSION_FILES,
    Kind,
    Name,
    StoreId,
    is_decimal,
    parse,
)
from statehold.storage.base import FileInfo, Storage, StorageError, UnsafePathError, check_key

#: A file younger than this may be an upload, a maintenance run or an atomic write still
#: under way (Spark's maintenance runs every minute by default; a slow task's upload can
#: take longer): never deleted.
SPARK_GC_GRACE_SECONDS = 3600.0

#: Spark purges these itself (by ``minBatchesToRetain``); gc never deletes them.
KEPT_KINDS = frozenset(
    {
        Kind.QUERY_METADATA,
        Kind.OFFSETS,
        Kind.COMMITS,
        Kind.SOURCE_LOG,
        Kind.OPERATOR_METADATA,
        Kind.STORE_SCHEMA,
        Kind.ROLLBACK_MARKER,
        Kind.REPAIRED,
    }
)
#: The only kinds gc ever deletes.
DELETABLE_KINDS = frozenset({*VERSION_FILES, Kind.SST, Kind.ROCKSDB_LOG, Kind.CRC, Kind.TEMP})
#: The store subdirectories whose files `judge_names` decides by name and mtime.
SHARED_DIRS = {"SSTs": ".sst", "logs": ".log"}


@dataclass(frozen=True)
class SparkView:
    """What a judgment relies on, made once per gc from one listing."""

    #: Every key a batch Spark may restart from (or be rolled back to) needs.
    needed: frozenset[str]
    #: When the listing began: a file modified since was written during it.
    listed_at: float
    now: float
    grace: float = SPARK_GC_GRACE_SECONDS
    #: The state version the newest committed batch wrote (batch N writes N+1); None with
    #: no committed batch. Version files above it are in flight.
    newest_version: int | None = None
    #: Stores whose needs could not be resolved: every file of them is spared.
    spared: frozenset[StoreId] = field(default_factory=frozenset)

    def young(self, mtime: float) -> bool:
        return mtime >= self.listed_at or self.now - mtime < self.grace


def judge(
    info: FileInfo, name: Name, view: SparkView, *, subject: Verdict | None = None
) -> Verdict:
    """The rule's decision for one listed file. For a ``.crc``, `subject` is its subject's
    verdict (None: the subject is not in the listing)."""
    if info.symlink or name.kind is Kind.UNKNOWN:
        return Verdict.FOREIGN
    if info.key in view.needed or (view.spared and _store(name) in view.spared):
        return Verdict.REFERENCED
    if name.kind in KEPT_KINDS:
        return Verdict.KEPT
    if view.young(info.mtime):
        return Verdict.PROTECTED
    if name.kind in VERSION_FILES and _above_newest(name, view):
        return Verdict.PROTECTED
    if name.kind is Kind.TEMP:
        target = temp_subject(info.key)
        if target is not None and target.kind is Kind.CRC and target.of is not None:
            target = parse(target.of)  # a checksum Spark 4 writes beside the version file
        if target is not None and target.kind in VERSION_FILES and _above_newest(target, view):
            return Verdict.PROTECTED  # being written by the running batch: open for its length
    if name.kind is Kind.CRC and subject is not None and subject is not Verdict.DELETABLE:
        return subject
    return Verdict.DELETABLE


def _above_newest(name: Name, view: SparkView) -> bool:
    return view.newest_version is None or (name.version or 0) > view.newest_version


#: Spark's atomic writes (``CheckpointFileManager.createAtomic``): ``.<name>.<uuid>.tmp``,
#: ``.<name>.<uuid>.TID<task attempt>.tmp`` when a task writes it (PySpark 4.3; a gc that
#: missed the suffix deleted a running task's changelog under load, failing its commit).
_ATOMIC_TEMP = re.compile(
    r"^\.(?P<subject>.+)\.[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"
    r"(?:\.TID\d+)?\.tmp$"
)


def temp_subject(key: str) -> Name | None:
    """What a temp file of Spark's atomic write becomes once renamed (None: not one).
    A state version's file is written in it for the whole task (a changelog as the batch
    updates the store), so the version rule covers it, whatever its age."""
    head, _, leaf = key.rpartition("/")
    match = _ATOMIC_TEMP.match(leaf)
    if match is None:
        return None
    return parse(f"{head}/{match['subject']}" if head else match["subject"])


def _store(name: Name) -> StoreId | None:
    """The store a file belongs to (a checksum: its subject's)."""
    if name.kind is Kind.CRC and name.of is not None:
        return parse(name.of).store
    return name.store


def judge_names(
    directory: str, names: list[str], mtimes: list[float], view: SparkView
) -> dict[Verdict | None, list[int]]:
    """`judge` for the plain files of one store's ``SSTs/`` or ``logs/`` directory at
    once (by index into `names`), for a gc over 100,000s of orphans: the same decisions.
    Names that are not plain SSTs or logs (checksums, temp files, odd names) come back
    under None, to be parsed and given to `judge`, after every other name (a checksum
    follows its subject)."""
    out: dict[Verdict | None, list[int]] = {v: [] for v in (*Verdict, None)}
    store = shared_dir_store(directory)
    if store is None:
        out[None] = list(range(len(names)))
        return out
    if store in view.spared:
        out[Verdict.REFERENCED] = list(range(len(names)))
        return out
    suffix = SHARED_DIRS[directory.rsplit("/", 1)[1]]
    needed, listed_at, oldest = view.needed, view.listed_at, view.now - view.grace
    referenced, protected, deletable, undecided = (
        out[Verdict.REFERENCED], out[Verdict.PROTECTED], out[Verdict.DELETABLE], out[None]
    )
    prefix = directory + "/"
    for i, name in enumerate(names):
        if not name.endswith(suffix) or name.startswith("."):
            undecided.append(i)
        elif prefix + name in needed:
            referenced.append(i)
        elif mtimes[i] >= listed_at or mtimes[i] > oldest:
            protected.append(i)
        else:
            deletable.append(i)
    return out


def shared_dir_store(directory: str) -> StoreId | None:
    """The store whose ``SSTs/`` or ``logs/`` `directory` is, else None."""
    leaf = directory.rsplit("/", 1)[-1]
    suffix = SHARED_DIRS.get(leaf)
    if suffix is None:
        return None
    name = parse(f"{directory}/x{suffix}")
    return name.store if name.kind in (Kind.SST, Kind.ROCKSDB_LOG) else None


def check_deletable(key: str) -> str:
    """Refuse (UnsafePathError) a key whose kind gc never deletes, or that is not a safe
    key: the last line, before anything is deleted, below every decision."""
    kind = parse(check_key(key)).kind
    if kind not in DELETABLE_KINDS:
        raise UnsafePathError(
            f"refusing to delete {key!r} ({kind}): the Spark deletion rule never does"
        )
    return key


_PLAIN = re.compile(r"(?:[A-Za-z0-9_.-]+\n)*[A-Za-z0-9_.-]+")


def check_deletable_names(directory: str, names: list[str]) -> list[str]:
    """`check_deletable` for many files of one directory: in a store's ``SSTs/`` or
    ``logs/`` every plain name with the directory's suffix is checked by one regex."""
    store = shared_dir_store(directory)
    if store is not None and names:
        suffix = SHARED_DIRS[directory.rsplit("/", 1)[1]]
        if _PLAIN.fullmatch("\n".join(names)) and all(
            n.endswith(suffix) and not n.startswith(".") for n in names
        ):
            return names
    for name in names:
        check_deletable(f"{directory}/{name}" if directory else name)
    return names


# -- the rule as gc's deleter asks it ------------------------------------------------------
#: A file's mtime may read back this much apart from its listing's (an object store's
#: HEAD gives whole seconds, its listing milliseconds).
_MTIME_SLACK = 1.0


class SparkGcInterruptedError(SparkCheckpointError, DeletionInterrupted):
    """The query was rolled back or restarted from an older batch while gc ran; gc
    stopped before its next batch of deletes. Run it again."""


@dataclass
class SparkGcRule:
    """This rule for one gc pass, as the one deleter asks it (`cleanup.rule.DeletionRule`).
    `newest` and `mark`: the newest committed batch and the rollback mark's mtime in the
    listing."""

    storage: Storage
    view: SparkView
    newest: int | None
    mark: float | None
    #: The batch being handed over: each name's size and mtime as listed (gc sets it).
    listed: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: Files deleted so far this pass (gc tells it after each batch), for a stop's message.
    deleted: int = 0
    #: Files left because they changed (or vanished) since the listing.
    changed: int = 0

    def check_names(self, directory: str, names: list[str]) -> list[str]:
        return check_deletable_names(directory, names)

    def recheck(self) -> None:
        _check_commits(self.storage, self.newest, self.mark, self.deleted)

    def unchanged(self, directory: str, names: list[str]) -> list[str]:
        if unique_names(directory):
            return names
        batch = [(n, *self.listed[n]) for n in names]
        same = _unchanged(self.storage, directory, names, batch, self.view)
        self.changed += len(batch) - len(same)
        return [e[0] for e in same]


def _unchanged(
    storage: Storage,
    directory: str,
    names: list[str],
    batch: list[tuple[str, int, float]],
    view: SparkView,
) -> list[tuple[str, int, float]]:
    """The files of `batch` still as the listing saw them, and still not young."""
    now = storage.stat_names(directory, names)
    oldest = min(view.listed_at, view.now - view.grace)  # `SparkView.young`
    return [
        e
        for e, cur in zip(batch, now, strict=True)
        if cur is not None
        and cur.size == e[1]
        and abs(cur.mtime - e[2]) <= _MTIME_SLACK
        and cur.mtime < oldest
    ]


def unique_names(directory: str) -> bool:
    """A store's ``SSTs/`` or ``logs/``: every name there is written once (it carries the
    uploading task's UUID)."""
    return shared_dir_store(directory) is not None


def _check_commits(
    storage: Storage, newest: int | None, mark: float | None, deleted: int
) -> None:
    """Stop if a rollback began (a mark not in the listing, `mark` its mtime there) or the
    commit log's newest batch went back since the listing."""
    try:
        mark_now = storage.stat(ROLLBACK_MARKER)
        marked = mark_now is not None and mark_now.mtime != mark
        _dirs, files = storage.list_top(COMMITS_DIR) if newest is not None else ([], [])
    except StorageError as e:
        raise SparkGcInterruptedError(f"{COMMITS_DIR}: cannot be listed ({e})") from None
    if marked:
        raise SparkGcInterruptedError(
            f"{ROLLBACK_MARKER}: a rollback began while gc ran; gc stopped after deleting "
            f"{deleted} files. Run it again once the rollback is done."
        )
    if newest is None:
        return
    batches = [int(n) for f in files if is_decimal(n := f.key.rpartition("/")[2])]
    now = max(batches, default=None)
    if now is None or now < newest:
        raise SparkGcInterruptedError(
            f"{COMMITS_DIR}: the newest committed batch went from {newest} to {now} while gc "
            "ran (the query was rolled back or restarted from an older checkpoint); gc "
            f"stopped after deleting {deleted} files. Run it again."
        )



#: Kinds a rollback removes (the batches after the one it rolls back to).
ROLLBACK_KINDS = {
    Kind.OFFSETS,
    Kind.COMMITS,
    Kind.SOURCE_LOG,
    Kind.ZIP,
    Kind.CHANGELOG,
    Kind.DELTA,
    Kind.HDFS_SNAPSHOT,
    Kind.ROLLBACK_MARKER,
}
#: Operator metadata v2 and state schema v3 files, named by the batch that wrote them.
_BATCH_NAMED_OPERATOR_FILE = re.compile(
    r"^state/\d+/(_metadata/v2/\d+|_stateSchema/[^/]+/\d+_[0-9A-Za-z-]+)$"
)
#: A file sink's log, under the sink's output directory.
_SINK_LOG = re.compile(r"^_spark_metadata/\d+(\.compact)?$")


class DeletionRefusedError(StateholdError):
    """The deletion rule refuses to delete a key."""


def check_rollback_deletable(key: str) -> None:
    """Raise DeletionRefusedError unless a rollback may delete `key` (a key under the
    checkpoint location, or ``_spark_metadata/N`` under a file sink's directory)."""
    if not _rollback_kind(_subject(key)):
        raise DeletionRefusedError(f"{key}: a rollback never deletes this file")


#: Kinds a repair may move out of Spark's way (`check_set_aside`).
SET_ASIDE_KINDS = frozenset({Kind.ZIP, Kind.SST, Kind.HDFS_SNAPSHOT})


def check_set_aside(key: str, dest: str) -> None:
    """Raise DeletionRefusedError unless a repair may move `key` to `dest`: a snapshot,
    an SST or a checksum of one, to a key under ``_repaired/`` (the move removes `key`
    from where Spark reads it: on an object store it deletes it after the copy)."""
    if parse(check_key(dest)).kind is not Kind.REPAIRED:
        raise DeletionRefusedError(f"{key}: a repair moves files only under _repaired/, "
                                   f"not to {dest}")
    if parse(check_key(_subject(key))).kind not in SET_ASIDE_KINDS:
        raise DeletionRefusedError(f"{key}: a repair never sets this file aside")


def _subject(key: str) -> str:
    """The file a checksum companion belongs to (Hadoop's ``.NAME.crc``, Spark 4's
    ``NAME.crc`` beside state files, and the ``.crc`` of either), else the key itself."""
    head, _, leaf = key.rpartition("/")
    if leaf.startswith(".") and leaf.endswith(".crc"):
        leaf = leaf[1:-4]
    if leaf.endswith(".crc"):
        leaf = leaf[:-4]
    return f"{head}/{leaf}" if head else leaf


def _rollback_kind(key: str) -> bool:
    if _SINK_LOG.match(key) or _BATCH_NAMED_OPERATOR_FILE.match(key):
        return True
    return parse(key).kind in ROLLBACK_KINDS


__all__ = [
    "DELETABLE_KINDS",
    "KEPT_KINDS",
    "ROLLBACK_KINDS",
    "SET_ASIDE_KINDS",
    "SPARK_GC_GRACE_SECONDS",
    "DeletionRefusedError",
    "SparkGcInterruptedError",
    "SparkGcRule",
    "SparkView",
    "check_deletable",
    "check_deletable_names",
    "check_rollback_deletable",
    "check_set_aside",
    "judge",
    "judge_names",
    "shared_dir_store",
    "unique_names",
]
