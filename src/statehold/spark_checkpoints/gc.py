"""Safe garbage collection of a Spark checkpoint location (`statehold gc CKPT`), beside a
query that may be running.

One listing (its start time noted) is judged by the Spark deletion rule
(`spark_checkpoints.policy`) against what every retained batch needs: for each store, the
resolution (`stores.resolve`) of the state version of every batch in the commit log
(batch B restarts from version B+1; with checkpoint format v2 the version's unique id is
the one commits/B recorded), plus the files every zip it keeps lists. A store whose
retained versions cannot be resolved (an unreadable zip, a bad lineage, a gap after a
held version) is spared whole and named, one line each.

The deletable files go, a batch at a time (one directory's files, at most
`batch_size`; a file's ``.crc`` right after it), to the one guarded batch deleter both
worlds' gc use (`cleanup.bulk_delete.BulkDeleter`), in this thread, with the rule for
this pass (`policy.SparkGcRule`). Before each batch it re-checks: no rollback has begun
(its mark) and the commit log's newest batch has not gone back (a rollback or a restart
from an older checkpoint: it stops, `SparkGcInterruptedError`), and each file still has
the size and mtime it was judged by (a changed or vanished one is left). SSTs and
RocksDB logs skip that second check: their names carry a uuid Spark draws for each
snapshot it uploads, so no later upload writes another file under a name (a later zip
may list the same file again, never rewrite it), and a file the listing saw is the file
being deleted. A failed delete is not retried: the report names it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from statehold import clock
from statehold.cleanup.bulk_delete import BatchTry, BulkDeleter
from statehold.cleanup.rule import Verdict
from statehold.format import results as shared
from statehold.progress import Advance, NoProgress
from statehold.progress import Progress as ProgressProtocol
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import (
    ROLLBACK_MARKER,
    Kind,
    StoreId,
    crc_of,
    parse,
)
from statehold.spark_checkpoints.location import SparkCheckpoint, unique_id
from statehold.spark_checkpoints.logs import Commit
from statehold.spark_checkpoints.policy import (
    SPARK_GC_GRACE_SECONDS,
    SparkGcRule,
    SparkView,
    judge,
    judge_names,
    shared_dir_store,
)
from statehold.spark_checkpoints.policy import (  # their old home: still imported from here
    SparkGcInterruptedError as SparkGcInterruptedError,
)
from statehold.spark_checkpoints.policy import unique_names as unique_names
from statehold.spark_checkpoints.rollback_marker import refuse_unfinished
from statehold.spark_checkpoints.scan import Scan
from statehold.spark_checkpoints.stores import resolve
from statehold.storage.base import DeleteError, FileInfo, Storage

#: At most this many keys are named in each of a report's key lists.
SAMPLE = 1000
#: Files a batch of deletes holds: one re-check each (a local disk; an object store
#: deletes 1,000 keys a request and re-checks by listing the same range).
LOCAL_BATCH = 20_000
OBJECT_STORE_BATCH = 1000


class SparkGcReport(shared.GcReport):
    """What gc found and did (`statehold.format.results.GcReport`, a Spark location's
    keys filled). Key lists are samples of at most `SAMPLE` keys; counts count every
    file."""

    location_kind: Literal["spark"] = "spark"
    uri: str
    listed: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def foreign_keys(self) -> list[str]:
        """`foreign`, by its old name."""
        return self.foreign


@dataclass
class _Dir:
    """A store's ``SSTs/`` or ``logs/``: names with their stat, judged in bulk."""

    names: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    mtimes: list[float] = field(default_factory=list)


#: A file to delete: (name in its directory, size, mtime), by directory.
_Plan = dict[str, list[tuple[str, int, float]]]


