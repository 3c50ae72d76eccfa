"""Read-only views of a Spark checkpoint location: the batches a restart can start from,
each store's versions and how they are held, a verification of what a restart at a batch
needs, and bytes by kind. Results are pydantic models (the CLI's ``--json``)."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from statehold.format import results as shared
from statehold.format.results import Problem as Problem
from statehold.progress import Progress
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import ROLLBACK_MARKER, Kind
from statehold.spark_checkpoints.location import RestartNeeds, SparkCheckpoint
from statehold.spark_checkpoints.rollback_marker import (
    left_behind,
    read_marker,
    unfinished,
    unfinished_marker,
)
from statehold.spark_checkpoints.scan import Scan
from statehold.spark_checkpoints.state_files import check_stream

if TYPE_CHECKING:
    from statehold.spark_checkpoints.deep_verify import Loads

_STREAMS = {Kind.CHANGELOG, Kind.DELTA, Kind.HDFS_SNAPSHOT}


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True)


#: One model for both worlds (`verify --deep` fills `kind` and `spark_bug`).
SparkProblem = Problem


class SparkBatch(_Result):
    batch: int
    committed: bool
    #: A restart can start after it: its logs and every store's next version are held.
    restartable: bool
    timestamp_ms: int | None = None
    watermark_ms: int | None = None
    #: The first reason it is not restartable.
    why_not: str | None = None


class StoreVersions(_Result):
    operator: int
    partition: int
    store: str
    provider: Literal["hdfs", "rocksdb"]
    #: Every version with a file (zip, changelog, delta or snapshot).
    versions: list[int]
    #: How the version of the newest restartable batch is held, from which snapshot.
    how: str | None = None
    base: int | None = None
    #: Bytes of the files that version needs, and of everything in the store.
    needed_bytes: int = 0
    bytes: int = 0


class SparkListing(shared.Listing):
    location_kind: Literal["spark"] = "spark"
    kind: Literal["spark-checkpoint"] = "spark-checkpoint"
    uri: str
    query_id: str | None
    newest_committed: int | None
    #: The newest batch a restart can start from (None: none is).
    restart_batch: int | None
    batches: list[SparkBatch]
    stores: list[StoreVersions]
    #: ``spark.sql.streaming.minBatchesToRetain`` where the offsets record it.
    min_batches_to_retain: int | None
    #: The oldest batch the commit log still holds.
    oldest_committed: int | None
    #: The batch an interrupted rollback was taking the location back to (run it again).
    interrupted_rollback: int | None = None
    #: State version files above what any batch in the logs wrote (`verify` says why).
    stale_state: list[str] = []
    #: What `repair` set aside: each ``_repaired/<UTC time>`` folder and its file count.
    repaired: dict[str, int] = {}


class SparkInspection(shared.InspectReport):
    location_kind: Literal["spark"] = "spark"
    """What `listing` says, as `inspect`'s result: the stores above all."""

    kind: Literal["spark-checkpoint"] = "spark-checkpoint"
    query_id: str | None
    restart_batch: int | None
    batches: list[SparkBatch]
    stores: list[StoreVersions]


class SparkVerifyReport(shared.VerifyReport):
    location_kind: Literal["spark"] = "spark"
    uri: str
    batch: int
    ok: bool
    files_checked: int
    bytes_checked: int
    problems: list[Problem]
    #: Absolute paths in the sources' logs that bind the location to its place, by
    #: directory, with a count of files under each.
    bound_to: dict[str, int]
    #: Whether every store version was loaded (`verify --deep`), of which operator only.
    deep: bool = False
    operator: int | None = None
    #: Of the deep load: store versions loaded, records read, and the stores whose
    #: records were read to their end undecoded (no schema file), with why.
    stores_loaded: int = 0
    records_read: int = 0
    not_decoded: list[str] = []


