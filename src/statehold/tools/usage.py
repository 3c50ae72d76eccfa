"""`du`: bytes by scope and by checkpoint, and what the deletion policy calls
unreferenced."""

from __future__ import annotations

from typing import Any

from statehold import layout
from statehold.ha.base import HAStore
from statehold.jobdir import JobDirectory
from statehold.layout import Kind
from statehold.metadata import referenced_keys
from statehold.policy import Verdict, View, judge
from statehold.reconcile import live_attempt
from statehold.tools.locate import TargetLike, kind_of, listing, opened, parse
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
    target: TargetLike, *, ha: str | HAStore | None = None, **storage_options: Any
) -> DiskUsage:
    """Bytes by scope and by checkpoint, and unreferenced bytes.

    Attribution: a file referenced by one retained checkpoint or savepoint (and every file
    in its own directory) counts fully to it (`exclusive_bytes`); a file referenced by k
    of them is split evenly among the k (`shared_attributed_bytes`; the remainder bytes go
    to the oldest holders), so the attributed bytes add up to the referenced total.
    ``chk-N`` directories not retained are not holders: their bytes are unreferenced."""
    with opened(target, ha=ha, **storage_options) as t:
        return _du(t.job)


def _du(job: JobDirectory) -> DiskUsage:
    state = job.state()
    holders = job.holders(state)
    files = listing(job)
    sizes = {i.key: i.size for i in files}
    retained = {p.metadata for p in state.retained}
    view = View.of(state.epoch, holders, live_attempt(job, state), files)
    by_scope: dict[str, int] = {}
    for info in files:
        kind = parse(info.key).kind
        scope = _SCOPE_OF_KIND[kind]
        by_scope[scope] = by_scope.get(scope, 0) + info.size
    order = sorted(holders.documents, key=lambda k: (kind_of(k) == "savepoint", _sort_id(k)))
    exclusive = dict.fromkeys(order, 0)
    shared = dict.fromkeys(order, 0)
    referenced_total = dict.fromkeys(order, 0)
    owned: set[str] = set()
    missing = 0
    holders_of: dict[str, list[str]] = {}
    for mkey in order:  # in `order`, so each file's holders are oldest first
        for key in referenced_keys(holders.documents[mkey], mkey):
            holders_of.setdefault(key, []).append(mkey)
    for key, owners in holders_of.items():
        size = sizes.get(key)
        if size is None:
            missing += 1
            continue
        owned.add(key)
        for o in owners:
            referenced_total[o] += size
        if len(owners) == 1:
            exclusive[owners[0]] += size
        else:
            share, rest = divmod(size, len(owners))
            for i, o in enumerate(owners):
                shared[o] += share + (1 if i < rest else 0)
    for mkey in order:  # each holder's own directory (its _metadata, savepoint copies)
        prefix = mkey.rsplit("/", 1)[0] + "/"
        for info in files:
            if info.key.startswith(prefix) and info.key not in owned:
                owned.add(info.key)
                exclusive[mkey] += info.size
    unreferenced = sorted(
        i.key
        for i in files
        if i.key not in owned and judge(i, view) not in (Verdict.REFERENCED, Verdict.KEPT)
    )
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
        total_files=len(files),
        total_bytes=sum(sizes.values()),
        by_scope=by_scope,
        by_checkpoint=usage,
        referenced_bytes=sum(sizes[k] for k in owned),
        unreferenced_files=len(unreferenced),
        unreferenced_bytes=sum(sizes[k] for k in unreferenced),
        unreferenced_sample=unreferenced[:100],
        missing_files=missing,
        quarantined=holders.quarantined,
    )


def _sort_id(metadata_key: str) -> tuple[int, str]:
    p = layout.parse(metadata_key)
    return (p.checkpoint_id or 0, p.savepoint or "")