def gc(
    checkpoint: SparkCheckpoint,
    *,
    dry_run: bool = False,
    grace_seconds: float = SPARK_GC_GRACE_SECONDS,
    progress: ProgressProtocol | None = None,
    batch_size: int | None = None,
) -> SparkGcReport:
    """Delete what no batch Spark may still restart from (or be rolled back to) needs,
    and what the rule says is no longer in flight. Raises SparkCheckpointError, deleting
    nothing, for a commit log it cannot read (an unknown version); SparkGcInterruptedError
    if the query was rolled back while it deleted. `progress` gets counters: files listed
    (after each page) and, unless a dry run, files deleted and bytes freed of those
    planned (after each batch of deletes)."""
    progress = _told(progress) if callable(progress) else progress or NoProgress()
    storage = checkpoint.storage
    checkpoint.forget_reads()  # a zip read before this listing may have been rewritten
    found, bulk = _list(storage, progress.counter(f"gc {checkpoint.uri}: listed", None, "files"))
    refuse_unfinished(storage, found, "collect garbage")
    report = SparkGcReport(uri=checkpoint.uri, dry_run=dry_run)
    report.listed = len(found.files) + sum(len(d.names) for d in bulk.values())
    commits = _read_commits(checkpoint, found)
    report.newest_batch, report.oldest_batch = max(commits, default=None), min(
        commits, default=None
    )
    needed, spared = _needed(checkpoint, found, commits, report)
    newest = report.newest_batch
    view = SparkView(
        needed=frozenset(needed),
        listed_at=found.started_at,
        now=clock.now(),
        grace=grace_seconds,
        newest_version=None if newest is None else newest + 1,
        spared=frozenset(spared),
    )
    view = _keep_what_kept_zips_list(checkpoint, found, view, report)
    plan = _judge(found, bulk, view, report)
    if dry_run or not plan:
        return report
    size = batch_size or (OBJECT_STORE_BATCH if storage.lists_in_key_order else LOCAL_BATCH)
    mark = found.files.get(ROLLBACK_MARKER)  # one left behind: only a new one stops gc
    planned = [e for entries in plan.values() for e in entries]
    deleted = progress.counter(f"gc {checkpoint.uri}: deleted", len(planned), "files")
    freed = progress.counter(f"gc {checkpoint.uri}: freed", sum(e[1] for e in planned), "bytes")
    rule = SparkGcRule(storage, view, newest, mark.mtime if mark else None)
    _delete(storage, plan, rule, size, report, (deleted, freed))
    return report


# -- the listing -------------------------------------------------------------------------
def _list(storage: Storage, listed: Advance) -> tuple[Scan, dict[str, _Dir]]:
    """One listing: the stores' ``SSTs/`` and ``logs/`` files as names with their stat
    (there may be 100,000s of orphans), every other file into a `Scan`; `listed` counts
    each page's files."""
    found = Scan(started_at=clock.now())
    bulk: dict[str, _Dir] = {}
    shared: dict[str, bool] = {}

    def is_shared(directory: str) -> bool:
        hit = shared.get(directory)
        if hit is None:
            hit = shared[directory] = shared_dir_store(directory) is not None
        return hit

    # pages of 100,000: a local disk hands each page's names over in inode order, and
    # unlinking in that order is faster (see `storage.local_listing`)
    for page in storage.list_stat_pages("", page_size=100_000):
        for info in page.infos:
            directory = info.key.rpartition("/")[0]
            if not info.symlink and is_shared(directory):
                entry = bulk.setdefault(directory, _Dir())
                entry.names.append(info.key.rpartition("/")[2])
                entry.sizes.append(info.size)
                entry.mtimes.append(info.mtime)
            else:
                found.add(info)
        if not page.names:
            continue
        if is_shared(page.directory):
            entry = bulk.setdefault(page.directory, _Dir())
            entry.names += page.names
            entry.sizes += page.sizes
            entry.mtimes += page.mtimes
        else:
            prefix = f"{page.directory}/" if page.directory else ""
            for name, size, mtime in zip(page.names, page.sizes, page.mtimes, strict=True):
                found.add(FileInfo(prefix + name, size, mtime))
        listed(len(page.infos) + len(page.names))
    return found, bulk