class SparkUsage(shared.UsageReport):
    location_kind: Literal["spark"] = "spark"
    uri: str
    #: Bytes and files by kind: logs, sources, snapshots, changelogs, ssts, metadata, other.
    bytes: dict[str, int]
    files: dict[str, int]
    total_bytes: int
    #: Of those, what no batch a restart may start from needs: gc's candidates, whatever
    #: their age (None where not computed).
    unreferenced_bytes: int | None = None
    unreferenced_files: int | None = None


def batches(checkpoint: SparkCheckpoint, found: Scan) -> list[SparkBatch]:
    """Every batch in the logs, newest first, and whether a restart can start after it."""
    out = []
    for batch in sorted(set(found.offsets) | set(found.commits), reverse=True):
        needs = checkpoint.restart_needs(found, batch) if batch in found.commits else None
        ts = wm = None
        if batch in found.offsets:
            try:
                meta = checkpoint.offsets(batch).metadata
                ts, wm = meta.batchTimestampMs, meta.batchWatermarkMs
            except SparkCheckpointError:
                pass
        out.append(
            SparkBatch(
                batch=batch,
                committed=batch in found.commits,
                restartable=bool(needs and needs.ok),
                timestamp_ms=ts,
                watermark_ms=wm,
                why_not=(needs.problems[0] if needs and needs.problems else None)
                if needs
                else "not committed",
            )
        )
    return out


def listing(checkpoint: SparkCheckpoint) -> SparkListing:
    """The batches and, for each store, the versions held and how the newest restartable
    batch's version is held."""
    found = checkpoint.scan()
    listed = batches(checkpoint, found)
    restart = next((b.batch for b in listed if b.restartable), None)
    needs = checkpoint.restart_needs(found, restart) if restart is not None else None
    try:
        query_id: str | None = checkpoint.query_id()
    except SparkCheckpointError:
        query_id = None
    return SparkListing(
        uri=checkpoint.uri,
        query_id=query_id,
        newest_committed=found.newest_committed,
        restart_batch=restart,
        batches=listed,
        stores=_stores(found, needs),
        min_batches_to_retain=checkpoint.min_batches_to_retain(found),
        oldest_committed=min(found.commits, default=None),
        interrupted_rollback=_interrupted(checkpoint, found),
        stale_state=checkpoint.stale_state(found),
        repaired=repaired_folders(found),
    )


def inspect(checkpoint: SparkCheckpoint) -> SparkInspection:
    """`listing`, as `inspect`'s result (the CLI shows its stores)."""
    return SparkInspection.model_validate(listing(checkpoint).model_dump())


def repaired_folders(found: Scan) -> dict[str, int]:
    """Each ``_repaired/<time>`` folder with the number of files in it."""
    out: dict[str, int] = defaultdict(int)
    for key in found.repaired:
        out["/".join(key.split("/", 2)[:2])] += 1
    return dict(sorted(out.items()))


def _interrupted(checkpoint: SparkCheckpoint, found: Scan) -> int | None:
    try:
        marker = unfinished_marker(checkpoint.storage, found)
    except SparkCheckpointError:
        return -1 if ROLLBACK_MARKER in found.files else None
    return None if marker is None else marker.to_batch


