"""`du`: bytes by scope and by checkpoint, and what the deletion policy calls
unreferenced."""

from __future__ import annotations

import bisect
from typing import Any

from statehold import layout
from statehold.ha.base import HAStore
from statehold.jobdir import JobDirectory
from statehold.layout import Kind
from statehold.metadata import referenced_keys
from statehold.policy import Verdict, View, judge
from statehold.reconcile import live_attempt
from statehold.tools.locate import Progress, TargetLike, kind_of, opened, pages, parse
from statehold.tools.results import CheckpointUsage, DiskUsage

_SCOPE_OF_KIND = {
    Kind.SHARED: "shared",
    Kind.EXCLUSIVE: "exclusive",
    Kind.TASKOWNED: "taskowned",
    Kind.CHECKPOINT_METADATA: "metadata",
    Kind.CHECKPOINT_OTHER: "metadata",
    Kind.SAVEPOINT_METADATA: "metadata",
    Kind.SAVEPOINT_OTHER: "metadata",
    Kind.HA: "ha",
    Kind.JOB: "job",
    Kind.SPARK: "spark",
    Kind.TEMP: "temp",
    Kind.UNKNOWN: "other",
}


def du(
    target: TargetLike,
    *,
    ha: str | HAStore | None = None,
    progress: Progress | None = None,
    **storage_options: Any,
) -> DiskUsage:
    """Bytes by scope and by checkpoint, and unreferenced bytes.

    Attribution: a file referenced by one retained checkpoint or savepoint (and every file
    in its own directory) counts fully to it (`exclusive_bytes`); a file referenced by k
    of them is split evenly among the k (`shared_attributed_bytes`; the remainder bytes go
    to the oldest holders), so the attributed bytes add up to the referenced total.
    ``chk-N`` directories not retained are not holders: their bytes are unreferenced."""
    with opened(target, ha=ha, **storage_options) as t:
        return _du(t.job, progress)


def _du(job: JobDirectory, progress: Progress | None = None) -> DiskUsage:
    """One streamed pass over the listing: what is kept grows with the referenced files
    and the holders, never with the orphans (a bounded sample of them is named)."""
    state = job.state()
    holders = job.holders(state)
    retained = {p.metadata for p in state.retained}
    view = View.of(
        state.epoch, holders, live_attempt(job, state), job.storage.list(layout.SAVEPOINTS_DIR)
    )
    order = sorted(holders.documents, key=lambda k: (kind_of(k) == "savepoint", _sort_id(k)))
    exclusive = dict.fromkeys(order, 0)
    shared = dict.fromkeys(order, 0)
    referenced_total = dict.fromkeys(order, 0)
    holders_of: dict[str, list[str]] = {}
    for mkey in order:  # in `order`, so each file's holders are oldest first
        for key in referenced_keys(holders.documents[mkey], mkey):
            holders_of.setdefault(key, []).append(mkey)
    dirs = [(mkey.rsplit("/", 1)[0] + "/", mkey) for mkey in order]
    sizes: dict[str, int] = {}  # of the referenced files listed
    by_scope: dict[str, int] = {}
    total_files = total_bytes = owned_bytes = 0
    unreferenced_files = unreferenced_bytes = 0
    sample: list[str] = []  # the smallest unreferenced keys, sorted
    for page in pages(job, progress):
        for info in page:
            total_files += 1
            total_bytes += info.size
            scope = _SCOPE_OF_KIND[parse(info.key).kind]
            by_scope[scope] = by_scope.get(scope, 0) + info.size
            if info.key in holders_of:
                sizes[info.key] = info.size
                owned_bytes += info.size
                continue
            home = next((m for d, m in dirs if info.key.startswith(d)), None)
            if home is not None:  # a holder's own directory: its _metadata, savepoint copies
                exclusive[home] += info.size
                owned_bytes += info.size
                continue
            if judge(info, view) in (Verdict.REFERENCED, Verdict.KEPT):
                continue
            unreferenced_files += 1
            unreferenced_bytes += info.size
            _keep_smallest(sample, info.key, _SAMPLE)
    missing = 0
    for key, owners in holders_of.items():
        size = sizes.get(key)
        if size is None:
            missing += 1
            continue
        for o in owners:
            referenced_total[o] += size
        if len(owners) == 1:
            exclusive[owners[0]] += size
        else:
            share, rest = divmod(size, len(owners))
            for i, o in enumerate(owners):
                shared[o] += share + (1 if i < rest else 0)
    usage = [
        CheckpointUsage(
            kind=kind_of(k),
            path=k.rsplit("/", 1)[0],
            checkpoint_id=holders.documents[k].checkpoint_id,
            savepoint_name=layout.parse(k).savepoint,
            retained=k in retained,
            referenced_bytes=referenced_total[k],
            exclusive_bytes=exclusive[k],
            shared_attributed_bytes=shared[k],
            attributed_bytes=exclusive[k] + shared[k],
        )
        for k in order
    ]
    return DiskUsage(
        job_uri=job.uri,
        total_files=total_files,
        total_bytes=total_bytes,
        by_scope=by_scope,
        by_checkpoint=usage,
        referenced_bytes=owned_bytes,
        unreferenced_files=unreferenced_files,
        unreferenced_bytes=unreferenced_bytes,
        unreferenced_sample=sample,
        missing_files=missing,
        quarantined=holders.quarantined,
    )


#: How many unreferenced keys `du` names.
_SAMPLE = 100


def _keep_smallest(sample: list[str], key: str, n: int) -> None:
    """Keep `sample` the sorted `n` smallest keys seen."""
    if len(sample) < n or key < sample[-1]:
        bisect.insort(sample, key)
        del sample[n:]


def _sort_id(metadata_key: str) -> tuple[int, str]:
    p = layout.parse(metadata_key)
    return (p.checkpoint_id or 0, p.savepoint or "")

