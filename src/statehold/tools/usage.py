"""`du`: bytes by scope and by checkpoint, and what the deletion policy calls
unreferenced."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from statehold.cleanup.holders import read_holders
from statehold.cleanup.policy import Verdict, View, judge, judge_names
from statehold.cleanup.reconcile import live_attempt
from statehold.format import layout
from statehold.format.layout import Kind
from statehold.format.metadata import referenced_keys
from statehold.ha.base import HAStore
from statehold.job.directory import JobDirectory
from statehold.job.locate import TargetLike, kind_of, opened
from statehold.storage.base import FileInfo, NamePage
from statehold.tools.listing import Progress, parse, stat_pages
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
    holders = read_holders(job, state)
    retained = {p.metadata for p in state.retained}
    view = View.of(
        state.epoch, holders, live_attempt(job, state), job.storage.list(layout.SAVEPOINTS_DIR)
    )
    order = sorted(holders.documents, key=lambda k: (kind_of(k) == "savepoint", _sort_id(k)))
    tally = _Tally(view, order)
    for mkey in order:  # in `order`, so each file's holders are oldest first
        for key in referenced_keys(holders.documents[mkey], mkey):
            tally.holders_of.setdefault(key, []).append(mkey)
    for page in stat_pages(job, progress):
        undecided = tally.add_names(page) if page.names else []
        for info in (*page.infos, *undecided):
            tally.add(info)
    exclusive, shared = tally.exclusive, tally.shared
    referenced_total = dict.fromkeys(order, 0)
    missing = 0
    for key, owners in tally.holders_of.items():
        size = tally.sizes.get(key)
        if size is None:
            missing += 1
            continue
        for o in owners:
            referenced_total[o] += size
        if len(owners) == 1:
            exclusive[owners[0]] += size
        else:
            part, rest = divmod(size, len(owners))
            for i, o in enumerate(owners):
                shared[o] += part + (1 if i < rest else 0)
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
        total_files=tally.total_files,
        total_bytes=tally.total_bytes,
        by_scope=tally.by_scope,
        by_checkpoint=usage,
        referenced_bytes=tally.owned_bytes,
        unreferenced_files=tally.unreferenced_files,
        unreferenced_bytes=tally.unreferenced_bytes,
        unreferenced_sample=tally.sample,
        missing_files=missing,
        quarantined=holders.quarantined,
    )


@dataclass
class _Tally:
    """What `du` counts while the listing streams by."""

    view: View
    order: list[str]
    #: Each referenced file's holders, oldest first.
    holders_of: dict[str, list[str]] = field(default_factory=dict)
    #: Sizes of the referenced files listed.
    sizes: dict[str, int] = field(default_factory=dict)
    by_scope: dict[str, int] = field(default_factory=dict)
    exclusive: dict[str, int] = field(default_factory=dict)
    shared: dict[str, int] = field(default_factory=dict)
    total_files: int = 0
    total_bytes: int = 0
    owned_bytes: int = 0
    unreferenced_files: int = 0
    unreferenced_bytes: int = 0
    #: The smallest unreferenced keys, sorted.
    sample: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.exclusive = dict.fromkeys(self.order, 0)
        self.shared = dict.fromkeys(self.order, 0)
        self.dirs = [(mkey.rsplit("/", 1)[0] + "/", mkey) for mkey in self.order]

    def add(self, info: FileInfo) -> None:
        """One file with its stat, judged on its own."""
        self.total_files += 1
        self.total_bytes += info.size
        scope = _SCOPE_OF_KIND[parse(info.key).kind]
        self.by_scope[scope] = self.by_scope.get(scope, 0) + info.size
        if info.key in self.holders_of:
            self.sizes[info.key] = info.size
            self.owned_bytes += info.size
            return
        home = next((m for d, m in self.dirs if info.key.startswith(d)), None)
        if home is not None:  # a holder's own directory: its _metadata, savepoint copies
            self.exclusive[home] += info.size
            self.owned_bytes += info.size
            return
        if judge(info, self.view) in (Verdict.REFERENCED, Verdict.KEPT):
            return
        self.unreferenced_files += 1
        self.unreferenced_bytes += info.size
        _keep_smallest(self.sample, info.key, _SAMPLE)

    def add_names(self, page: NamePage) -> list[FileInfo]:
        """One directory's plain files by name and size: the data files the policy
        decides by name in bulk (`policy.judge_names`, the same decisions as `judge`)
        are counted here; the others are returned with their stat, for `add`. A data
        directory is never a holder's own, so a file there is owned only if named."""
        directory, names = page.directory, page.names
        out = judge_names(directory, names, self.view)
        base = f"{directory}/" if directory else ""
        if len(out[None]) == len(names):
            return [
                FileInfo(base + n, size, mtime)
                for n, size, mtime in zip(names, page.sizes, page.mtimes, strict=True)
            ]
        size_of = dict(zip(names, page.sizes, strict=True))
        undecided: list[FileInfo] = []
        if out[None]:
            mtime_of = dict(zip(names, page.mtimes, strict=True))
            undecided = [FileInfo(base + n, size_of[n], mtime_of[n]) for n in out[None]]
        decided = len(names) - len(undecided)
        decided_bytes = sum(page.sizes) - sum(i.size for i in undecided)
        self.total_files += decided
        self.total_bytes += decided_bytes
        scope = _SCOPE_OF_KIND[Kind(directory)]  # only shared/ and exclusive/ decide
        self.by_scope[scope] = self.by_scope.get(scope, 0) + decided_bytes
        holders_of, sizes = self.holders_of, self.sizes
        for name in out[Verdict.REFERENCED]:
            key = base + name
            if key in holders_of:  # else named by a quarantined document only
                sizes[key] = size_of[name]
                self.owned_bytes += size_of[name]
        unreferenced = out[Verdict.PROTECTED] + out[Verdict.DELETABLE]
        self.unreferenced_files += len(unreferenced)
        self.unreferenced_bytes += sum(size_of[n] for n in unreferenced)
        for name in sorted(unreferenced)[:_SAMPLE]:  # one directory: names sort as keys
            _keep_smallest(self.sample, base + name, _SAMPLE)
        return undecided


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