# -- what retained batches need ----------------------------------------------------------
def _read_commits(checkpoint: SparkCheckpoint, found: Scan) -> dict[int, Commit]:
    """The listed commits. One Spark purged since the listing (its retention deletes the
    oldest beside a running query) is no longer a batch a restart can start from: left
    out. The newest gone (a rollback), or one that is there but unreadable, raises. One
    written while the listing ran is left out too: the listing (in no particular order)
    may not hold the state its batch wrote, which is then in flight for this pass."""
    commits: dict[int, Commit] = {}
    newest = max(found.commits, default=None)
    for batch in sorted(found.commits):
        if found.files[found.commits[batch]].mtime >= found.started_at:
            continue
        try:
            commits[batch] = checkpoint.commit(batch)
        except SparkCheckpointError:
            if batch == newest or checkpoint.storage.stat(found.commits[batch]) is not None:
                raise
    return commits


def _needed(
    checkpoint: SparkCheckpoint,
    found: Scan,
    commits: dict[int, Commit],
    report: SparkGcReport,
) -> tuple[set[str], set[StoreId]]:
    """The keys every retained batch's state versions need, and the stores spared whole
    (their problems in the report). Retained versions Spark no longer holds are fine
    while they are the oldest ones (its maintenance deletes from the oldest up, and a
    restart from them is impossible already): what is left of them is not kept. One
    missing after a held one is a gap: the store is spared."""
    needed: set[str] = set()
    spared: set[StoreId] = set()
    orders: dict[int, list[str]] = {}
    for store in checkpoint.expected_stores(found):
        files = found.stores.get(store)
        if files is None:
            continue
        order = orders.get(store.operator)
        if order is None:
            order = orders[store.operator] = checkpoint.store_order(found, store.operator)
        mine: set[str] = set()
        unheld: list[int] = []
        held = False
        try:
            for batch, commit in commits.items():
                needs = resolve(files, batch + 1, checkpoint, unique_id(commit, store, order))
                if needs.ok:
                    mine.update(needs.files)
                    held = True
                elif held:
                    raise SparkCheckpointError(needs.problems[0])
                else:
                    unheld.append(batch)
            if commits and not held:
                raise SparkCheckpointError(
                    f"{store}: the newest committed batch's version is not held"
                )
        except SparkCheckpointError as e:
            _spare(report, spared, store, e)
            continue
        if unheld:
            report.notes.append(
                f"{store}: the state of retained batches {unheld[0]}-{unheld[-1]} is no "
                "longer held (Spark's own maintenance deleted it)"
            )
        needed |= mine
    return needed, spared


def _spare(
    report: SparkGcReport, spared: set[StoreId], store: StoreId, why: SparkCheckpointError
) -> None:
    """Nothing in `store` is deleted this pass; the report says why, in one line."""
    spared.add(store)
    line = f"{store}: spared, nothing in it deleted ({why})"
    report.spared_stores.append(line)
    report.problems.append(line)


def _keep_what_kept_zips_list(
    checkpoint: SparkCheckpoint, found: Scan, view: SparkView, report: SparkGcReport
) -> SparkView:
    """Every zip the rule keeps though no retained version needs it (in flight, young)
    keeps the SSTs and logs it lists: a version being written may reuse old SSTs. A zip
    that cannot be read spares its store."""
    extra: set[str] = set()
    spared = set(view.spared)
    for store, files in found.stores.items():
        if store in spared:
            continue
        for (kind, _v, _u), info in files.versions.items():
            if kind is not Kind.ZIP or info.key in view.needed:
                continue
            if judge(info, found.names[info.key], view) is Verdict.DELETABLE:
                continue
            try:
                listed = checkpoint.zip_files(info.key)
            except SparkCheckpointError as e:
                _spare(report, spared, store, e)
                break
            extra.update(f"{store.prefix}/{rel}" for rel in listed)
    if not extra and spared == view.spared:
        return view
    return replace(view, needed=view.needed | extra, spared=frozenset(spared))


