"""Operations that write: export (a self-contained copy of one checkpoint) and dispose
(delete a checkpoint, a savepoint or a whole job directory).

Both are outside writers: dispose deletes only what the deletion policy
(`statehold.cleanup.policy`) calls deletable, re-checks before each delete that the job is as
it planned under (`gc.outside_guard`), never touches a retained checkpoint while
an attempt runs, and claims an epoch before it changes the HA store, so no zombie
driver can re-publish what it removed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from statehold.cleanup.cleaner import SyncCleaner
from statehold.cleanup.discard import Discard
from statehold.cleanup.gc import outside_guard
from statehold.cleanup.holders import Holders, read_holders
from statehold.cleanup.policy import LiveAttempt, Verdict, View, judge
from statehold.cleanup.reconcile import live_attempt
from statehold.format import layout
from statehold.format.layout import Kind, Scope
from statehold.format.metadata import (
    CheckpointMetadata,
    MetadataError,
    StateFile,
    check_stored,
    decode,
    encode,
    newer_version,
    referenced_keys,
    relocate,
)
from statehold.ha.base import CheckpointPointer, HAState, HAStore
from statehold.ha.embedded import EmbeddedHAStore
from statehold.ha.open import EMBEDDED
from statehold.job.directory import JobDirectory, open_job
from statehold.job.locate import Target, TargetLike, ToolError, opened, read
from statehold.job.owner import OWNER_KEY, write_owner
from statehold.storage import Storage, StorageError, open_storage
from statehold.storage.base import FileInfo
from statehold.storage.destination import destination_problem
from statehold.tools.listing import NoProgress, Progress, listing, one_line, savepoint_keys
from statehold.tools.reports import _verify
from statehold.tools.results import DisposeReport, ExportReport, Problem


# -- export ----------------------------------------------------------------------------
def _export_key(key: str, scope: Scope) -> str:
    """Where a referenced file goes in the exported job directory: the same key for files
    in shared/, exclusive/, taskowned/; files kept in a checkpoint's or savepoint's own
    directory (savepoint copies) move to the directory of their scope."""
    if layout.parse(key).kind in (Kind.SHARED, Kind.EXCLUSIVE, Kind.TASKOWNED):
        return key
    directory = {
        Scope.SHARED: layout.SHARED_DIR,
        Scope.EXCLUSIVE: layout.EXCLUSIVE_DIR,
        Scope.TASKOWNED: layout.TASKOWNED_DIR,
    }[scope]
    return f"{directory}/{key.rsplit('/', 1)[-1]}"


def export(
    source: TargetLike,
    dest: str | Storage,
    *,
    progress: Progress | None = None,
    verify_after: bool = True,
    ha: str | HAStore | None = None,
    dest_options: Mapping[str, Any] | None = None,
    **storage_options: Any,
) -> ExportReport:
    """Write a minimal self-contained job directory at `dest` (which must be empty) with
    only what `source` needs: its files (copied with `Storage.copy`: hard link or
    server-side where possible, streamed across backends), checked for size and checksum,
    then its ``_metadata`` as ``chk-N/_metadata`` with paths relative to the new place,
    and an embedded HA store seeded with the checkpoint's epoch, so the next attempt's
    epoch is above every file's. The source is only read."""
    with opened(source, ha=ha, checkpoint=True, **storage_options) as t:
        if isinstance(dest, Storage):
            return _export(t, dest, progress or NoProgress(), verify_after)
        try:
            out = open_storage(dest, **dict(dest_options or {}))
        except (StorageError, ValueError) as e:
            raise ToolError(f"{dest}: cannot open: {e}") from e
        return _export(t, out, progress or NoProgress(), verify_after)


