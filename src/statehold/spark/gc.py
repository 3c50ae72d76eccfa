"""`statehold gc --spark`: the same gc, its listing and deletes run on Spark executors.

The driver only plans: it reads the HA state, the holders and the lease once, makes the
policy's `View` (plain data: epoch, referenced keys, the live attempt, savepoint names,
quarantined directories, times and graces), checks the referenced files exist, and
splits the job directory by prefix: each top-level directory, its own files, and the big
data directories (``shared/``, ``exclusive/``) further into key ranges (`split_points`).
Each executor task lists its part page by page (`sweep`: the same `policy` decisions as a
local gc), and deletes in bulk through the same guarded cleaner as a local gc: before
every batch it re-runs `gc.outside_guard`, rebuilt there from the job's URI,
storage options, HA store URI and the planned epoch and live attempt. So the safety is
a local gc's, including beside a running job. Only code and plain data travel to
executors; nothing stored is ever unpickled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statehold.cleanup.bulk_delete import BulkDeleter
from statehold.cleanup.gc import GcInterruptedError, GcReport, gc_cleaner, outside_guard, settle
from statehold.cleanup.holders import Holders
from statehold.cleanup.policy import LiveAttempt, View
from statehold.cleanup.reconcile import (
    PAGE_SIZE,
    ReconcileError,
    ReconcilePlan,
    check_complete,
    feed,
    feed_names,
    live_attempt,
    view_for,
)
from statehold.cleanup.sweep import WHOLE, KeyRange, sweep
from statehold.errors import StateholdError
from statehold.format import layout
from statehold.ha.base import FencedError
from statehold.job.directory import JobDirectory, open_job
from statehold.spark.connect import is_connect, refuse

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The task that lists the job directory's own files (not its subdirectories).
ROOT_FILES = ""
#: Directories split into key ranges, and into at most how many (by default twice the
#: cluster's parallelism: more tasks than cores buys balance, and costs a job opening each).
SPLIT_DIRS = (layout.SHARED_DIR, layout.EXCLUSIVE_DIR)
MAX_SPLITS = 32
_HEX = "0123456789abcdef"


@dataclass(frozen=True)
class GcTask:
    """What one executor needs, as plain data: where the job is, how to open it, what
    the plan was made under, and the prefix it lists."""

    location: str
    storage_options: Mapping[str, Any]
    ha_uri: str
    job_id: str
    epoch: int
    live: LiveAttempt | None
    view: View
    prefix: str
    keys: KeyRange
    dry_run: bool
    page_size: int
    timeout: float


@dataclass
class GcPart:
    """One task's result: its part of the plan, what it deleted, and why it stopped."""

    result: ReconcilePlan
    deleted: int = 0
    interrupted: str | None = None
    failed: str | None = None


def plain_view(view: View) -> View:
    """The view without the verified documents (the decision needs only the referenced
    keys, the quarantined directories and `spare_all_data`): small to ship."""
    holders = Holders(
        quarantined=dict(view.holders.quarantined),
        salvaged=set(view.holders.salvaged),
        spare_all_data=view.holders.spare_all_data,
    )
    return dataclasses.replace(view, holders=holders)


def run_task(task: GcTask) -> GcPart:
    """An executor's part: list `task.prefix` (the keys in `task.keys`), judge, delete
    through a guarded cleaner."""
    job = open_job(task.location, task.ha_uri, job_id=task.job_id, **task.storage_options)
    with job:
        part = GcPart(ReconcilePlan(live=task.live))
        if task.dry_run:
            _list(job, task, part.result)
            return part
        deleting = gc_cleaner(job, outside_guard(job, task.epoch, task.live))
        try:
            try:
                _list(job, task, part.result, deleting)
            except FencedError:
                pass  # the cleaner was fenced: `settle` says so
            except StateholdError as e:  # e.g. the listing failed: said by the driver
                part.failed = f"{job.uri}/{task.prefix}: {' '.join(str(e).split())}"
            part.deleted = settle(job.uri, deleting, task.timeout)
            part.result.orphan_bytes += deleting.freed
        except GcInterruptedError as e:
            part.interrupted = str(e)
        except ReconcileError as e:
            part.failed = part.failed or str(e)
        finally:
            deleting.close()
        return part


def _list(
    job: JobDirectory, task: GcTask, result: ReconcilePlan, deleting: BulkDeleter | None = None
) -> None:
    take = None if deleting is None else feed(deleting, timeout=task.timeout)
    if task.prefix == ROOT_FILES:
        chosen = result.add(job.storage.list_top("")[1], task.view)
        if chosen and take is not None:
            take(chosen)
        return
    sweep(
        job.storage, task.view, result, prefix=task.prefix, keys=task.keys,
        page_size=task.page_size, on_infos=take,
        on_names=None if deleting is None else feed_names(deleting, task.timeout),
    )