def location_problems(checkpoint: SparkCheckpoint, found: Scan) -> list[Problem]:
    """What is wrong with the location whatever the batch: an unfinished rollback, and
    state of abandoned batches (one line per store)."""
    problems: list[Problem] = []
    try:
        marker = read_marker(checkpoint.storage, ROLLBACK_MARKER in found.files)
        if marker is not None and left_behind(marker, found):
            problems.append(Problem(path=ROLLBACK_MARKER, problem=(
                f"{ROLLBACK_MARKER}: the mark of a rollback to batch {marker.to_batch} left "
                "behind: the query ran on after it; any rollback removes it (statehold "
                f"rollback {checkpoint.uri} --to-batch {found.newest_committed} changes "
                "nothing else)")))
        elif marker is not None:
            problems.append(
                Problem(path=ROLLBACK_MARKER, problem=unfinished(marker, checkpoint.uri))
            )
    except SparkCheckpointError as e:
        problems.append(Problem(path=ROLLBACK_MARKER, problem=str(e)))
    newest = max({*found.offsets, *found.commits}, default=-1)
    by_store: dict[object, list[str]] = defaultdict(list)
    for key in checkpoint.stale_state(found):
        by_store[found.names[key].store].append(key)
    for keys in by_store.values():
        more = f" and {len(keys) - 1} more of its versions" if len(keys) > 1 else ""
        problems.append(
            Problem(
                path=keys[0],
                problem=f"{keys[0]}{more}: above what any batch in the logs wrote (the newest, "
                f"{newest}, writes version {newest + 1}): state of abandoned batches (a "
                f"rollback stopped after the logs?) that a later load would read; "
                f"`statehold rollback {checkpoint.uri} --to-batch {found.newest_committed}` "
                "removes it",
            )
        )
    return problems


def _stores(found: Scan, needs: RestartNeeds | None) -> list[StoreVersions]:
    by_store = {n.store: n for n in needs.stores} if needs else {}
    out = []
    for store, files in sorted(found.stores.items()):
        store_needs = by_store.get(store)
        every = [*files.versions.values(), *files.shared.values()]
        wanted = store_needs.files if store_needs else {}
        needed = sum(found.files[k].size for k in wanted if k in found.files)
        out.append(
            StoreVersions(
                operator=store.operator,
                partition=store.partition,
                store=store.name,
                provider=files.provider,
                versions=files.held,
                how=store_needs.how if store_needs else None,
                base=store_needs.base if store_needs else None,
                needed_bytes=needed,
                bytes=sum(i.size for i in every),
            )
        )
    return out


def default_batch(found: Scan) -> int:
    if found.newest_committed is None:
        raise SparkCheckpointError("no committed batch: there is nothing to restart from")
    return found.newest_committed


def verify(
    checkpoint: SparkCheckpoint,
    batch: int | None = None,
    *,
    deep: bool = False,
    operator: int | None = None,
    progress: Progress | None = None,
    loads: Loads | None = None,
) -> SparkVerifyReport:
    """Every file a restart at `batch` (default: the newest committed) needs exists and is
    whole: sizes match the snapshots' file lists, zips and compressed streams read to
    their end, version chains are unbroken, and the logs parse. One problem per line.
    `deep`: every store version (of `operator` only, if given) is also loaded, RocksDB's
    by RocksDB, each record decoded (`deep_verify`); `progress` gets a line per store;
    `loads`: store versions loaded before, not loaded again while their files are
    unchanged (`deep_verify.Loads`)."""
    found = checkpoint.scan()
    batch = default_batch(found) if batch is None else batch
    if operator is not None and not deep:
        raise SparkCheckpointError("an operator is chosen for a deep verify only")
    needs = checkpoint.restart_needs(found, batch)
    loaded = None
    if deep:
        # imported when used: the other commands start without Arrow's and RocksDB's import
        from statehold.spark_checkpoints.deep_verify import deep_check

        if batch not in found.commits:
            raise SparkCheckpointError(f"batch {batch} is not committed: nothing to load")
        loaded = deep_check(checkpoint, found, batch, operator=operator, progress=progress,
                            loads=loads)
    problems = [Problem(path=_subject(p), problem=p) for p in needs.problems]
    problems += location_problems(checkpoint, found)
    problems += [
        Problem(path=k, problem="a symbolic link: never followed")
        for k in found.foreign
        if found.files[k].symlink
    ]
    checked = 0
    codec = checkpoint.codec(found)
    for key, size in sorted(needs.files.items()):
        info = found.files.get(key)
        reported = any(p.path == key for p in problems)
        if info is None:
            if not reported:
                problems.append(Problem(path=key, problem="missing"))
            continue
        checked += info.size
        if size is not None and info.size != size:
            problems.append(
                Problem(path=key, problem=f"{info.size} bytes, the snapshot lists {size}")
            )
        # what the deep load read to its end is not read twice
        again = not reported and not (loaded and key in loaded.read)
        problem = _check_content(checkpoint, found, key, codec) if again else None
        if problem:
            problems.append(Problem(path=key, problem=problem))
    if loaded is not None:
        problems += [Problem(path=f.path, problem=f"{f.kind}: {f.problem}", kind=f.kind,
                                  spark_bug=f.spark_bug) for f in loaded.findings]
    return SparkVerifyReport(
        uri=checkpoint.uri,
        batch=batch,
        ok=not problems,
        files_checked=len(needs.files),
        bytes_checked=checked,
        problems=problems,
        bound_to=bound_paths(checkpoint, found, batch),
        deep=deep,
        operator=operator,
        stores_loaded=loaded.stores if loaded else 0,
        records_read=loaded.records if loaded else 0,
        not_decoded=loaded.not_decoded if loaded else [],
    )