def _export(t: Target, out: Storage, progress: Progress, verify_after: bool) -> ExportReport:
    """Check, copy, then publish: nothing is written to `out` before every referenced file
    is present and whole, and nothing is published before every copy is."""
    assert t.metadata_key is not None
    meta = read(t)
    files = referenced_keys(meta, t.metadata_key)
    _check_exportable(t, meta, files, progress)
    _check_destination(t, out)
    new_metadata_key = layout.checkpoint_metadata_key(meta.checkpoint_id)
    mapping = {key: _export_key(key, f.scope) for key, f in files.items()}
    if len(set(mapping.values())) != len(mapping):
        raise ToolError(f"cannot export {t.uri}: two referenced files would share a name")
    new_meta = relocate(meta, t.metadata_key, new_metadata_key, mapping).model_copy(
        update={"kind": "checkpoint", "savepoint_name": None}
    )
    data = encode(new_meta, new_metadata_key)
    new_meta = decode(data, new_metadata_key)
    copied = _copy_files(t, out, files, mapping, progress)
    out.create_if_absent(new_metadata_key, data)
    write_owner(out, new_meta.job_id, EMBEDDED)
    pointer = CheckpointPointer(
        new_meta.checkpoint_id, new_metadata_key, new_meta.epoch, new_meta.checksum
    )
    state = EmbeddedHAStore(out).seed(max(new_meta.epoch, 1), [pointer])
    if verify_after:
        _verify_export(out, new_metadata_key, progress)
    return ExportReport(
        source=t.uri,
        dest=out.uri,
        metadata_path=new_metadata_key,
        checkpoint_id=new_meta.checkpoint_id,
        files_copied=len(files),
        bytes_copied=copied,
        ha_epoch=state.epoch,
        verified=verify_after,
    )


def _check_exportable(
    t: Target, meta: CheckpointMetadata, files: dict[str, StateFile], progress: Progress
) -> None:
    """Refuse a checkpoint with external files, or a referenced file missing or of
    another size than its metadata says."""
    problems = [
        Problem(path=f.path, problem="outside the job directory (external); not exportable")
        for _op, _kg, f in meta.state_files()
        if f.external
    ]
    progress.start(f"checking {t.path}", len(files), "files")
    for key, f in sorted(files.items()):
        progress.advance(1)
        info = t.storage.stat(key)
        if info is None:
            problems.append(Problem(path=key, problem="missing"))
        elif info.size != f.size:
            problems.append(Problem(path=key, problem=f"size {info.size}, metadata says {f.size}"))
    _refuse(f"cannot export {t.uri}", problems)


def _check_destination(t: Target, out: Storage) -> None:
    problem = destination_problem(t.job.uri, out)
    if problem:
        raise ToolError(f"{out.uri}: {problem}")


def _copy_files(
    t: Target,
    out: Storage,
    files: dict[str, StateFile],
    mapping: dict[str, str],
    progress: Progress,
) -> int:
    """Copy every referenced file to its new key in `out`, then check every copy is what
    the metadata says; the bytes copied."""
    progress.start(f"export {t.path}", sum(f.size for f in files.values()))
    copied = 0
    for key, f in sorted(files.items()):
        try:
            t.storage.copy(key, mapping[key], target=out)
        except StorageError as e:
            raise ToolError(f"copying {key} to {out.uri} failed: {one_line(e)}") from e
        copied += f.size
        progress.advance(f.size)
    _refuse(
        f"exported copy in {out.uri} is damaged",
        [
            Problem(path=k, problem=why)
            for k, why in check_stored(out, {mapping[k]: f for k, f in files.items()})
        ],
    )
    return copied


def _verify_export(out: Storage, metadata_key: str, progress: Progress) -> None:
    with open_job(out) as exported:
        check = _verify(Target(exported, "checkpoint", metadata_key), True, progress)
    if not check.ok:
        p = check.problems[0]
        raise ToolError(
            f"exported {out.uri} does not verify: {p.path}: {p.problem}", check.problems
        )


def _refuse(what: str, problems: list[Problem]) -> None:
    if problems:
        raise ToolError(
            f"{what}: {len(problems)} problem(s), first: {problems[0].path}: "
            f"{problems[0].problem}",
            problems,
        )


# -- dispose ---------------------------------------------------------------------------
def dispose(
    target: TargetLike,
    *,
    force: bool = False,
    dry_run: bool = False,
    ha: str | HAStore | None = None,
    progress: Progress | None = None,
    **storage_options: Any,
) -> DisposeReport:
    """Delete a checkpoint, a savepoint or a whole job directory.

    Deletes only what the deletion policy allows once the target no longer holds
    anything: files another retained checkpoint or savepoint references are kept, and
    so is anything the running attempt may have in flight. Refused (nothing deleted):
    a retained checkpoint or a whole job while an attempt runs; without `force`, a
    retained checkpoint, a job directory with retained checkpoints or savepoints, and a
    damaged document (with `force` its directory is removed; files it may name that
    nothing else references are left to gc)."""
    with opened(target, ha=ha, **storage_options) as t:
        progress = progress or NoProgress()
        if t.metadata_key is None:
            return _dispose_job(t.job, force=force, dry_run=dry_run, progress=progress)
        return _dispose_one(t, force=force, dry_run=dry_run, progress=progress)