def split_points(directory: str, view: View, splits: int = MAX_SPLITS) -> list[str]:
    """Where to cut a data directory's key space for the tasks: data names are
    ``eE-cC-<hex>``, so at each epoch, and within each epoch-and-checkpoint prefix the
    retained checkpoints' files show, at each hex digit of the unique part. Only the
    balance depends on this guess: any sorted cuts cover every key exactly once."""
    if splits <= 1:
        return []
    base = directory + "/"
    heads = set()
    for key in view.referenced:
        parts = key[len(base) :].split("-", 2) if key.startswith(base) else []
        if len(parts) == 3:
            heads.add(f"{parts[0]}-{parts[1]}-")
    cuts = {f"{base}e{epoch}-" for epoch in range(1, view.epoch + 1)}
    cuts |= {f"{base}{head}{h}" for head in heads for h in _HEX[1:]}
    ordered = sorted(cuts)
    if len(ordered) >= splits:
        step = len(ordered) / (splits - 1)
        ordered = sorted({ordered[int(i * step)] for i in range(splits - 1)})
    return ordered


def ranges(directory: str, view: View, splits: int = MAX_SPLITS) -> list[KeyRange]:
    """The key ranges of a directory's tasks: consecutive, together every key."""
    cuts: list[str | None] = [None, *split_points(directory, view, splits), None]
    return [KeyRange(cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)]


def tasks_for(
    job: JobDirectory,
    location: str,
    storage_options: Mapping[str, Any],
    *,
    dry_run: bool,
    page_size: int,
    timeout: float,
    splits: int = MAX_SPLITS,
) -> tuple[ReconcilePlan, list[GcTask]]:
    """The driver's plan: the view, the existence check, and one task per prefix."""
    state = job.state()
    live = live_attempt(job, state)
    view = view_for(job, state, live)
    check_complete(job, state, view)
    dirs, _ = job.storage.list_top("")
    shipped = plain_view(view)
    parts = [
        (prefix, keys)
        for prefix in [ROOT_FILES, *dirs]
        for keys in (ranges(prefix, view, splits) if prefix in SPLIT_DIRS else [WHOLE])
    ]
    tasks = [
        GcTask(
            location,
            dict(storage_options),
            job.ha_uri,
            job.job_id,
            state.epoch,
            live,
            shipped,
            prefix,
            keys,
            dry_run,
            page_size,
            timeout,
        )
        for prefix, keys in parts
    ]
    return ReconcilePlan(quarantined=dict(view.holders.quarantined), live=live, state=state), tasks


def gc_on_spark(
    spark: SparkSession,
    location: str,
    *,
    ha: str | None = None,
    dry_run: bool = False,
    page_size: int = PAGE_SIZE,
    timeout: float = 600.0,
    splits: int | None = None,
    **storage_options: Any,
) -> GcReport:
    """`statehold.cleanup.gc.gc` with the listing and the deletes on Spark's executors (see the
    module docstring). `location` must be reachable from the executors under the same
    name (a shared filesystem path or an object store URI). `splits`: key ranges per big
    data directory (default: twice the cluster's parallelism, at most `MAX_SPLITS`)."""
    if is_connect(spark):
        raise refuse(
            "gc --spark", "its tasks are RDD tasks, and a Connect session has no SparkContext; "
            "run `statehold gc` without --spark (the same gc, listed and deleted locally)",
        )
    if splits is None:
        splits = min(MAX_SPLITS, 2 * spark.sparkContext.defaultParallelism)
    with open_job(location, ha, **storage_options) as job:
        total, tasks = tasks_for(
            job, location, storage_options, dry_run=dry_run, page_size=page_size,
            timeout=timeout, splits=max(1, splits),
        )
        uri = job.uri
    parts = spark.sparkContext.parallelize(tasks, len(tasks)).map(run_task).collect()
    deleted = 0
    for part in parts:
        total.merge(part.result)
        deleted += part.deleted
    interrupted = [p.interrupted for p in parts if p.interrupted]
    if interrupted:
        raise GcInterruptedError(
            f"{uri}: gc stopped after deleting {deleted} orphan(s): {interrupted[0]}"
        )
    failed = [p.failed for p in parts if p.failed]
    if failed:
        raise ReconcileError(failed[0])
    return GcReport.of(uri, total, dry_run=dry_run, deleted=deleted)


__all__ = [
    "GcPart",
    "GcTask",
    "gc_on_spark",
    "plain_view",
    "ranges",
    "run_task",
    "split_points",
    "tasks_for",
]