def _check_content(checkpoint: SparkCheckpoint, found: Scan, key: str, codec: str) -> str | None:
    kind = found.names[key].kind
    try:
        if kind is Kind.OFFSETS:
            checkpoint.offsets(int(key.rsplit("/", 1)[1]))
        elif kind is Kind.COMMITS:
            checkpoint.commit(int(key.rsplit("/", 1)[1]))
        elif kind is Kind.QUERY_METADATA:
            checkpoint.query_id()
        elif kind is Kind.SOURCE_LOG:
            checkpoint.source_entries(key)
        elif kind is Kind.ZIP:
            checkpoint.zip_files(key)
        elif kind in _STREAMS:
            check_stream(iter([checkpoint.read(key)]), key, codec)
    except SparkCheckpointError as e:
        return str(e).removeprefix(f"{key}: ")
    return None


def bound_paths(checkpoint: SparkCheckpoint, found: Scan, batch: int) -> dict[str, int]:
    """Directories named by absolute paths in the sources' logs up to `batch`."""
    dirs: dict[str, int] = defaultdict(int)
    for source in found.sources.values():
        for b, key in source.items():
            if b > batch:
                continue
            try:
                entries = checkpoint.source_entries(key)
            except SparkCheckpointError:
                continue  # reported by verify's content check
            for entry in entries:
                dirs[entry.path.rsplit("/", 1)[0]] += 1
    return dict(sorted(dirs.items()))


_DU_KIND = {
    Kind.QUERY_METADATA: "logs",
    Kind.OFFSETS: "logs",
    Kind.COMMITS: "logs",
    Kind.SOURCE_LOG: "sources",
    Kind.ZIP: "snapshots",
    Kind.HDFS_SNAPSHOT: "snapshots",
    Kind.CHANGELOG: "changelogs",
    Kind.DELTA: "changelogs",
    Kind.SST: "ssts",
    Kind.ROCKSDB_LOG: "ssts",
    Kind.OPERATOR_METADATA: "metadata",
    Kind.STORE_SCHEMA: "metadata",
}


def du(checkpoint: SparkCheckpoint) -> SparkUsage:
    """Bytes and files by kind."""
    found = checkpoint.scan()
    sizes: dict[str, int] = defaultdict(int)
    counts: dict[str, int] = defaultdict(int)
    for key, info in found.files.items():
        kind = found.names[key].kind
        bucket = _DU_KIND.get(kind, "other")
        sizes[bucket] += info.size
        counts[bucket] += 1
    return SparkUsage(
        uri=checkpoint.uri,
        bytes=dict(sizes),
        files=dict(counts),
        total_files=sum(counts.values()),
        total_bytes=sum(sizes.values()),
    )


def _subject(problem: str) -> str:
    """The file or store a problem line starts with."""
    return problem.split(": ", 1)[0]