#: `dispose` deletes in batches of this many files (the guard re-checks before each).
_DELETE_BATCH = 1000


def _dispose_one(t: Target, *, force: bool, dry_run: bool, progress: Progress) -> DisposeReport:
    """Dispose of one checkpoint or savepoint: check it may go, plan by the policy, then
    (unless `dry_run`) unpublish it if retained and delete what the plan says."""
    claim = _claim_target(t, force=force, dry_run=dry_run)
    files = listing(t.job, progress)
    report = _plan_dispose(t, claim, files, force=force, dry_run=dry_run)
    if dry_run:
        return report
    state = claim.state
    if claim.retained:
        remaining = [p for p in state.retained if p.metadata != t.metadata_key]
        state = t.job.ha.publish(state.epoch, remaining)
    cleaner = SyncCleaner(t.job.storage, guard=outside_guard(t.job, state, claim.live))
    _delete_disposed(t, report.deleted, cleaner, progress)
    return report


class _Claim(NamedTuple):
    """What a dispose plans under: the HA state, the running attempt, and whether the
    target is a retained checkpoint."""

    state: HAState
    live: LiveAttempt | None
    retained: bool


def _claim_target(t: Target, *, force: bool, dry_run: bool) -> _Claim:
    """What to plan under; refused (ToolError) if the target may not be disposed. For a
    retained target, forced, a new epoch is claimed first (unless `dry_run`)."""
    job, key = t.job, t.metadata_key
    state = job.state()
    live = live_attempt(job, state)
    retained = key in {p.metadata for p in state.retained}
    if not retained:
        return _Claim(state, live, False)
    if live is not None:
        raise ToolError(
            f"{t.uri} is retained by the running attempt (epoch {live.epoch}); retention "
            "subsumes it, or dispose it once the job has stopped"
        )
    if not force:
        raise ToolError(
            f"{t.uri} is a retained checkpoint (the job may restore from it); "
            "use --force to dispose it anyway"
        )
    if not dry_run:
        # A new epoch before the plan: from here no attempt can publish (one that had
        # claimed its epoch but written no lease yet looked stopped, and completed a
        # checkpoint sharing the target's files while an earlier plan ran; simulation,
        # seed 1010), so the retained checkpoints the plan reads stay as they are.
        state = job.ha.claim_epoch()
        if key not in {p.metadata for p in state.retained}:
            raise ToolError(f"{t.uri} is no longer retained; run dispose again")
    return _Claim(state, live, True)


def _plan_dispose(
    t: Target, claim: _Claim, files: list[FileInfo], *, force: bool, dry_run: bool
) -> DisposeReport:
    """What disposing of the target deletes and keeps: each of its files judged by the
    policy with the target no longer a holder."""
    job, key, directory = t.job, t.metadata_key, t.path
    state, live, retained = claim
    assert key is not None
    if all(i.key != key for i in files):
        # A listing may lag a write: the document is looked up by its key, so that it
        # goes first and never stays behind naming files deleted under it.
        document = job.storage.stat(key)
        files = files if document is None else [*files, document]
    own_dir = [i for i in files if i.key.startswith(directory + "/")]
    if not own_dir and not retained:
        raise ToolError(f"{t.uri}: no such {t.kind}")
    names = _named_by_target(t, force=force)
    holders = read_holders(job, state, skip=key)
    _refuse_newer(job.uri, holders)
    view = View.of(state.epoch, holders, live, files)
    by_key = {i.key: i for i in files}
    deleted: list[str] = []
    kept: list[str] = []
    for k in sorted(names | {i.key for i in own_dir}):
        if k in by_key:
            verdict = judge(by_key[k], view, disposing=directory)
            (deleted if verdict is Verdict.DELETABLE else kept).append(k)
    if key in kept and not retained:
        raise ToolError(f"{t.uri} is in flight in the running attempt; not disposed")
    return DisposeReport(
        job_uri=job.uri,
        kind=t.kind,
        path=directory,
        forced=force,
        dry_run=dry_run,
        deleted=deleted,
        deleted_bytes=sum(by_key[k].size for k in deleted),
        kept=sorted(k for k in kept if k in names),
        unpublished=retained,
    )