# -- judging -----------------------------------------------------------------------------
def _judge(
    found: Scan, bulk: dict[str, _Dir], view: SparkView, report: SparkGcReport
) -> _Plan:
    """Every listed file's verdict, counted in the report; the deletable ones by
    directory, each ``.crc`` right after its subject."""
    verdicts: dict[str, Verdict] = {}
    crcs: list[str] = []
    for key, info in found.files.items():
        name = found.names[key]
        if name.kind is Kind.CRC and not info.symlink:
            crcs.append(key)
        else:
            verdicts[key] = judge(info, name, view)
    for key in crcs:
        name = found.names[key]
        subject = verdicts.get(name.of or "") or _bulk_verdict(bulk, name.of or "", view)
        verdicts[key] = judge(found.files[key], name, view, subject=subject)
    deletable: list[tuple[str, int, float]] = []
    for key, verdict in verdicts.items():
        info = found.files[key]
        _count(report, key, verdict, info.size, found.names[key].kind)
        if verdict is Verdict.DELETABLE:
            deletable.append((key, info.size, info.mtime))
    plan = _by_directory(deletable)
    for directory, entries in bulk.items():
        _judge_bulk(directory, entries, view, report, plan)
    return {d: _crc_after_subject(e) for d, e in plan.items() if e}


def _judge_bulk(
    directory: str, entries: _Dir, view: SparkView, report: SparkGcReport, plan: _Plan
) -> None:
    out = judge_names(directory, entries.names, entries.mtimes, view)
    names, sizes, mtimes = entries.names, entries.sizes, entries.mtimes
    report.referenced += len(out[Verdict.REFERENCED])
    for i in out[Verdict.PROTECTED]:
        _sample(report.protected, f"{directory}/{names[i]}")
    report.protected_count += len(out[Verdict.PROTECTED])
    doomed = out[Verdict.DELETABLE]
    if doomed:
        kind = Kind.SST if directory.endswith("/SSTs") else Kind.ROCKSDB_LOG
        nbytes = sum(sizes[i] for i in doomed)
        report.deletable += len(doomed)
        report.deletable_bytes += nbytes
        report.deletable_by_kind[kind] = report.deletable_by_kind.get(kind, 0) + len(doomed)
        plan.setdefault(directory, []).extend((names[i], sizes[i], mtimes[i]) for i in doomed)
    if not out[None]:
        return
    index = {n: i for i, n in enumerate(names)}
    verdict_of = {i: v for v, ids in out.items() if v is not None for i in ids}
    for i in sorted(out[None], key=lambda i: names[i].endswith(".crc")):  # subjects first
        key = f"{directory}/{names[i]}"
        name = parse(key)
        subject = None
        if name.kind is Kind.CRC and name.of is not None:
            j = index.get(name.of.rpartition("/")[2])
            subject = verdict_of.get(j) if j is not None else None
        verdict = judge(FileInfo(key, sizes[i], mtimes[i]), name, view, subject=subject)
        verdict_of[i] = verdict
        _count(report, key, verdict, sizes[i], name.kind)
        if verdict is Verdict.DELETABLE:
            plan.setdefault(directory, []).append((names[i], sizes[i], mtimes[i]))


def _bulk_verdict(bulk: dict[str, _Dir], key: str, view: SparkView) -> Verdict | None:
    """The verdict of a ``SSTs/`` or ``logs/`` file (a checksum's subject outside its
    directory's bulk judgment); None if not listed."""
    directory, _, leaf = key.rpartition("/")
    entries = bulk.get(directory)
    if entries is None or leaf not in entries.names:
        return None
    i = entries.names.index(leaf)
    info = FileInfo(key, entries.sizes[i], entries.mtimes[i])
    return judge(info, parse(key), view)


def _count(report: SparkGcReport, key: str, verdict: Verdict, size: int, kind: Kind) -> None:
    if verdict is Verdict.REFERENCED:
        report.referenced += 1
    elif verdict is Verdict.KEPT:
        report.kept += 1
    elif verdict is Verdict.PROTECTED:
        report.protected_count += 1
        _sample(report.protected, key)
    elif verdict is Verdict.FOREIGN:
        report.foreign_count += 1
        _sample(report.foreign, key)
    else:
        report.deletable += 1
        report.deletable_bytes += size
        report.deletable_by_kind[kind] = report.deletable_by_kind.get(kind, 0) + 1


def _sample(keys: list[str], key: str) -> None:
    if len(keys) < SAMPLE:
        keys.append(key)


def _by_directory(entries: Iterable[tuple[str, int, float]]) -> _Plan:
    plan: _Plan = {}
    for key, size, mtime in entries:
        directory, _, name = key.rpartition("/")
        plan.setdefault(directory, []).append((name, size, mtime))
    return plan


