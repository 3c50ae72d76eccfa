"""Roll a Spark checkpoint location back to batch N: the query's next start reprocesses
from batch N+1 with its state as of N.

Spark restarts from the newest batch in ``offsets/`` and ``commits/``; a file source
lists again what its own log does not name; a store loads version N+1 from the newest
snapshot at or below it. So a rollback removes what the batches after N wrote:
``offsets/M`` and ``commits/M`` (M > N), the sources' log entries after what batch N
read, state version files above N+1 (snapshots, zips, changelogs, deltas, with or
without unique ids), operator metadata v2 / schema v3 files of batches after N, and
with `sink` a file sink's ``_spark_metadata`` entries after N. SSTs are left to gc:
they are shared between versions.

Before any delete: N must be restartable (its logs and its state are held); the query
must not look alive (no log or state file written within `grace_seconds`; a query
whose trigger interval is longer than that is not noticed, so stop it first or give a
larger grace); a compacted log after N must not hold entries of batches up to N whose
plain files are gone (the rollback could not restore them). Then what is removed is
kept first as a savepoint of the newest restartable batch (`keep`), so the rollback can
be undone by starting from it, and the location is marked (`rollback_marker`) until the
last delete.

The order of the deletes is what makes a rollback stopped anywhere safe: the state
version files above N+1 go first (newest version first), then operator files, then the
logs (newest batch first, commit before offsets), then the sources' entries. Stopped
among the state files, the location's newest commit still stands but a version its
restart loads is gone, so Spark's restart fails loudly instead of loading state of the
abandoned batches (Spark loads the newest snapshot at or below the version it asks for:
a stale ``7.zip`` left after the logs were rolled back would be read silently later).
Whatever stops it, the mark makes `verify` report it, `list` name it, and savepoint, gc
and relocate refuse; the same rollback run again finishes it. Every delete is checked by
the deletion rule (`statehold.spark_checkpoints.policy.check_rollback_deletable`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

from statehold import clock
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import (
    ROLLBACK_MARKER,
    SOURCES_DIR,
    VERSION_FILES,
    is_decimal,
)
from statehold.spark_checkpoints.location import SparkCheckpoint, refuse_alive
from statehold.spark_checkpoints.policy import check_rollback_deletable
from statehold.spark_checkpoints.rollback_marker import (
    RollbackMarker,
    unfinished_marker,
    write_marker,
)
from statehold.spark_checkpoints.savepoint import (
    companions,
    newest_restartable,
    operator_file_batch,
    savepoint,
)
from statehold.spark_checkpoints.scan import Scan
from statehold.storage import Storage, StorageError, open_storage

#: A file written this recently means the query may be running: twice Spark's default
#: state store maintenance interval (60 s), and far longer than a default trigger.
DEFAULT_GRACE_SECONDS = 120.0
SINK_LOG_DIR = "_spark_metadata"


class RollbackReport(BaseModel):
    checkpoint: str
    to_batch: int
    #: The newest committed batch before the rollback.
    from_batch: int | None
    #: The savepoint keeping what was there (None: nothing was removed).
    kept: str | None = None
    kept_batch: int | None = None
    deleted: list[str] = Field(default_factory=list)
    sink: str | None = None
    sink_deleted: list[str] = Field(default_factory=list)
    #: Sinks that would skip or duplicate the replayed batches, and why.
    sinks: list[str] = Field(default_factory=list)
    #: This run finished a rollback an earlier run began and did not end.
    finished_interrupted: bool = False


def rollback(
    checkpoint: SparkCheckpoint,
    to_batch: int,
    *,
    keep: str | None = None,
    force: bool = False,
    sink: str | None = None,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    storage_options: Mapping[str, Any] | None = None,
    kept: tuple[str, int] | None = None,
) -> RollbackReport:
    """Roll `checkpoint` back so its next start reprocesses from batch `to_batch` + 1
    (see the module's docstring). `keep`: where the savepoint of what is removed goes
    (default: ``<checkpoint>-before-rollback-<UTC yyyymmddThhmmss>`` beside it); `sink`:
    a file sink's output directory whose ``_spark_metadata`` log is rolled back too;
    `storage_options`: for opening `keep` and `sink`; `kept`: (where, batch) of a savepoint
    of the location as it stands that the caller already took (`repair`'s), kept instead
    of a second one. Refused with the reason, nothing deleted, when the rollback cannot be
    done safely."""
    options = dict(storage_options or {})
    found = checkpoint.scan()
    marked = ROLLBACK_MARKER in found.files
    marker = unfinished_marker(checkpoint.storage, found)
    if marker is not None and to_batch > marker.to_batch:
        raise SparkCheckpointError(
            f"cannot roll back to batch {to_batch}: a rollback to batch {marker.to_batch} "
            f"was interrupted; finish it first (statehold rollback {checkpoint.uri} "
            f"{marker.to_batch})"
        )
    needs = checkpoint.restart_needs(found, to_batch)
    if not needs.ok:
        more = f" (and {len(needs.problems) - 1} more)" if len(needs.problems) > 1 else ""
        raise SparkCheckpointError(
            f"cannot roll back to batch {to_batch}: {needs.problems[0]}{more}"
        )
    if not force:
        refuse_alive(found, grace_seconds, "force the rollback")
    plan = _plan(checkpoint, found, to_batch)
    sink_uri = sink or (marker.sink if marker else None)
    sink_storage = _open(sink_uri, options) if sink_uri else None
    sink_plan = _plan_sink(sink_storage, to_batch) if sink_storage else []
    for key in [*plan, *sink_plan]:
        check_rollback_deletable(key)
    newest = marker.from_batch if marker else found.newest_committed
    report = RollbackReport(
        checkpoint=checkpoint.uri,
        to_batch=to_batch,
        from_batch=newest,
        sink=sink_storage.uri if sink_storage else None,
        sinks=_sink_notes(to_batch, newest, sink_storage is not None),
        finished_interrupted=marker is not None,
    )
    if not plan and not sink_plan and marker is None:
        if marked:  # a mark left behind by a rollback the query ran on from
            _delete(checkpoint.storage, [ROLLBACK_MARKER])
        return report
    if marker is None or marker.to_batch != to_batch:
        marker = _begin(checkpoint, found, to_batch, keep, options, sink_storage, marker, kept)
    _delete(checkpoint.storage, plan)
    if sink_storage is not None:
        _delete(sink_storage, sink_plan)
    _delete(checkpoint.storage, [ROLLBACK_MARKER])
    return report.model_copy(
        update={
            "kept": marker.kept,
            "kept_batch": marker.kept_batch,
            "deleted": plan,
            "sink_deleted": sink_plan,
        }
    )


def _begin(
    checkpoint: SparkCheckpoint,
    found: Scan,
    to_batch: int,
    keep: str | None,
    options: Mapping[str, Any],
    sink: Storage | None,
    earlier: RollbackMarker | None,
    taken: tuple[str, int] | None = None,
) -> RollbackMarker:
    """Keep what is there as a savepoint (unless an interrupted run or the caller already
    did), then mark the location: nothing is deleted before both are written."""
    kept: str | None
    kept_batch: int | None
    if earlier is not None:
        kept, kept_batch = earlier.kept, earlier.kept_batch
    elif taken is not None:
        kept, kept_batch = taken
    else:
        report = savepoint(
            checkpoint,
            _open(keep or _default_keep(checkpoint), options),
            batch=newest_restartable(checkpoint, found).batch,
        )
        kept, kept_batch = report.dest, report.batch
    marker = RollbackMarker(
        to_batch=to_batch,
        from_batch=earlier.from_batch if earlier else found.newest_committed,
        kept=kept,
        kept_batch=kept_batch,
        sink=sink.uri if sink else None,
        started_at=clock.now(),
    )
    write_marker(checkpoint.storage, marker)
    return marker


def rollback_plan(checkpoint: SparkCheckpoint, found: Scan, to_batch: int) -> list[str]:
    """The keys a rollback to `to_batch` would delete, in order (a repair's plan counts
    them); refused (SparkCheckpointError) as the rollback itself would be."""
    return _plan(checkpoint, found, to_batch)


def _plan(checkpoint: SparkCheckpoint, found: Scan, to_batch: int) -> list[str]:
    """The keys to delete, in the order to delete them (the module's docstring says
    why): state version files above N+1, newest first; operator files of later batches;
    the logs of later batches, newest first, commit before offsets; the sources' entries
    after what a restart at N reads."""
    state = sorted(
        (
            (name.version, key)
            for key, name in found.names.items()
            if name.kind in VERSION_FILES and name.version is not None
            and name.version > to_batch + 1
        ),
        reverse=True,
    )
    operator = sorted(
        key for key in found.names
        if (operator_file_batch(key) or -1) > to_batch
    )
    logs: list[str] = []
    for batch in sorted({*found.offsets, *found.commits}, reverse=True):
        if batch > to_batch:
            logs += [k for k in (found.commits.get(batch), found.offsets.get(batch)) if k]
    sources = _source_logs(checkpoint, found, to_batch)
    _refuse_orphaned_operators(found, to_batch)
    out: list[str] = []
    for key in [*(k for _v, k in state), *operator, *logs, *sources]:
        out += [*companions(key, found), key]
    return out


def _source_logs(checkpoint: SparkCheckpoint, found: Scan, to_batch: int) -> list[str]:
    tops = checkpoint.source_tops(found, to_batch, as_is=False)
    out: list[str] = []
    for source, log in sorted(found.sources.items()):
        limit = tops[source][0] if source in tops else to_batch
        out += _roll_log(
            {b: k for b, k in log.items()}, limit, f"{SOURCES_DIR}/{source}", found.names
        )
    return out


def _roll_log(
    log: dict[int, str], limit: int, where: str, names: Mapping[str, Any] | None = None
) -> list[str]:
    """The files of a file log (``N`` and ``N.compact``) after `limit`, refused when one
    of them is a compaction whose entries up to `limit` are not all still in the files
    that stay."""
    after = sorted(b for b in log if b > limit)
    compacted_after = [log[b] for b in after if log[b].endswith(".compact")]
    if compacted_after:
        kept = sorted(b for b in log if b <= limit)
        base = max((b for b in kept if log[b].endswith(".compact")), default=-1)
        gaps = [b for b in range(base + 1, limit + 1) if b not in log]
        if gaps:
            raise SparkCheckpointError(
                f"cannot roll back {where}: {compacted_after[0]} holds the entries of "
                f"batches up to {limit}, but the log files of batches {gaps[0]}"
                f"{'-' + str(gaps[-1]) if len(gaps) > 1 else ''} are gone"
            )
    return [log[b] for b in reversed(after)]


def _refuse_orphaned_operators(found: Scan, to_batch: int) -> None:
    """An operator with metadata v2 keeps one written at or before the batch."""
    by_op: dict[str, list[int]] = {}
    for key in found.operator_files:
        written_by = operator_file_batch(key)
        if written_by is not None and "/_metadata/v2/" in key:
            by_op.setdefault(key.split("/")[1], []).append(written_by)
    for op, batches in sorted(by_op.items()):
        if min(batches) > to_batch:
            raise SparkCheckpointError(
                f"cannot roll back to batch {to_batch}: operator {op}'s metadata of batch "
                f"{min(batches)} is its oldest (none of a batch up to {to_batch} is held)"
            )


def _plan_sink(sink: Storage, to_batch: int) -> list[str]:
    log: dict[int, str] = {}
    for info in sink.list(SINK_LOG_DIR):
        leaf = info.key.rsplit("/", 1)[-1]
        stem = leaf.removesuffix(".compact")
        if is_decimal(stem) and "/" not in info.key[len(SINK_LOG_DIR) + 1 :]:
            log[int(stem)] = info.key
    keys = _roll_log(log, to_batch, f"{sink.uri}/{SINK_LOG_DIR}")
    crcs = {info.key for info in sink.list(SINK_LOG_DIR)}
    out: list[str] = []
    for key in keys:
        head, leaf = key.rsplit("/", 1)
        out += [c for c in (f"{head}/.{leaf}.crc",) if c in crcs] + [key]
    return out


def _sink_notes(to_batch: int, newest: int | None, file_sink_rolled: bool) -> list[str]:
    replayed = f"batches {to_batch + 1}-{newest}" if newest and newest > to_batch else "none"
    file_sink = (
        "file sink: its _spark_metadata log was rolled back too, so the replayed batches "
        "are written again (the files the removed entries named stay, unlisted)"
        if file_sink_rolled
        else f"file sink: Spark skips batch ids its _spark_metadata log already holds "
        f"({replayed}): give the sink's directory to roll it back too"
    )
    return [
        "the checkpoint does not record which sink the query writes to; check yours:",
        file_sink,
        f"foreachBatch: the function is called again with batch ids {to_batch + 1} on "
        "(a write keyed by batch id overwrites; an append duplicates)",
        "Kafka and other appending sinks: the replayed batches' rows are written again "
        "(duplicates)",
    ]


def _default_keep(checkpoint: SparkCheckpoint) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(clock.now()))
    return f"{checkpoint.uri.rstrip('/')}-before-rollback-{stamp}"


def _open(uri: str, options: Mapping[str, Any]) -> Storage:
    try:
        return open_storage(uri, **dict(options))
    except (StorageError, ValueError) as e:
        raise SparkCheckpointError(f"{uri}: cannot open ({e})") from None


def _delete(storage: Storage, keys: list[str]) -> None:
    for key in keys:
        check_rollback_deletable(key)
        try:
            storage.delete_many([key])
        except StorageError as e:
            raise SparkCheckpointError(
                f"rollback of {storage.uri} stopped at {key} ({e}); run it again"
            ) from None