def _named_by_target(t: Target, *, force: bool) -> set[str]:
    """The files the target's `_metadata` names; with `force`, none for a damaged one
    (what it may name is left to gc, which spares it no longer)."""
    assert t.metadata_key is not None
    try:
        return set(referenced_keys(read(t), t.metadata_key))
    except MetadataError as e:
        if not force or _is_newer(t):
            raise ToolError(f"cannot dispose: {one_line(e)} (--force removes it)") from e
        return set()


def _is_newer(t: Target) -> bool:
    assert t.metadata_key is not None
    try:
        data = t.job.storage.read(t.metadata_key)
    except StorageError:
        return False
    return newer_version(data) is not None


def _refuse_newer(job_uri: str, holders: Holders) -> None:
    """Refused, even forced: a document of a newer format version names files this
    statehold cannot know."""
    for key, version in sorted(holders.newer.items()):
        raise ToolError(
            f"cannot dispose: {job_uri.rstrip('/')}/{key} has format version {version}, "
            "newer than this statehold reads; upgrade statehold"
        )


def _delete_disposed(
    t: Target, deleted: list[str], cleaner: SyncCleaner, progress: Progress
) -> None:
    """Delete the plan's files through the cleaner, the `_metadata` first: from then on
    nothing can mistake the rest for a checkpoint."""
    try:
        first = tuple(k for k in deleted if k == t.metadata_key)
        cleaner.discard(Discard(first, reason="dispose"))
        rest = [k for k in deleted if k != t.metadata_key]
        progress.start(f"deleting {t.uri}", len(rest), "files")
        for i in range(0, len(rest), _DELETE_BATCH):
            cleaner.discard(Discard(tuple(rest[i:i + _DELETE_BATCH]), reason="dispose"))
            progress.advance(len(rest[i:i + _DELETE_BATCH]))
    except StorageError as e:
        raise ToolError(f"deleting from {t.job.uri} failed: {one_line(e)}") from e


def _kept_by_dispose(key: str) -> bool:
    """What disposing of a whole job leaves: the embedded HA store (its epoch, nothing
    retained) and the owner record naming it."""
    return key == OWNER_KEY or layout.parse(key).kind is Kind.HA


def _dispose_job(
    job: JobDirectory, *, force: bool, dry_run: bool, progress: Progress
) -> DisposeReport:
    state = job.state()
    files = listing(job, progress)
    savepoints = savepoint_keys(files)
    live = live_attempt(job, state)
    if live is not None:
        raise ToolError(f"{job.uri}: an attempt (epoch {live.epoch}) is running; stop it first")
    _refuse_newer(job.uri, read_holders(job, state))
    if (state.retained or savepoints) and not force:
        raise ToolError(
            f"{job.uri} has {len(state.retained)} retained checkpoint(s) and "
            f"{len(savepoints)} savepoint(s); use --force to dispose the whole job directory"
        )
    report = DisposeReport(
        job_uri=job.uri,
        kind="job",
        path="",
        forced=force,
        dry_run=dry_run,
        deleted=sorted(i.key for i in files if not _kept_by_dispose(i.key)),
        deleted_bytes=sum(i.size for i in files if not _kept_by_dispose(i.key)),
        kept=sorted(i.key for i in files if _kept_by_dispose(i.key)),
    )
    if dry_run:
        return report
    try:
        # A new epoch with nothing retained first: a zombie driver is fenced, and no
        # attempt restores from a half-deleted checkpoint (this also clears ZooKeeper).
        claimed = job.ha.claim_epoch()
        job.ha.publish(claimed.epoch, [])
        outside_guard(job, job.state(), None)()
        # All but the embedded HA store and its owner record: the job's epochs must never
        # start again from 1. A driver that claimed its epoch just before this one and
        # runs on would write files and a chk-N/_metadata named by an epoch above every
        # new attempt's, which no reconcile may delete and no new attempt may replace
        # (found by the simulation, seeds 10117, 20070, 30027).
        doomed = [i.key for i in job.storage.list() if not _kept_by_dispose(i.key)]
        # The documents first: a delete that fails part way must never leave a savepoint
        # or checkpoint whose files are gone (simulation, seed 10084).
        job.storage.delete_many([k for k in doomed if k.endswith(f"/{layout.METADATA_NAME}")])
        job.storage.delete_many([k for k in doomed if not k.endswith(f"/{layout.METADATA_NAME}")])
    except StorageError as e:
        raise ToolError(f"deleting {job.uri} failed: {one_line(e)}") from e
    return report


__all__ = ["dispose", "export"]