def _crc_after_subject(entries: list[tuple[str, int, float]]) -> list[tuple[str, int, float]]:
    """Each deletable ``.NAME.crc`` right after NAME, so a batch deletes both."""
    crcs = {e[0]: e for e in entries if e[0].startswith(".") and e[0].endswith(".crc")}
    if not crcs:
        return entries
    out: list[tuple[str, int, float]] = []
    names = set(crcs)
    for entry in entries:
        if entry[0] in names:
            continue
        out.append(entry)
        sibling = crcs.pop(crc_of(entry[0]), None)
        if sibling is not None:
            out.append(sibling)
    out.extend(crcs.values())  # checksums whose subject is gone or kept: already judged
    return out


# -- deleting ----------------------------------------------------------------------------
def _delete(
    storage: Storage,
    plan: _Plan,
    rule: SparkGcRule,
    batch_size: int,
    report: SparkGcReport,
    counters: tuple[Advance, Advance],
) -> None:
    """Hand the plan to the one deleter, a batch at a time, in this thread; `counters`:
    files deleted and bytes freed, told after each batch. A re-check that says stop, or
    an error that is not a failed delete, is raised after its batch."""
    deleted, freed = counters
    raised: list[Exception] = []

    def tried(batch: BatchTry) -> None:
        error = batch.error
        if error is not None and not isinstance(error, DeleteError):
            raised.append(error)  # (a failed re-stat, say): raised as it always was
            return
        if error is not None:
            report.problems.append(f"{batch.directory}: {error}")
        prefix = f"{batch.directory}/" if batch.directory else ""
        done = [(prefix + n, rule.listed[n][0]) for n in batch.deleted]
        nbytes = sum(size for _k, size in done)
        report.deleted += len(done)
        report.deleted_bytes += nbytes
        rule.deleted = report.deleted
        room = SAMPLE - len(report.deleted_keys)
        if room > 0:
            report.deleted_keys.extend(k for k, _s in done[:room])
        deleted(len(done))
        freed(nbytes)

    deleter = BulkDeleter(
        storage, rule=rule, workers=0, max_attempts=1, count_bytes=False, on_batch=tried
    )
    try:
        for directory, entries in plan.items():
            for start in range(0, len(entries), batch_size):
                batch = entries[start : start + batch_size]
                rule.listed = {n: (size, mtime) for n, size, mtime in batch}
                deleter.discard_names(directory, [e[0] for e in batch])
                report.changed = rule.changed
                if raised:
                    raise raised[0]
                if deleter.stopped is not None:
                    raise deleter.stopped
    finally:
        deleter.close()


# -- deprecated --------------------------------------------------------------------------
#: What `gc` took before `statehold.progress.Progress` (removed in the next release):
#: called after each batch of deletes with (files deleted so far, bytes freed so far).
_Told = Callable[[int, int], None]


class _Totals(NoProgress):
    """A `_Told` callback as gc's counters: told the totals after each batch (gc advances
    its files, then its bytes, once a batch)."""

    def __init__(self, told: _Told) -> None:
        self.told, self.files, self.bytes = told, 0, 0

    def counter(self, description: str, total: int | None = None, unit: str = "files"
                ) -> Advance:
        if description.endswith(": deleted"):
            return self._files
        if description.endswith(": freed"):
            return self._bytes
        return super().counter(description, total, unit)

    def _files(self, n: int) -> None:
        self.files += n

    def _bytes(self, n: int) -> None:
        self.bytes += n
        self.told(self.files, self.bytes)


def _told(progress: ProgressProtocol | _Told) -> ProgressProtocol:
    if isinstance(progress, ProgressProtocol):
        return progress
    warnings.warn(
        "gc(progress=callback(files, bytes)) is replaced by a statehold.progress.Progress "
        "(removed in the next release)", DeprecationWarning, stacklevel=3,
    )
    return _Totals(progress)


def __getattr__(name: str) -> Any:
    if name == "Progress":
        warnings.warn(
            "statehold.spark_checkpoints.gc.Progress is replaced by "
            "statehold.progress.Progress (removed in the next release)",
            DeprecationWarning, stacklevel=2,
        )
        return _Told
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
