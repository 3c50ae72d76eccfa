"""Read-only reports on a job directory: list, inspect, verify, diff."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from statehold.cleanup.holders import read_holders
from statehold.errors import StateholdError
from statehold.format import layout
from statehold.format.layout import Kind
from statehold.format.metadata import CheckpointMetadata, MetadataError, StateFile
from statehold.ha.base import HAStore
from statehold.job.directory import JobDirectory
from statehold.job.locate import Target, TargetLike, kind_of, opened, read
from statehold.storage import StorageError
from statehold.tools.listing import (
    NoProgress,
    Progress,
    listing,
    one_line,
    pages,
    parse,
    savepoint_keys,
)
from statehold.tools.results import (
    CheckpointSummary,
    DiffEntry,
    DiffReport,
    FileRef,
    Inspection,
    JobListing,
    Problem,
    VerifyReport,
)


def file_refs(meta: CheckpointMetadata, metadata_key: str) -> list[FileRef]:
    refs = []
    for op, kg, f in meta.state_files():
        path = f.path if f.external else layout.resolve(metadata_key, f.path)
        refs.append(
            FileRef(
                path=path,
                scope=f.scope,
                size=f.size,
                checksum=f.checksum,
                operator=op,
                key_groups=(kg.key_groups.start, kg.key_groups.end),
                external=f.external,
                name=f.name,
            )
        )
    return refs


# -- list ------------------------------------------------------------------------------
def list_checkpoints(
    target: TargetLike,
    *,
    ha: str | HAStore | None = None,
    progress: Progress | None = None,
    **storage_options: Any,
) -> JobListing:
    """Retained checkpoints (HA store), ``chk-N`` directories not retained, savepoints.
    Unreadable metadata is reported per entry and in `problems`, not raised."""
    with opened(target, ha=ha, **storage_options) as t:
        return _list(t.job, progress or NoProgress())


def _list(job: JobDirectory, progress: Progress) -> JobListing:
    files = listing(job, progress)
    state = job.state()
    dir_bytes: dict[str, int] = {}
    chk_ids: set[int] = set()
    for info in files:
        p = parse(info.key)
        if p.kind in (Kind.CHECKPOINT_METADATA, Kind.CHECKPOINT_OTHER):
            assert p.checkpoint_id is not None
            chk_ids.add(p.checkpoint_id)
            d = layout.checkpoint_dir(p.checkpoint_id)
            dir_bytes[d] = dir_bytes.get(d, 0) + info.size
        elif p.kind in (Kind.SAVEPOINT_METADATA, Kind.SAVEPOINT_OTHER):
            assert p.savepoint is not None
            d = f"{layout.SAVEPOINTS_DIR}/{p.savepoint}"
            dir_bytes[d] = dir_bytes.get(d, 0) + info.size
    retained = {p.metadata: p for p in state.retained}
    problems: list[Problem] = []
    saved = savepoint_keys(files)
    documents = {*retained, *map(layout.checkpoint_metadata_key, chk_ids), *saved}
    progress.start(f"reading {job.uri}", len(documents), "checkpoints")

    def summary(key: str, retained_flag: bool) -> CheckpointSummary:
        d = key.rsplit("/", 1)[0]
        kind = kind_of(key)
        p = layout.parse(key)
        base: dict[str, Any] = {
            "kind": kind,
            "path": d,
            "checkpoint_id": p.checkpoint_id,
            "savepoint_name": p.savepoint,
            "retained": retained_flag,
            "directory_bytes": dir_bytes.get(d, 0),
        }
        try:
            meta = read(Target(job, kind, key))
        except StateholdError as e:
            problems.append(Problem(path=key, problem=one_line(e)))
            return CheckpointSummary(**base, error=one_line(e))
        finally:
            progress.advance(1)
        return CheckpointSummary(
            **{**base, "checkpoint_id": meta.checkpoint_id},
            epoch=meta.epoch,
            created_at=meta.created_at,
            completed_at=meta.completed_at,
            file_count=len({f.path for f in file_refs(meta, key)}),
            referenced_bytes=_unique_bytes(file_refs(meta, key)),
        )

    checkpoints = [summary(k, True) for k in retained]
    for n in sorted(chk_ids):
        key = layout.checkpoint_metadata_key(n)
        if key not in retained:
            checkpoints.append(summary(key, False))
    checkpoints.sort(key=lambda c: (c.checkpoint_id or 0, not c.retained))
    savepoints = [summary(k, False) for k in saved]
    return JobListing(
        job_uri=job.uri,
        ha_epoch=state.epoch,
        checkpoints=checkpoints,
        savepoints=savepoints,
        problems=problems,
    )


def _unique_bytes(refs: Iterable[FileRef]) -> int:
    return sum({r.path: r.size for r in refs}.values())


# -- inspect ---------------------------------------------------------------------------
def inspect(
    target: TargetLike, *, ha: str | HAStore | None = None, **storage_options: Any
) -> Inspection:
    """Header fields and every referenced file of one checkpoint or savepoint."""
    with opened(target, ha=ha, checkpoint=True, **storage_options) as t:
        return _inspect(t)


def _inspect(t: Target) -> Inspection:
    meta = read(t)
    assert t.metadata_key is not None
    refs = file_refs(meta, t.metadata_key)
    by_scope: dict[str, int] = {}
    for path, r in {r.path: r for r in refs}.items():
        del path
        by_scope[r.scope.value] = by_scope.get(r.scope.value, 0) + r.size
    retained = t.metadata_key in t.job.retained_keys()
    return Inspection(
        job_uri=t.job.uri,
        kind=kind_of(t.metadata_key),
        metadata_path=t.metadata_key,
        format_version=meta.version,
        job_id=meta.job_id,
        checkpoint_id=meta.checkpoint_id,
        savepoint_name=meta.savepoint_name,
        epoch=meta.epoch,
        created_at=meta.created_at,
        completed_at=meta.completed_at,
        max_parallelism=meta.max_parallelism,
        key_hash=meta.key_hash.value,
        source_position=meta.source_position,
        lineage=meta.lineage.model_dump(mode="json") if meta.lineage else None,
        retained=retained,
        metadata_checksum=meta.checksum,
        operators=[op.operator for op in meta.operators],
        file_count=len({r.path for r in refs}),
        total_bytes=_unique_bytes(refs),
        bytes_by_scope=by_scope,
        files=refs,
    )


# -- verify ----------------------------------------------------------------------------
def verify(
    target: TargetLike,
    *,
    checksums: bool = True,
    progress: Progress | None = None,
    ha: str | HAStore | None = None,
    **storage_options: Any,
) -> VerifyReport:
    """Every referenced file inside the job directory, present, of the right size and
    (with `checksums`) content; also every symlink in the job directory (never followed)
    and every quarantined document. Problems are reported, never raised; a location that
    is not a job directory or names no checkpoint raises a StateholdError."""
    with opened(target, ha=ha, checkpoint=True, **storage_options) as t:
        return _verify(t, checksums, progress or NoProgress())


def _verify(t: Target, checksums: bool, progress: Progress) -> VerifyReport:
    assert t.metadata_key is not None
    problems: list[Problem] = []

    def report(checked: int = 0, nbytes: int = 0) -> VerifyReport:
        return VerifyReport(
            job_uri=t.job.uri,
            metadata_path=t.metadata_key or "",
            ok=not problems,
            checksums=checksums,
            files_checked=checked,
            bytes_checked=nbytes,
            problems=problems,
        )

    state = t.job.state()
    for page in pages(t.job):  # streamed: memory does not grow with the file count
        for listed in page:
            if listed.symlink:
                problems.append(Problem(path=listed.key, problem="a symlink (never followed)"))
    for key, why in read_holders(t.job, state).quarantined.items():
        if key != t.metadata_key:
            problems.append(Problem(path=key, problem=f"quarantined: {why}"))
    try:
        meta = read(t)
    except MetadataError as e:
        problems.append(Problem(path=t.metadata_key, problem=one_line(e)))
        return report()
    for ptr in state.retained:
        if ptr.metadata == t.metadata_key and ptr.checksum and ptr.checksum != meta.checksum:
            problems.append(
                Problem(path=t.metadata_key, problem="does not match the HA store's pointer")
            )
    expected: dict[str, StateFile] = {}
    for _op, _kg, f in meta.state_files():
        if f.external:
            problems.append(Problem(path=f.path, problem="outside the job directory (external)"))
            continue
        key = layout.resolve(t.metadata_key, f.path)
        seen = expected.setdefault(key, f)
        if (seen.size, seen.checksum) != (f.size, f.checksum):
            problems.append(Problem(path=key, problem="referenced twice with different contents"))
    progress.start(f"verify {t.path}", sum(f.size for f in expected.values()))
    checked = nbytes = 0
    for key, f in sorted(expected.items()):
        try:
            info = t.storage.stat(key)
            if info is None:
                problems.append(Problem(path=key, problem="missing"))
            elif info.size != f.size:
                problems.append(
                    Problem(path=key, problem=f"size {info.size}, metadata says {f.size}")
                )
            elif checksums and t.storage.checksum(key, info.size) != f.checksum:
                problems.append(Problem(path=key, problem="checksum mismatch"))
            else:
                checked += 1
                nbytes += f.size
        except (StorageError, OSError) as e:
            problems.append(Problem(path=key, problem=f"unreadable: {one_line(e)}"))
        progress.advance(f.size)
    return report(checked, nbytes)


# -- diff ------------------------------------------------------------------------------
def diff(
    a: TargetLike, b: TargetLike, *, ha: str | HAStore | None = None, **storage_options: Any
) -> DiffReport:
    """Files (by path relative to their job directory) in `b` and not `a` (added) and in
    `a` and not `b` (removed)."""
    with opened(a, ha=ha, checkpoint=True, **storage_options) as ta, opened(
        b, ha=ha, checkpoint=True, **storage_options
    ) as tb:
        assert ta.metadata_key is not None and tb.metadata_key is not None
        fa = {r.path: r for r in file_refs(read(ta), ta.metadata_key)}
        fb = {r.path: r for r in file_refs(read(tb), tb.metadata_key)}

    def entries(keys: Iterable[str], files: Mapping[str, FileRef]) -> list[DiffEntry]:
        return [
            DiffEntry(path=k, scope=files[k].scope, size=files[k].size) for k in sorted(keys)
        ]

    added = entries(fb.keys() - fa.keys(), fb)
    removed = entries(fa.keys() - fb.keys(), fa)
    common = fa.keys() & fb.keys()
    changed = [k for k in common if (fa[k].size, fa[k].checksum) != (fb[k].size, fb[k].checksum)]
    same = common - set(changed)
    return DiffReport(
        a=ta.uri,
        b=tb.uri,
        added=added,
        removed=removed,
        changed=entries(changed, fb),
        unchanged_files=len(same),
        unchanged_bytes=sum(fb[k].size for k in same),
        added_bytes=sum(e.size for e in added),
        removed_bytes=sum(e.size for e in removed),
    )

